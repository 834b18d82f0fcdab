//! A model of the lease protocol, checked exhaustively with `stateright` for
//! small bounds: every interleaving of claims, heartbeats, finishing calls,
//! batch commits, reaper passes, cancels, admin retries, time passing, lost
//! answers and crashes, over a few jobs, workers and two coordinators.
//!
//! Each action is one step the real system takes atomically: one SQL
//! statement (or one finish transaction) from `coordinator/src/store/sql/`,
//! or one message. `docs/model.md` maps every action to its statement and
//! guard, says what is abstracted away, and gives the state counts.
//!
//! - [`state`]: the world (rows, worker views, coordinator memory, answers).
//! - `step`: the transitions, one per action.
//! - `properties`: the properties and the liveness witness.
//! - `symmetry`: [`representative`], for symmetry reduction (jobs, workers
//!   and coordinators are interchangeable).
//!
//! [`Variant`] selects the correct protocol or one deliberately broken piece;
//! each broken variant must produce a counterexample (`tests/tests/model.rs`).

pub mod state;

mod properties;
mod step;
mod symmetry;

use stateright::{Model, Property};

pub use properties::{
    ACK_NEVER_LOST, CURRENT_LEASE_ONLY, EVERY_JOB_TERMINATES, ONE_LIVE_LEASE, ONE_ROW_PER_ENDED_LEASE,
    SAFETY, SOMETIMES, can_terminate,
};
use state::{Coordinator, Job, Kind, Used, Worker, World};
pub use symmetry::representative;

/// Which protocol the model runs: the real one, or one piece broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The protocol as the coordinator implements it.
    Correct,
    /// The reaper's write does not re-check the lease it read (no
    /// `run_lease = e.run_lease AND lease_expires_at <= now()` in
    /// `lease_reap.sql`), so a lease renewed or re-claimed between its read
    /// and its write is reaped.
    ReaperWithoutRecheck,
    /// Finishing calls and heartbeats are guarded on `attempt` instead of
    /// `run_lease`; a release gives its attempt back and an admin retry resets
    /// it, so a stale token's attempt can match a newer lease.
    GuardOnAttempt,
    /// The heartbeat is guarded on `state = 'running'` only: a stale worker
    /// renews (and is told it holds) another worker's lease.
    HeartbeatWithoutGuard,
    /// A finishing call is answered when it joins a batch, before the batch
    /// commits; a crash (or a guard that no longer matches at commit) then
    /// loses an outcome the worker was told took effect.
    AckBeforeCommit,
    /// No reaper at all: a lease whose holder vanished is never taken back.
    /// Breaks only liveness; it shows the liveness check is not vacuous.
    NoReaper,
}

/// The bounds that keep the state space finite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Jobs (each starts not yet enqueued).
    pub jobs: u8,
    /// Worker processes.
    pub workers: u8,
    /// Coordinator processes.
    pub coordinators: u8,
    /// Every job's `max_attempts`.
    pub max_attempts: u8,
    /// Claims per job (`run_lease` never exceeds it).
    pub max_leases: u8,
    /// Answers lost on the network, in all.
    pub lost_answers: u8,
    /// Coordinator crashes (each restarts at once with empty memory).
    pub crashes: u8,
    /// Cancels.
    pub cancels: u8,
    /// Admin retries.
    pub admin_retries: u8,
    /// Faults and admin actions (lost answers, crashes, cancels, admin
    /// retries) in all, on top of the bound of each kind.
    pub disruptions: u8,
}

impl Default for Bounds {
    /// The bounds of the main check: one job through up to 3 leases, 2
    /// workers, 2 coordinators, `max_attempts` 2; at most one of each kind
    /// of fault and admin action (a lost answer, a coordinator crash, a
    /// cancel, an admin retry), and at most two of them in one run.
    fn default() -> Self {
        Bounds {
            jobs: 1,
            workers: 2,
            coordinators: 2,
            max_attempts: 2,
            max_leases: 3,
            lost_answers: 1,
            crashes: 1,
            cancels: 1,
            admin_retries: 1,
            disruptions: 2,
        }
    }
}

