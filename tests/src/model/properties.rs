//! The properties checked on every reachable world, and the liveness
//! witness.

use stateright::Property;

use super::deps::deps_ended;
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
/// A job with dependencies is promoted (or inserted `queued`) only when each
/// dependency is done or, under `on_dependency_failure = 'run'`, has ended
/// failed or cancelled: it is never claimed before.
pub const DEPS_MET: &str = "a job leaves blocked only when its dependencies are met";
/// A promotion writes only a `blocked` job, so a job is promoted at most once
/// (nothing makes a job `blocked` again).
pub const PROMOTED_ONCE: &str = "a job is promoted only from blocked, so at most once";
/// No job is `blocked` when all its dependencies have ended: the step that
/// ends the last one promotes it or cancels it (only a broken variant may
/// have a promotion on its way, noted in a coordinator's memory).
pub const NONE_STUCK_BLOCKED: &str = "no job stays blocked once its dependencies have all ended";
/// From every reachable world, a run without further faults in which workers
/// keep running ends with every job terminal.
pub const EVERY_JOB_TERMINATES: &str = "every job reaches a terminal state when workers keep running";

/// The safety properties (`always`).
pub const SAFETY: [&str; 7] = [
    ONE_LIVE_LEASE,
    CURRENT_LEASE_ONLY,
    ACK_NEVER_LOST,
    ONE_ROW_PER_ENDED_LEASE,
    DEPS_MET,
    PROMOTED_ONCE,
    NONE_STUCK_BLOCKED,
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

/// Scenarios of the dependency graphs (`sometimes`), each reachable in the
/// graph its test names.
pub const DEPENDENCY_SOMETIMES: [&str; 7] = [
    "a dependent runs",
    "both last dependencies' completions wait in the two coordinators' batches",
    "a dependency's stale finishing call waits in a batch while its dependent is blocked",
    "a dependent is cancelled while its other dependency's completion waits in a batch",
    "a cancel cascade cancels a job two levels down",
    "under run, a dependent runs after a dependency failed",
    "a dependency retried by an admin ends done while its dependent waits",
];

/// Every property, in the order of the constants above.
pub(super) fn all() -> Vec<Property<ProtocolModel>> {
    vec![
        Property::always(ONE_LIVE_LEASE, |_, s: &World| one_live_lease(s)),
        Property::always(CURRENT_LEASE_ONLY, |_, s: &World| !s.stale_write),
        Property::always(ACK_NEVER_LOST, |_, s: &World| ack_never_lost(s)),
        Property::always(ONE_ROW_PER_ENDED_LEASE, |_, s: &World| one_row_per_ended_lease(s)),
        Property::always(DEPS_MET, |_, s: &World| !s.early_promotion),
        Property::always(PROMOTED_ONCE, |_, s: &World| !s.bad_promotion),
        Property::always(NONE_STUCK_BLOCKED, |_, s: &World| none_stuck_blocked(s)),
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
        Property::sometimes(DEPENDENCY_SOMETIMES[0], |_, s: &World| {
            s.jobs.iter().any(|j| j.deps != 0 && j.state == JobState::Running)
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[1], |_, s: &World| {
            // Coordinator 0 holds the completion of one dependency under its
            // current lease, coordinator 1 that of the other.
            let completing = |c: usize, deps: u8| -> u8 {
                s.coordinators.get(c).map_or(0, |c| {
                    c.batch
                        .iter()
                        .filter(|i| {
                            i.kind == Kind::Complete
                                && deps & (1 << i.job) != 0
                                && i.run_lease == s.jobs[usize::from(i.job)].run_lease
                        })
                        .fold(0, |m, i| m | (1 << i.job))
                })
            };
            blocked_deps(s).any(|(_, deps)| {
                let (first, second) = (completing(0, deps), completing(1, deps));
                first != 0 && second != 0 && (first | second) == deps && first != second
            })
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[2], |_, s: &World| {
            blocked_deps(s).any(|(_, deps)| {
                s.coordinators.iter().flat_map(|c| &c.batch).any(|i| {
                    let job = &s.jobs[usize::from(i.job)];
                    deps & (1 << i.job) != 0
                        && i.run_lease < job.run_lease
                        && !recorded(job, i.run_lease, i.worker, i.kind)
                })
            })
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[3], |_, s: &World| {
            s.jobs.iter().any(|j| {
                j.deps != 0
                    && j.state == JobState::Cancelled
                    && j.run_lease == 0
                    && s.coordinators.iter().flat_map(|c| &c.batch).any(|i| {
                        i.kind == Kind::Complete
                            && j.deps & (1 << i.job) != 0
                            && s.jobs[usize::from(i.job)].state == JobState::Running
                            && i.run_lease == s.jobs[usize::from(i.job)].run_lease
                    })
            })
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[4], |_, s: &World| {
            s.jobs.iter().any(|j| {
                let two_down = s
                    .jobs
                    .iter()
                    .zip(0..)
                    .any(|(d, ix)| j.deps & (1 << ix) != 0 && d.deps != 0);
                two_down && j.state == JobState::Cancelled && j.run_lease == 0
            })
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[5], |_, s: &World| {
            s.jobs.iter().any(|j| {
                j.run_on_failure
                    && j.state == JobState::Running
                    && s.jobs
                        .iter()
                        .zip(0..)
                        .any(|(d, ix)| j.deps & (1 << ix) != 0 && d.failed_once)
            })
        }),
        Property::sometimes(DEPENDENCY_SOMETIMES[6], |_, s: &World| {
            blocked_deps(s).any(|(_, deps)| {
                s.jobs
                    .iter()
                    .zip(0..)
                    .any(|(d, ix)| deps & (1 << ix) != 0 && d.failed_once && d.state == JobState::Done)
            })
        }),
    ]
}

/// The blocked jobs, with their dependencies (one bit each).
fn blocked_deps(s: &World) -> impl Iterator<Item = (usize, u8)> + '_ {
    s.jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.state == JobState::Blocked)
        .map(|(ix, j)| (ix, j.deps))
}

fn none_stuck_blocked(s: &World) -> bool {
    s.jobs.iter().enumerate().all(|(ix, j)| {
        let on_its_way = s
            .coordinators
            .iter()
            .any(|c| c.promote == Some(ix as u8) || c.promoting.contains(&(ix as u8)));
        j.state != JobState::Blocked || !deps_ended(s, ix) || on_its_way
    })
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
        Action::Commit { .. } | Action::CommitBegin { .. } => 1,
        Action::ReapWrite { .. } => 2,
        Action::PromoteWrite { .. } | Action::PromoteRead { .. } => 2,
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
