//! Limits on what callers can make the coordinator hold: connections and
//! their deadlines, parked long-polls per key and in all, and the bytes of
//! one answer. Nothing a client sends, with or without a key, grows memory
//! or work past these (docs/operations.md, "Limits and abuse").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;

use crate::auth::KeyId;
use crate::http::serve::{
    ConnectionLimits, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
};

/// Default `RUNLEASE_MAX_PARKED_CLAIMS`.
pub const DEFAULT_MAX_PARKED_CLAIMS: usize = 10_000;
/// Default `RUNLEASE_MAX_PARKED_CLAIMS_PER_KEY`.
pub const DEFAULT_MAX_PARKED_CLAIMS_PER_KEY: usize = 2_000;
/// Default `RUNLEASE_MAX_PARKED_READS`.
pub const DEFAULT_MAX_PARKED_READS: usize = 10_000;
/// Default `RUNLEASE_MAX_PARKED_READS_PER_KEY`.
pub const DEFAULT_MAX_PARKED_READS_PER_KEY: usize = 2_000;
/// Most distinct claim shapes (queues and time-left band) one key may have
/// parked at once. Each shape is a claim statement of its own at every
/// wake-up of its queues and every re-check, so a key parking claims of
/// thousands of shapes would multiply the database's work.
pub const MAX_PARKED_SHAPES_PER_KEY: usize = 64;
/// Default `RUNLEASE_MAX_ANSWER_BYTES`: 16 MiB.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// The limit settings (flags and `RUNLEASE_*` variables).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits on clients")]
pub struct LimitSettings {
    /// Most HTTP connections open at once; one more is answered 503
    /// `overloaded` and closed. Keep it below the process's file limit.
    #[arg(long, env = "RUNLEASE_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(16..=1_000_000))]
    pub max_connections: usize,
    /// How long a request head may take from its first byte, ms; the
    /// connection is closed after it.
    #[arg(long, env = "RUNLEASE_HEADER_TIMEOUT_MS", default_value_t = millis(DEFAULT_HEADER_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub header_timeout_ms: u64,
    /// How long a request body may take from its head, ms; later, the
    /// request is answered 400.
    #[arg(long, env = "RUNLEASE_BODY_TIMEOUT_MS", default_value_t = millis(DEFAULT_BODY_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub body_timeout_ms: u64,
    /// How long a connection may stay open with no request in flight, ms.
    #[arg(long, env = "RUNLEASE_IDLE_TIMEOUT_MS", default_value_t = millis(DEFAULT_IDLE_TIMEOUT),
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub idle_timeout_ms: u64,
    /// Most claims parked in a long-poll at once, all keys together; one
    /// more is answered 429 `overloaded` with Retry-After.
    #[arg(long, env = "RUNLEASE_MAX_PARKED_CLAIMS", default_value_t = DEFAULT_MAX_PARKED_CLAIMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_parked_claims: usize,
    /// Most claims one API key may have parked at once.
    #[arg(long, env = "RUNLEASE_MAX_PARKED_CLAIMS_PER_KEY", default_value_t = DEFAULT_MAX_PARKED_CLAIMS_PER_KEY,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_parked_claims_per_key: usize,
    /// Most job reads (`GET /v1/jobs/{id}?wait_ms=`) parked at once, all
    /// keys together; one more is answered 429 `overloaded`.
    #[arg(long, env = "RUNLEASE_MAX_PARKED_READS", default_value_t = DEFAULT_MAX_PARKED_READS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_parked_reads: usize,
    /// Most job reads one API key may have parked at once.
    #[arg(long, env = "RUNLEASE_MAX_PARKED_READS_PER_KEY", default_value_t = DEFAULT_MAX_PARKED_READS_PER_KEY,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_parked_reads_per_key: usize,
    /// Most bytes of jobs in one answer of a listing or a claim: a page
    /// stops early (its `next_cursor` goes on from there), a claim hands
    /// out fewer jobs. At least one job is always answered.
    #[arg(long, env = "RUNLEASE_MAX_ANSWER_BYTES", default_value_t = DEFAULT_MAX_ANSWER_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(65_536..=1_073_741_824))]
    pub max_answer_bytes: usize,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout_ms: millis(DEFAULT_HEADER_TIMEOUT),
            body_timeout_ms: millis(DEFAULT_BODY_TIMEOUT),
            idle_timeout_ms: millis(DEFAULT_IDLE_TIMEOUT),
            max_parked_claims: DEFAULT_MAX_PARKED_CLAIMS,
            max_parked_claims_per_key: DEFAULT_MAX_PARKED_CLAIMS_PER_KEY,
            max_parked_reads: DEFAULT_MAX_PARKED_READS,
            max_parked_reads_per_key: DEFAULT_MAX_PARKED_READS_PER_KEY,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
        }
    }
}

