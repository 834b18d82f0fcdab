//! What a soak job is: its payload, the behaviour its first lease is given,
//! and the one result its handler derives from it, so the verification can
//! tell a right result from a wrong one without remembering anything.

use serde_json::{Value, json};

/// The queue of the soak's pulled jobs.
pub const QUEUE: &str = "chaos";

/// The queue served by the soak's endpoint: the coordinators push its jobs.
pub const PUSH_QUEUE: &str = "chaos-push";

/// Both queues.
pub const QUEUES: [&str; 2] = [QUEUE, PUSH_QUEUE];

/// The queue of job number `n`: one job in four is pushed to the endpoint.
pub fn queue(n: u64) -> &'static str {
    if n % 4 == 3 { PUSH_QUEUE } else { QUEUE }
}

/// Attempts a soak job may be charged: faults (killed workers, partitions,
/// stalls) charge attempts, and a job must never fail for their sake.
pub const MAX_ATTEMPTS: i32 = 50;

/// What a job's handler does on the job's first lease (later leases complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Completes.
    Plain,
    /// Fails (retryable, short `retry_after_ms`) on its first lease.
    Flaky,
    /// Releases on its first lease.
    Release,
    /// Stops heartbeating on its first lease, sleeps past the TTL, then
    /// tries to complete: the coordinator must refuse it.
    Stall,
}

impl Kind {
    /// Name in the payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Flaky => "flaky",
            Kind::Release => "release",
            Kind::Stall => "stall",
        }
    }

    /// Parses a payload's `kind`; unknown kinds complete.
    pub fn parse(s: &str) -> Self {
        match s {
            "flaky" => Kind::Flaky,
            "release" => Kind::Release,
            "stall" => Kind::Stall,
            _ => Kind::Plain,
        }
    }

    /// The kind of job number `n`; one job in `stall_every` stalls.
    pub fn of(n: u64, stall_every: u64) -> Self {
        if n % stall_every == stall_every / 2 {
            Kind::Stall
        } else if n % 53 == 7 {
            Kind::Flaky
        } else if n % 59 == 11 {
            Kind::Release
        } else {
            Kind::Plain
        }
    }
}

/// The payload of job number `n`.
pub fn payload(n: u64, stall_every: u64) -> Value {
    json!({"n": n, "kind": Kind::of(n, stall_every).as_str()})
}

/// The idempotency key of job number `n`: the producer's retries never
/// enqueue it twice.
pub fn idempotency_key(n: u64) -> String {
    format!("chaos-{n}")
}

/// The digest a correct handler computes for job number `n`.
pub fn digest(n: u64) -> String {
    format!("{:016x}", splitmix64(n ^ 0x5eed_c4a0_5eed_c4a0))
}

/// The result a handler lands for job `n` under `run_lease`: the digest,
/// and the lease it was computed under (so a result written under an older
/// lease is visible in the row itself).
pub fn result(n: u64, run_lease: i64, worker: &str) -> Value {
    json!({"n": n, "digest": digest(n), "run_lease": run_lease, "worker": worker})
}

/// One step of SplitMix64: a fine mixer and a fine small generator.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small seeded generator (SplitMix64): handler times, victims.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.0)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_occurs_and_the_digest_is_a_function_of_n() {
        let kinds: Vec<Kind> = (0..1000).map(|n| Kind::of(n, 500)).collect();
        for k in [Kind::Plain, Kind::Flaky, Kind::Release, Kind::Stall] {
            assert!(kinds.contains(&k), "{k:?} never occurs");
        }
        assert_eq!(kinds.iter().filter(|k| **k == Kind::Stall).count(), 2);
        assert_eq!(digest(42), digest(42));
        assert_ne!(digest(42), digest(43));
    }
}
