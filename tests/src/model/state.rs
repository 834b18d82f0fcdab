//! What the model's world holds: the database's rows (jobs and their attempt
//! chronology), each worker's local view, each coordinator's volatile memory,
//! and what workers were told. Indexes are small integers: job `j`, worker
//! `w`, coordinator `c`.

/// A job's state, as the `job_state` enum of PostgreSQL (less
/// `enqueue_failed`, which is claimable exactly like `queued`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    /// Not enqueued yet (no row).
    Absent,
    /// Waiting for a dependency: never claimed.
    Blocked,
    /// Claimable.
    Queued,
    /// Held by a lease.
    Running,
    /// Completed (terminal).
    Done,
    /// Failed with no budget left (terminal; an admin retry re-queues it).
    Failed,
    /// Cancelled (terminal; an admin retry re-queues it).
    Cancelled,
}

impl JobState {
    /// Whether the state is terminal.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Cancelled)
    }
}

/// How an attempt ended: the `attempt_outcome` of its `job_attempts` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ended {
    /// A complete item of `lease_finish.sql`.
    Completed,
    /// A fail item of `lease_finish.sql` without a cancel requested.
    Failed,
    /// A release item of `lease_finish.sql` without a cancel requested.
    Released,
    /// A fail or release item of `lease_finish.sql` with a cancel requested.
    Cancelled,
    /// `lease_reap.sql`.
    LeaseExpired,
}

/// The way a worker ends its attempt (one finishing statement each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `POST /v1/complete`.
    Complete,
    /// `POST /v1/fail` (retryable).
    Fail,
    /// `POST /v1/release`.
    Release,
}

impl Kind {
    /// Every kind, in the order a finish transaction runs their statements.
    pub const ALL: [Kind; 3] = [Kind::Complete, Kind::Fail, Kind::Release];

    /// Whether an attempt recorded as `ended` is this kind already applied:
    /// the repeat check of `Store::finish` (`Outcome::matches`).
    pub fn matches(self, ended: Ended) -> bool {
        match self {
            Kind::Complete => ended == Ended::Completed,
            Kind::Fail => matches!(ended, Ended::Failed | Ended::Cancelled),
            Kind::Release => matches!(ended, Ended::Released | Ended::Cancelled),
        }
    }
}

/// One `job_attempts` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    /// The row's `run_lease`: the job's `run_lease` when the statement wrote it.
    pub run_lease: u8,
    /// The row's `worker_id`: the job's `owned_by` then.
    pub worker: u8,
    /// The row's `outcome`.
    pub outcome: Ended,
}

/// One `jobs` row, as far as the protocol reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Job {
    /// `state`.
    pub state: JobState,
    /// `attempt`: charged by a claim, given back by a release, reset by an
    /// admin retry.
    pub attempt: u8,
    /// `run_lease`: incremented by every claim, never anything else.
    pub run_lease: u8,
    /// `lease_expires_at > now()`: the abstract clock. Set by a claim or a
    /// heartbeat; cleared by time passing ([`super::Action::Expire`]).
    pub live: bool,
    /// `owned_by`: the worker of the latest claim.
    pub owner: Option<u8>,
    /// `cancel_requested_at IS NOT NULL`.
    pub cancel_requested: bool,
    /// How many `job_attempts` rows the job has.
    pub rows: u8,
    /// The rows a later step can still read, oldest first: the latest, and
    /// those of a lease that a worker, a batch item or an unconfirmed
    /// acknowledgement still names (only `lease_finish_missed.sql`, for such a
    /// lease, ever reads a row). Rows no step can read again are dropped
    /// from the model's state, or every path to the same world would count
    /// as a world of its own; the properties on rows are checked as each
    /// row is written.
    pub attempts: Vec<Attempt>,
    /// Claims it may have (`run_lease` never exceeds it): fixed by the
    /// bounds, part of the row so that renumbering jobs carries it along.
    pub max_leases: u8,
    /// The jobs it depends on, one bit per job (fixed by the bounds' graph;
    /// part of the row so that renumbering jobs renumbers the graph too).
    pub deps: u8,
    /// `on_dependency_failure = 'run'` (else `cancel`).
    pub run_on_failure: bool,
    /// The dependencies not yet accounted for: the dependent's counter,
    /// decremented under its row lock when a dependency ends (done, or
    /// failed under `run`); at 0 the job is promoted to `queued`.
    pub pending: u8,
    /// The dependencies already accounted for, one bit per job: the edge's
    /// own mark, set in the statement that decrements the counter, so that
    /// a dependency ending twice (failed, retried by an admin, then done)
    /// is counted once.
    pub resolved: u8,
    /// The job has ended `failed` or `cancelled` at least once (kept only
    /// for a job others depend on: what `run` counts as met).
    pub failed_once: bool,
}

impl Job {
    /// A job not enqueued yet.
    pub fn absent() -> Self {
        Job {
            state: JobState::Absent,
            attempt: 0,
            run_lease: 0,
            live: false,
            owner: None,
            cancel_requested: false,
            rows: 0,
            attempts: Vec::new(),
            max_leases: 0,
            deps: 0,
            run_on_failure: false,
            pending: 0,
            resolved: 0,
            failed_once: false,
        }
    }
}

