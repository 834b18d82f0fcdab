//! Dependencies: what ending a job does to the jobs that wait on it, in the
//! same transaction that ends it (the finish of a batch, the reaper's
//! write, a cancel: the statement after the one that ends the job), and the enqueue of a job that depends on
//! others. A dependent's row is written under its own row lock and guarded
//! on `state = 'blocked'`, so each of these is part of the ending step.

use super::state::{JobState, World};
use super::{ProtocolModel, Variant};

/// The bit of job `j` in a dependency mask.
pub(super) fn bit(j: usize) -> u8 {
    1 << j
}

/// The jobs in `mask`, by index.
pub(super) fn members(mask: u8) -> impl Iterator<Item = usize> {
    (0..8).filter(move |&j| mask & bit(j) != 0)
}

/// Whether some job depends on `job`.
fn has_dependents(n: &World, job: usize) -> bool {
    n.jobs.iter().any(|d| d.deps & bit(job) != 0)
}

/// Whether every dependency of `d` is met: `done`, or, under `run`, ended
/// `failed` or `cancelled` at some point (what the property on promotions
/// compares against, from the dependencies' own rows).
pub(super) fn deps_met(n: &World, d: usize) -> bool {
    let dependent = &n.jobs[d];
    members(dependent.deps).all(|j| {
        let dep = &n.jobs[j];
        dep.state == JobState::Done || (dependent.run_on_failure && dep.failed_once)
    })
}

/// Whether every dependency of `d` has ended (is in a terminal state).
pub(super) fn deps_ended(n: &World, d: usize) -> bool {
    members(n.jobs[d].deps).all(|j| n.jobs[j].state.is_terminal())
}

impl ProtocolModel {
    /// `job` has just ended (`done`, `failed` or `cancelled`) in the step
    /// being taken, by coordinator `via` when a finish commit ended it: each
    /// job still `blocked` on it with the edge not yet accounted for counts
    /// it, in the same transaction. Done, or failed under `run`: the counter
    /// goes down and the job is promoted to `queued` at 0. Failed or
    /// cancelled under `cancel`: the job is cancelled, and so on down the
    /// graph.
    pub(super) fn settle(&self, n: &mut World, job: usize, via: Option<u8>) {
        let ended = n.jobs[job].state;
        debug_assert!(ended.is_terminal());
        if ended != JobState::Done && has_dependents(n, job) {
            n.jobs[job].failed_once = true;
        }
        for d in 0..n.jobs.len() {
            let dependent = &n.jobs[d];
            let met = ended == JobState::Done || dependent.run_on_failure;
            // The guard on state = 'blocked' (without it, in the variant, a
            // dependency met still counts down any existing row).
            let unguarded = self.variant == Variant::CounterWithoutGuard && met;
            let guarded =
                dependent.state == JobState::Blocked || (unguarded && dependent.state != JobState::Absent);
            if dependent.deps & bit(job) == 0 || !guarded {
                continue;
            }
            if self.variant != Variant::CounterWithoutEdge && dependent.resolved & bit(job) != 0 {
                continue;
            }
            if met && ended == JobState::Done && self.variant == Variant::PromoteAfterCommit {
                // Not in this statement: the coordinator notes the
                // dependent and checks it after the commit.
                if let Some(c) = via {
                    let notes = &mut n.coordinators[usize::from(c)].promoting;
                    if let Err(at) = notes.binary_search(&(d as u8)) {
                        notes.insert(at, d as u8);
                    }
                }
                continue;
            }
            let dependent = &mut n.jobs[d];
            if self.variant != Variant::CounterWithoutEdge {
                dependent.resolved |= bit(job);
            }
            if met {
                dependent.pending = dependent.pending.saturating_sub(1);
                if let Some(read) = via.and_then(|c| n.coordinators[usize::from(c)].counters_read.as_mut()) {
                    // Written from what the transaction read (and its own
                    // writes since), not from the row as it is now.
                    read[d] = read[d].saturating_sub(1);
                    n.jobs[d].pending = read[d];
                }
                if n.jobs[d].pending == 0 {
                    promote(n, d);
                }
            } else {
                // The dependent is cancelled, its error naming `job`; what
                // waits on it is settled in the same transaction.
                dependent.state = JobState::Cancelled;
                self.settle(n, d, via);
            }
        }
    }

    /// `job_enqueue.sql` for a job with dependencies, which all exist (refs
    /// of earlier jobs of the batch, or existing ids) and are read under a
    /// share lock, so no statement ends one between the read and the
    /// insert: the edges of dependencies already done (or, under `run`,
    /// ended failed) are accounted for at once; a dependency already failed
    /// under `cancel` inserts the job `cancelled`; with nothing left to wait
    /// for, it is inserted `queued`, else `blocked`.
    pub(super) fn enqueue_dependent(&self, n: &mut World, job: usize) {
        let row = &n.jobs[job];
        let mut resolved = 0;
        let mut failed = false;
        for j in members(row.deps) {
            match n.jobs[j].state {
                JobState::Done => resolved |= bit(j),
                JobState::Failed | JobState::Cancelled if row.run_on_failure => resolved |= bit(j),
                JobState::Failed | JobState::Cancelled => failed = true,
                _ => {}
            }
        }
        let pending = (row.deps & !resolved).count_ones() as u8;
        let row = &mut n.jobs[job];
        row.pending = pending;
        if self.variant != Variant::CounterWithoutEdge {
            row.resolved = resolved;
        }
        if failed {
            row.state = JobState::Cancelled;
        } else if pending == 0 {
            row.state = JobState::Queued;
            n.early_promotion |= !deps_met(n, job);
        } else {
            row.state = JobState::Blocked;
        }
    }

    /// [`super::Action::PromoteRead`]: coordinator `c` takes the first
    /// dependent it noted and reads it (its own transaction, after the
    /// commit): ready when it is `blocked` and every dependency is done.
    pub(super) fn promote_read(&self, n: &mut World, c: usize) -> Option<()> {
        let coordinator = &mut n.coordinators[c];
        if coordinator.promote.is_some() || coordinator.promoting.is_empty() {
            return None;
        }
        let d = coordinator.promoting.remove(0);
        let ready = n.jobs[usize::from(d)].state == JobState::Blocked && deps_met(n, usize::from(d));
        if ready {
            n.coordinators[c].promote = Some(d);
        }
        Some(())
    }

    /// [`super::Action::PromoteWrite`]: coordinator `c` writes the dependent
    /// it read as ready `queued`, by id: what it read may have changed.
    pub(super) fn promote_write(&self, n: &mut World, c: usize) -> Option<()> {
        let d = n.coordinators[c].promote.take()?;
        promote(n, usize::from(d));
        Some(())
    }
}

/// `d` is written `queued` by a promotion; notes a promotion of a job that
/// was not `blocked`, or whose dependencies are not all met.
fn promote(n: &mut World, d: usize) {
    n.bad_promotion |= n.jobs[d].state != JobState::Blocked;
    n.early_promotion |= !deps_met(n, d);
    n.jobs[d].state = JobState::Queued;
}
