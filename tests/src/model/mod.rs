//! A model of the lease protocol, checked exhaustively with `stateright` for
//! small bounds: every interleaving of claims, heartbeats, finishing calls,
//! batch commits, reaper passes, cancels, admin retries, time passing, lost
//! answers and crashes, over a few jobs, workers and two coordinators; and,
//! for jobs that depend on others, their promotion and cancel cascade.
//!
//! Each action is one step the real system takes atomically: one SQL
//! statement (or one finish transaction) from `coordinator/src/store/sql/`,
//! or one message. `docs/model.md` maps every action to its statement and
//! guard, says what is abstracted away, and gives the state counts.
//!
//! - [`state`]: the world (rows, worker views, coordinator memory, answers).
//! - `step`: the transitions, one per action.
//! - `deps`: what ending a job does to the jobs that depend on it
//!   (promotion, cancel cascade), and the enqueue of a dependent.
//! - `properties`: the properties and the liveness witness.
//! - `symmetry`: [`representative`], for symmetry reduction (jobs, workers
//!   and coordinators are interchangeable).
//!
//! [`Variant`] selects the correct protocol or one deliberately broken piece;
//! each broken variant must produce a counterexample (`tests/tests/model.rs`).

pub mod state;

mod deps;
mod properties;
mod step;
mod symmetry;

use stateright::{Model, Property};

pub use properties::{
    ACK_NEVER_LOST, CURRENT_LEASE_ONLY, DEPENDENCY_SOMETIMES, DEPS_MET, EVERY_JOB_TERMINATES,
    NONE_STUCK_BLOCKED, ONE_LIVE_LEASE, ONE_ROW_PER_ENDED_LEASE, PROMOTED_ONCE, SAFETY, SOMETIMES,
    can_terminate,
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
    /// Dependents are promoted outside the transaction that ends their last
    /// dependency `done`: the commit notes them in the coordinator's memory,
    /// and after it a check reads the dependencies' states and, in another
    /// transaction, writes the job `queued` (read, then write by id).
    PromoteAfterCommit,
    /// The dependent's counter is decremented each time a dependency ends,
    /// without the edge's own mark: a dependency that ends twice (failed
    /// under `run`, retried by an admin, then done) is counted twice.
    CounterWithoutEdge,
    /// The counter's decrement (and the promotion at 0) is not guarded on
    /// `state = 'blocked'`: a dependency ending `done` counts down a job
    /// that is no longer blocked, and promotes it.
    CounterWithoutGuard,
    /// The finish transaction reads the dependents' counters when it begins,
    /// without locking their rows, and writes the value it read less one:
    /// two transactions ending the two last dependencies at once both write
    /// 1, and the job is never promoted.
    CounterWithoutLock,
}

