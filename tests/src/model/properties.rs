//! The properties checked on every reachable world, and the liveness
//! witness.

use stateright::Property;

use super::state::{Ended, Job, JobState, Kind, Stage, World};
use super::{Action, ProtocolModel};

/// At most one worker runs each job under a lease the coordinator granted it
/// (claim or heartbeat `renewed`) that has not expired since.
pub const ONE_LIVE_LEASE: &str = "never two live leases on one job";
/// Every attempt row was written under the lease it was meant for: no
/// finishing call or reaper write lands on a newer lease.
pub const CURRENT_LEASE_ONLY: &str = "no outcome applied under a lease other than the current one";
/// Every 200 a worker received for a finishing call is in the job's
/// chronology (or still waiting in a batch that has not been written).
pub const ACK_NEVER_LOST: &str = "an acknowledged outcome is never lost";
/// The chronology holds exactly one row per ended lease, in lease order.
pub const ONE_ROW_PER_ENDED_LEASE: &str = "the attempt chronology has one row per ended lease";
/// From every reachable world, a run without further faults in which workers
/// keep running ends with every job terminal.
pub const EVERY_JOB_TERMINATES: &str = "every job reaches a terminal state when workers keep running";

/// The safety properties (`always`).
pub const SAFETY: [&str; 4] = [
    ONE_LIVE_LEASE,
    CURRENT_LEASE_ONLY,
    ACK_NEVER_LOST,
    ONE_ROW_PER_ENDED_LEASE,
];

/// Scenarios the correct model must reach (`sometimes`): a check that
/// explores too little fails on these instead of passing vacuously.
pub const SOMETIMES: [&str; 6] = [
    "every job terminal",
    "a stale finishing call waits in a batch",
    "a finishing call repeated after a lost answer waits to be answered ok",
    "a reaped job is claimed again",
    "a job is done under its third lease",
    "a cancel is acknowledged by its worker",
];

/// Every property, in the order of the constants above.
pub(super) fn all() -> Vec<Property<ProtocolModel>> {
    vec![
        Property::always(ONE_LIVE_LEASE, |_, s: &World| one_live_lease(s)),
        Property::always(CURRENT_LEASE_ONLY, |_, s: &World| !s.stale_write),
        Property::always(ACK_NEVER_LOST, |_, s: &World| ack_never_lost(s)),
        Property::always(ONE_ROW_PER_ENDED_LEASE, |_, s: &World| one_row_per_ended_lease(s)),
        Property::always(EVERY_JOB_TERMINATES, can_terminate),
        Property::sometimes(SOMETIMES[0], |_, s: &World| s.all_terminal()),
        Property::sometimes(SOMETIMES[1], |_, s: &World| {
            // An item of an ended lease that is no repeat: it will be
            // answered lease_lost.
            s.coordinators.iter().flat_map(|c| &c.batch).any(|i| {
                let job = &s.jobs[usize::from(i.job)];
                i.run_lease < job.run_lease && !recorded(job, i.run_lease, i.worker, i.kind)
            })
        }),
        Property::sometimes(SOMETIMES[2], |_, s: &World| {
            s.workers.iter().zip(0..).any(|(w, ix)| {
                w.held.is_some_and(|h| {
                    h.finish.is_some_and(|f| {
                        f.retry
                            && matches!(f.stage, Stage::Sent(_))
                            && recorded(&s.jobs[usize::from(h.job)], h.run_lease, ix, f.kind)
                    })
                })
            })
        }),
        Property::sometimes(SOMETIMES[3], |_, s: &World| {
            s.jobs.iter().any(|j| {
                j.state == JobState::Running
                    && j.attempts
                        .last()
                        .is_some_and(|a| a.outcome == Ended::LeaseExpired)
            })
        }),
        Property::sometimes(SOMETIMES[4], |_, s: &World| {
            s.jobs
                .iter()
                .any(|j| j.state == JobState::Done && j.run_lease == 3)
        }),
        Property::sometimes(SOMETIMES[5], |_, s: &World| {
            s.jobs.iter().any(|j| {
                j.state == JobState::Cancelled
                    && j.attempts.last().is_some_and(|a| a.outcome == Ended::Cancelled)
            })
        }),
    ]
}