impl LimitSettings {
    /// The accept loop's limits, reading bodies of up to `max_body_bytes`.
    pub fn connections(&self, max_body_bytes: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_body_bytes,
            max_connections: self.max_connections,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
        }
    }

    /// The parked-claim limiter.
    pub fn parked_claims(&self) -> ParkLimit {
        ParkLimit::new(
            "parked claims",
            "RUNLEASE_MAX_PARKED_CLAIMS",
            self.max_parked_claims,
            self.max_parked_claims_per_key,
        )
    }

    /// The parked-read limiter.
    pub fn parked_reads(&self) -> ParkLimit {
        ParkLimit::new(
            "parked job reads",
            "RUNLEASE_MAX_PARKED_READS",
            self.max_parked_reads,
            self.max_parked_reads_per_key,
        )
    }
}

/// Counts parked long-polls per key and in all; a long-poll parks only with
/// a [`Parking`] ticket, which gives its place back when dropped.
#[derive(Debug, Clone)]
pub struct ParkLimit {
    inner: Arc<ParkInner>,
}

#[derive(Debug)]
struct ParkInner {
    what: &'static str,
    setting: &'static str,
    total: usize,
    per_key: usize,
    /// Parked per key, and in all. A key with none parked has no entry, so
    /// the map holds at most one entry per configured key.
    held: Mutex<(HashMap<KeyId, usize>, usize)>,
    /// Parked per key and shape (for claims), each key with at most
    /// [`MAX_PARKED_SHAPES_PER_KEY`] shapes.
    shapes: Mutex<HashMap<KeyId, HashMap<u64, usize>>>,
}

/// Why a long-poll may not park.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParkRefused(pub String);

/// A parked long-poll's place; given back when dropped.
#[derive(Debug)]
pub struct Parking {
    inner: Arc<ParkInner>,
    key: KeyId,
    shape: Option<u64>,
}

impl ParkLimit {
    /// A limiter of `total` in all and `per_key` per key.
    pub fn new(what: &'static str, setting: &'static str, total: usize, per_key: usize) -> Self {
        Self {
            inner: Arc::new(ParkInner {
                what,
                setting,
                total,
                per_key,
                held: Mutex::new((HashMap::new(), 0)),
                shapes: Mutex::default(),
            }),
        }
    }

    /// A place for one more long-poll of `key`, or why not.
    pub fn park(&self, key: KeyId) -> Result<Parking, ParkRefused> {
        let inner = &self.inner;
        let mut held = inner
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (per_key, total) = &mut *held;
        if *total >= inner.total {
            return Err(ParkRefused(format!(
                "too many {} on this coordinator ({}, {}); retry after the Retry-After delay",
                inner.what, inner.total, inner.setting
            )));
        }
        let mine = per_key.entry(key).or_insert(0);
        if *mine >= inner.per_key {
            return Err(ParkRefused(format!(
                "this API key has {} {} already ({}_PER_KEY); retry after the Retry-After delay, or wait less per request",
                inner.per_key, inner.what, inner.setting
            )));
        }
        *mine += 1;
        *total += 1;
        Ok(Parking {
            inner: inner.clone(),
            key,
            shape: None,
        })
    }