impl Bounds {
    /// Two jobs sharing the workers and the coordinators' batches, up to 2
    /// leases each, without faults or admin actions (workers still stall,
    /// leases still expire and are reaped): what one job cannot show, such
    /// as a worker holding a stale lease of one job while it runs another,
    /// or one batch finishing both.
    pub fn two_jobs() -> Self {
        Bounds {
            jobs: 2,
            max_leases: 2,
            disruptions: 0,
            ..Bounds::default()
        }
    }
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `job_enqueue.sql`: the job is inserted `queued`.
    Enqueue {
        /// The job.
        job: u8,
    },
    /// `lease_claim.sql` hands `job` to `worker`; with `lost`, the answer
    /// never reaches it (network, or the coordinator crashed after commit).
    Claim {
        /// The claimer.
        worker: u8,
        /// The job it gets.
        job: u8,
        /// Whether the answer is lost.
        lost: bool,
    },
    /// `lease_heartbeat.sql` for the lease `worker` holds, and its answer.
    /// (A lost heartbeat answer is not modelled: it only leaves the worker
    /// believing less than the coordinator granted.)
    Heartbeat {
        /// The worker.
        worker: u8,
    },
    /// `worker` sends its finishing call (again, after a lost answer) to
    /// coordinator `via`, where it joins the finish batch.
    SendFinish {
        /// The worker.
        worker: u8,
        /// The outcome.
        kind: Kind,
        /// The coordinator.
        via: u8,
    },
    /// Coordinator `c` writes its finish batch in one transaction
    /// (`lease_finish.sql`, then `lease_finish_missed.sql` for the items no
    /// guard matched) and answers every
    /// caller still waiting for it.
    Commit {
        /// The coordinator.
        c: u8,
    },
    /// The answer to `worker`'s finishing call is lost (network, timeout):
    /// the call may have been written or may still be, but the worker will
    /// not hear of it and sends it again.
    LoseAnswer {
        /// The worker.
        worker: u8,
    },
    /// Coordinator `c` crashes and restarts: its batch, its reaper's read and
    /// the answers it had in flight are gone.
    Crash {
        /// The coordinator.
        c: u8,
    },
    /// Time passes: `job`'s lease expires (`lease_expires_at <= now()`), and
    /// so does every grant a worker holds on it (a worker's grant never
    /// outlives the coordinator's expiry: both start at the same renewal).
    Expire {
        /// The job.
        job: u8,
    },
    /// Coordinator `c`'s reaper reads `job`'s lease as expired (the
    /// `expired` CTE of `lease_reap.sql`).
    ReapRead {
        /// The coordinator.
        c: u8,
        /// The job.
        job: u8,
    },
    /// Coordinator `c`'s reaper writes what it read (the `reaped` UPDATE of
    /// `lease_reap.sql`, guarded on the lease it read and on the expiry).
    ReapWrite {
        /// The coordinator.
        c: u8,
    },
    /// `job_cancel.sql`.
    Cancel {
        /// The job.
        job: u8,
    },
    /// `job_retry.sql` (admin retry).
    AdminRetry {
        /// The job.
        job: u8,
    },
}

/// The protocol model under `bounds`, running `variant`.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// The bounds.
    pub bounds: Bounds,
    /// The protocol run.
    pub variant: Variant,
    /// The properties checked (names from [`SAFETY`], [`SOMETIMES`] and
    /// [`EVERY_JOB_TERMINATES`]); all of them by default.
    pub checked: Vec<&'static str>,
}

impl ProtocolModel {
    /// The model of `variant` under `bounds`, checking every property.
    pub fn new(variant: Variant, bounds: Bounds) -> Self {
        let mut checked: Vec<&'static str> = SAFETY.to_vec();
        checked.push(EVERY_JOB_TERMINATES);
        checked.extend(SOMETIMES.iter().copied());
        ProtocolModel {
            bounds,
            variant,
            checked,
        }
    }

    /// The same model checking only `names` (a broken variant's test looks
    /// for one counterexample and stops at the first it finds).
    pub fn checking(mut self, names: &[&'static str]) -> Self {
        self.checked = names.to_vec();
        self
    }

    /// The world before anything happened: no job enqueued, every worker idle.
    pub fn initial(&self) -> World {
        World {
            jobs: (0..self.bounds.jobs).map(|_| Job::absent()).collect(),
            workers: (0..self.bounds.workers).map(|_| Worker::default()).collect(),
            coordinators: (0..self.bounds.coordinators)
                .map(|_| Coordinator::default())
                .collect(),
            acks: Vec::new(),
            stale_write: false,
            misordered_row: false,
            used: Used::default(),
        }
    }
}

impl Model for ProtocolModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![self.initial()]
    }

    fn actions(&self, s: &World, actions: &mut Vec<Action>) {
        self.enabled(s, true, actions);
    }

    fn next_state(&self, s: &World, action: Action) -> Option<World> {
        let next = self.step(s, action)?;
        // A step that changes nothing (a heartbeat of a lease already live
        // and granted) adds no state.
        (next != *s).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
            .into_iter()
            .filter(|p| self.checked.contains(&p.name))
            .collect()
    }
}