/// Whether `job`'s chronology records `kind` under `run_lease` by `worker`
/// (what makes a repeated call a 200).
fn recorded(job: &Job, run_lease: u8, worker: u8, kind: Kind) -> bool {
    job.attempts
        .iter()
        .any(|a| a.run_lease == run_lease && a.worker == worker && kind.matches(a.outcome))
}

fn one_live_lease(s: &World) -> bool {
    (0..s.jobs.len()).all(|j| {
        s.workers
            .iter()
            .filter_map(|w| w.held)
            .filter(|h| usize::from(h.job) == j && h.granted && h.finish.is_none())
            .count()
            <= 1
    })
}

fn ack_never_lost(s: &World) -> bool {
    s.acks.iter().all(|ack| {
        let recorded = s.jobs[usize::from(ack.job)]
            .attempts
            .iter()
            .any(|a| a.run_lease == ack.run_lease && ack.kind.matches(a.outcome));
        let pending = s.coordinators.iter().any(|c| {
            c.batch
                .iter()
                .any(|i| i.job == ack.job && i.run_lease == ack.run_lease && i.kind == ack.kind)
        });
        recorded || pending
    })
}

fn one_row_per_ended_lease(s: &World) -> bool {
    !s.misordered_row
        && s.jobs.iter().all(|j| {
            let running = u8::from(j.state == JobState::Running);
            j.rows + running == j.run_lease
        })
}

/// Steps the witness may take before it gives up (far more than any run of
/// the checked bounds needs).
const WITNESS_STEPS: usize = 256;

/// The liveness witness: whether, from `s`, a run with no more faults,
/// cancels or admin actions, in which every worker keeps running (it
/// finishes what it holds, retries a call whose answer was lost, claims
/// what is queued), every coordinator keeps committing and reaping, and time
/// passes for leases nobody runs, ends with every job terminal. The run
/// takes the first enabled step in this order: commit a batch, write a reap, send a finishing call (complete, or the call whose
/// answer was lost), enqueue, claim, let an unheld lease expire, read an
/// expired lease. Claims are not bounded here.
///
/// Checked as an `always` property, this is "from every reachable world, all
/// jobs can still become terminal"; with finitely many faults (the bounds)
/// and strong fairness of steps (a step enabled again and again is taken
/// eventually), every run of the finite model then ends with all jobs
/// terminal. A witness that fails may be a witness too weak: its report is
/// the counterexample path to the world it got stuck from.
pub fn can_terminate(model: &ProtocolModel, s: &World) -> bool {
    let mut world = s.clone();
    let mut actions = Vec::new();
    for _ in 0..WITNESS_STEPS {
        if world.all_terminal() {
            return true;
        }
        actions.clear();
        model.enabled(&world, false, &mut actions);
        let next = actions
            .iter()
            .filter_map(|&a| rank(a).map(|r| (r, a)))
            .min_by_key(|&(r, _)| r)
            .and_then(|(_, a)| model.step(&world, a));
        match next {
            Some(n) => world = n,
            None => return false,
        }
    }
    world.all_terminal()
}

/// The witness's preference among fault-free steps (lower first); `None`
/// for steps it never takes.
fn rank(action: Action) -> Option<u8> {
    Some(match action {
        Action::Commit { .. } => 1,
        Action::ReapWrite { .. } => 2,
        // `enabled` lists a working worker's complete first, through the
        // first coordinator; a retry lists only its own kind.
        Action::SendFinish { .. } => 3,
        Action::Enqueue { .. } => 4,
        Action::Claim { lost: false, .. } => 5,
        Action::Expire { .. } => 6,
        Action::ReapRead { .. } => 7,
        _ => return None,
    })
}