/// An answer a coordinator gives a worker's finishing call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// 200: the outcome took effect (now or by an earlier call).
    Ok,
    /// 409 `lease_lost`.
    LeaseLost,
}

/// Where a worker's finishing call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Sent to coordinator `c`: waiting in its finish batch, or written and
    /// about to be answered (the answer arrives with the commit step).
    Sent(u8),
    /// The answer was lost (network, timeout, or the coordinator crashed):
    /// the worker sends the same call again.
    Unanswered,
}

/// A finishing call a worker made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Finish {
    /// What it asks for.
    pub kind: Kind,
    /// Where it is.
    pub stage: Stage,
    /// Whether this is a repeat after a lost answer.
    pub retry: bool,
}

/// A lease a worker holds, as the worker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    /// The job.
    pub job: u8,
    /// The lease's `run_lease` (in the token).
    pub run_lease: u8,
    /// The attempt number the claim answered (what a guard on `attempt`
    /// would compare; 0 in the variants that never read it, so it does not
    /// tell worlds apart).
    pub attempt: u8,
    /// The coordinator's last answer on this lease (the claim, or a
    /// heartbeat `renewed`) granted it, the lease has not expired since, and
    /// the worker still runs the handler (it stops before it finishes).
    pub granted: bool,
    /// `None` while the worker runs the handler and heartbeats; the
    /// finishing call once it has stopped.
    pub finish: Option<Finish>,
}

/// A worker process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Worker {
    /// The lease it holds; one at a time (`max_jobs` 1).
    pub held: Option<Held>,
}

/// One finishing call in a coordinator's batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// The outcome (a batch is kept in the canonical order completes, fails,
    /// releases: one of the orders `lease_finish.sql` can see).
    pub kind: Kind,
    /// The job.
    pub job: u8,
    /// The token's lease.
    pub run_lease: u8,
    /// The token's attempt (only [`super::Variant::GuardOnAttempt`] reads it).
    pub attempt: u8,
    /// The token's worker, whom the answer goes to.
    pub worker: u8,
}

/// A coordinator's volatile memory: what a crash loses.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Coordinator {
    /// Finishing calls gathered for the next commit, sorted (a batch is a
    /// set: its statements order the rows themselves).
    pub batch: Vec<Item>,
    /// A lease the reaper has read as expired and not yet written: (job,
    /// run_lease).
    pub reaping: Option<(u8, u8)>,
    /// Only in [`super::Variant::PromoteAfterCommit`]: dependents of jobs
    /// its commits ended `done`, to be checked after the commit, sorted.
    pub promoting: Vec<u8>,
    /// Only in [`super::Variant::PromoteAfterCommit`]: a dependent its
    /// check read as ready (blocked, every dependency done), to be written
    /// `queued` in the next transaction.
    pub promote: Option<u8>,
    /// Only in [`super::Variant::CounterWithoutLock`]: the dependents'
    /// counters (by job) its finish transaction read when it began, without
    /// a lock; its commit writes them less what it ends.
    pub counters_read: Option<Vec<u8>>,
}

/// An outcome a worker was told took effect (200).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ack {
    /// The job.
    pub job: u8,
    /// The lease it was finished under.
    pub run_lease: u8,
    /// The outcome.
    pub kind: Kind,
}

/// Faults and admin actions used so far (each has a bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Used {
    /// Answers lost (claim or finish).
    pub lost_answers: u8,
    /// Coordinator crashes.
    pub crashes: u8,
    /// Cancels.
    pub cancels: u8,
    /// Admin retries.
    pub admin_retries: u8,
}

impl Used {
    /// Faults and admin actions used, of every kind.
    pub fn total(&self) -> u8 {
        self.lost_answers + self.crashes + self.cancels + self.admin_retries
    }
}

/// The whole world at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct World {
    /// The `jobs` rows with their chronology.
    pub jobs: Vec<Job>,
    /// The worker processes.
    pub workers: Vec<Worker>,
    /// The coordinator processes.
    pub coordinators: Vec<Coordinator>,
    /// The 200s workers received for a finishing call whose row is not (yet)
    /// in the chronology, sorted. An acknowledgement whose row exists is
    /// dropped: rows are never removed, so it can never be lost again.
    pub acks: Vec<Ack>,
    /// A row was written under a lease other than the one its writer
    /// carried (a finishing call's token, or the lease the reaper read).
    pub stale_write: bool,
    /// A row was written for a lease that is not the one after the job's
    /// last row (a lease ended twice, or one skipped).
    pub misordered_row: bool,
    /// A job left `blocked` (or was inserted `queued`) while one of its
    /// dependencies was neither done nor, under `run`, ended failed.
    pub early_promotion: bool,
    /// A promotion wrote `queued` on a job that was not `blocked`.
    pub bad_promotion: bool,
    /// Faults and admin actions used.
    pub used: Used,
}

impl World {
    /// Whether every job is in a terminal state.
    pub fn all_terminal(&self) -> bool {
        self.jobs.iter().all(|j| j.state.is_terminal())
    }
}