/// The dependency graph: which jobs each job depends on (one bit per job,
/// an earlier job only) and which jobs have `on_dependency_failure = 'run'`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Graph {
    /// `deps[j]`: the jobs `j` depends on, one bit each.
    pub deps: [u8; 4],
    /// The jobs that run anyway when a dependency fails, one bit each.
    pub run_on_failure: u8,
    /// `leases[j]`: claims of job `j` (0: the bounds' `max_leases`). A
    /// dependent, once promoted, runs as any job does, which the checks
    /// without dependencies explore; one lease of it is enough here.
    pub leases: [u8; 4],
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
    /// The dependencies between the jobs (none by default).
    pub graph: Graph,
    /// Whether every job is enqueued by one batch before anything else
    /// happens (one transaction: jobs without dependencies `queued`, the
    /// others `blocked`), rather than each by its own enqueue at any time.
    pub batch_enqueue: bool,
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
            graph: Graph::default(),
            batch_enqueue: false,
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

    /// Fan-in: job 2 depends on jobs 0 and 1 (`cancel` on failure), all
    /// three enqueued by one batch; one lease each, `max_attempts` 2, one
    /// cancel and no other fault: two coordinators ending the two
    /// dependencies at once, a cancel of one racing the finish of the other.
    pub fn fan_in() -> Self {
        Bounds {
            jobs: 3,
            max_leases: 1,
            lost_answers: 0,
            crashes: 0,
            cancels: 1,
            admin_retries: 0,
            disruptions: 1,
            graph: Graph {
                deps: [0, 0, 0b011, 0],
                run_on_failure: 0,
                leases: [0; 4],
            },
            batch_enqueue: true,
            ..Bounds::default()
        }
    }

    /// The fan-in with up to 2 leases of job 0 and no fault: a
    /// dependency reaped and claimed again while its first worker still
    /// finishes under the stale lease.
    pub fn fan_in_stale() -> Self {
        Bounds {
            cancels: 0,
            disruptions: 0,
            graph: Graph {
                leases: [2, 1, 1, 0],
                ..Bounds::fan_in().graph
            },
            ..Bounds::fan_in()
        }
    }

    /// The fan-in with one coordinator crash instead of the cancel: what
    /// a coordinator holds in memory (a batch, a read) is lost.
    pub fn fan_in_crash() -> Self {
        Bounds {
            crashes: 1,
            cancels: 0,
            ..Bounds::fan_in()
        }
    }

    /// The fan-in under `on_dependency_failure = 'run'`, one worker,
    /// `max_attempts` 1, one admin retry: a dependency that fails counts as
    /// met, and the admin may retry it so that it ends again, `done`, while
    /// the dependent still waits on the other.
    pub fn fan_in_run() -> Self {
        Bounds {
            workers: 1,
            max_attempts: 1,
            cancels: 0,
            admin_retries: 1,
            graph: Graph {
                deps: [0, 0, 0b011, 0],
                run_on_failure: 0b100,
                leases: [2, 1, 1, 0],
            },
            ..Bounds::fan_in()
        }
    }

    /// A chain of depth 2 (job 2 depends on job 1, which depends on job 0),
    /// `cancel` on failure, `max_attempts` 1, one lease each, one cancel:
    /// a failure or cancel of job 0 cancels both jobs below it in the same
    /// statement. Each job is enqueued on its own, at any time after its
    /// dependency: also after the dependency has already ended.
    pub fn chain() -> Self {
        Bounds {
            max_attempts: 1,
            max_leases: 1,
            graph: Graph {
                deps: [0, 0b001, 0b010, 0],
                run_on_failure: 0,
                leases: [0; 4],
            },
            batch_enqueue: false,
            ..Bounds::fan_in()
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
    /// Only in [`Variant::CounterWithoutLock`]: coordinator `c`'s finish
    /// transaction begins and reads the dependents' counters.
    CommitBegin {
        /// The coordinator.
        c: u8,
    },
    /// Only in [`Variant::PromoteAfterCommit`]: coordinator `c` reads the
    /// first dependent its commits noted, and its dependencies' states.
    PromoteRead {
        /// The coordinator.
        c: u8,
    },
    /// Only in [`Variant::PromoteAfterCommit`]: coordinator `c` writes the
    /// dependent it read as ready `queued` (`WHERE id = $1`).
    PromoteWrite {
        /// The coordinator.
        c: u8,
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

    /// The world before anything happened: no job enqueued (or, with
    /// `batch_enqueue`, all of them by one batch), every worker idle.
    pub fn initial(&self) -> World {
        let world = self.empty();
        if !self.bounds.batch_enqueue {
            return world;
        }
        (0..self.bounds.jobs).fold(world, |w, job| {
            self.step(&w, Action::Enqueue { job }).unwrap_or(w)
        })
    }

    /// No job enqueued, every worker idle.
    fn empty(&self) -> World {
        World {
            jobs: (0..self.bounds.jobs)
                .map(|j| Job {
                    deps: self.bounds.graph.deps[usize::from(j)],
                    run_on_failure: self.bounds.graph.run_on_failure & (1 << j) != 0,
                    max_leases: match self.bounds.graph.leases[usize::from(j)] {
                        0 => self.bounds.max_leases,
                        n => n,
                    },
                    ..Job::absent()
                })
                .collect(),
            workers: (0..self.bounds.workers).map(|_| Worker::default()).collect(),
            coordinators: (0..self.bounds.coordinators)
                .map(|_| Coordinator::default())
                .collect(),
            acks: Vec::new(),
            stale_write: false,
            misordered_row: false,
            early_promotion: false,
            bad_promotion: false,
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