    /// A place for one more long-poll of `key` of `shape` (a hash of what
    /// decides which statement serves it), or why not: a key may have at
    /// most [`MAX_PARKED_SHAPES_PER_KEY`] shapes parked at once.
    pub fn park_shaped(&self, key: KeyId, shape: u64) -> Result<Parking, ParkRefused> {
        let mut parking = self.park(key)?;
        let mut shapes = self
            .inner
            .shapes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = shapes.entry(key).or_default();
        if !mine.contains_key(&shape) && mine.len() >= MAX_PARKED_SHAPES_PER_KEY {
            if mine.is_empty() {
                shapes.remove(&key);
            }
            return Err(ParkRefused(format!(
                "this API key has claims of {MAX_PARKED_SHAPES_PER_KEY} different shapes (queues, time left) parked already; park claims of fewer shapes, or retry after the Retry-After delay"
            )));
        }
        *mine.entry(shape).or_insert(0) += 1;
        parking.shape = Some(shape);
        Ok(parking)
    }

    /// Long-polls parked now, in all.
    pub fn parked(&self) -> usize {
        self.inner
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
    }
}

impl Drop for Parking {
    fn drop(&mut self) {
        if let Some(shape) = self.shape {
            let mut shapes = self
                .inner
                .shapes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(mine) = shapes.get_mut(&self.key) {
                if let Some(n) = mine.get_mut(&shape) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        mine.remove(&shape);
                    }
                }
                if mine.is_empty() {
                    shapes.remove(&self.key);
                }
            }
        }
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (per_key, total) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(mine) = per_key.get_mut(&self.key) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                per_key.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parking_is_capped_per_key_and_in_all_and_given_back() {
        let limit = ParkLimit::new("parked claims", "RUNLEASE_MAX_PARKED_CLAIMS", 3, 2);
        let (a, b) = (KeyId(0), KeyId(1));
        let a1 = limit.park(a).unwrap();
        let _a2 = limit.park(a).unwrap();
        let refused = limit.park(a).unwrap_err();
        assert!(
            refused.0.contains("RUNLEASE_MAX_PARKED_CLAIMS_PER_KEY"),
            "{refused}"
        );
        let _b1 = limit.park(b).unwrap();
        let refused = limit.park(b).unwrap_err();
        assert!(refused.0.contains("(3, RUNLEASE_MAX_PARKED_CLAIMS)"), "{refused}");
        assert_eq!(limit.parked(), 3);
        drop(a1);
        assert_eq!(limit.parked(), 2);
        let _a3 = limit.park(a).unwrap();
    }

    #[test]
    fn a_key_may_park_claims_of_a_bounded_number_of_shapes() {
        let limit = ParkLimit::new("parked claims", "RUNLEASE_MAX_PARKED_CLAIMS", 10_000, 10_000);
        let key = KeyId(0);
        let held: Vec<Parking> = (0..MAX_PARKED_SHAPES_PER_KEY as u64)
            .map(|shape| limit.park_shaped(key, shape).unwrap())
            .collect();
        // More of a shape it has: fine; a new shape: refused; another key: fine.
        let again = limit.park_shaped(key, 3).unwrap();
        let refused = limit.park_shaped(key, 9_999).unwrap_err();
        assert!(refused.0.contains("shapes"), "{refused}");
        assert_eq!(
            limit.parked(),
            MAX_PARKED_SHAPES_PER_KEY + 1,
            "a refused place is given back"
        );
        let _other = limit.park_shaped(KeyId(1), 9_999).unwrap();
        drop(again);
        drop(held);
        let _now = limit.park_shaped(key, 9_999).unwrap();
        assert_eq!(limit.inner.shapes.lock().unwrap()[&key].len(), 1);
    }

    #[test]
    fn a_key_with_nothing_parked_leaves_no_entry() {
        let limit = ParkLimit::new("parked reads", "RUNLEASE_MAX_PARKED_READS", 10, 10);
        for n in 0..100 {
            drop(limit.park(KeyId(n)).unwrap());
        }
        let held = limit.inner.held.lock().unwrap();
        assert!(held.0.is_empty());
        assert_eq!(held.1, 0);
    }
}
