//! Symmetry reduction: jobs are interchangeable (same settings, none
//! enqueued at the start; a job's dependencies and bound on claims are in
//! its row and are renumbered with it), and so are workers and
//! coordinators. A world and
//! the world with its jobs, workers or coordinators renumbered behave alike,
//! so the checker need explore only one of them: the least (by `Ord`) of
//! all renumberings, which is the same for every member of the class.

use super::deps::{bit, members};
use super::state::{Stage, World};

/// Every ordering of `0..n` (n! of them; n is 3 at most here).
fn permutations(n: usize) -> Vec<Vec<u8>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, (n - 1) as u8);
            out.push(p);
        }
    }
    out
}

/// A set of jobs (one bit each) with job `j` renamed `jobs[j]`.
fn remap(mask: u8, jobs: &[u8]) -> u8 {
    members(mask).fold(0, |m, j| m | bit(usize::from(jobs[j])))
}

/// `s` with job `j` renamed `jobs[j]`, worker `w` renamed `workers[w]` and
/// coordinator `c` renamed `coords[c]`.
fn renamed(s: &World, jobs: &[u8], workers: &[u8], coords: &[u8]) -> World {
    let mut n = s.clone();
    for (j, job) in s.jobs.iter().enumerate() {
        let mut job = job.clone();
        job.owner = job.owner.map(|w| workers[w as usize]);
        job.deps = remap(job.deps, jobs);
        job.resolved = remap(job.resolved, jobs);
        for a in &mut job.attempts {
            if a.worker != u8::MAX {
                a.worker = workers[a.worker as usize];
            }
        }
        n.jobs[jobs[j] as usize] = job;
    }
    for (w, worker) in s.workers.iter().enumerate() {
        let mut worker = worker.clone();
        if let Some(h) = worker.held.as_mut() {
            h.job = jobs[h.job as usize];
            if let Some(f) = h.finish.as_mut()
                && let Stage::Sent(c) = f.stage
            {
                f.stage = Stage::Sent(coords[c as usize]);
            }
        }
        n.workers[workers[w] as usize] = worker;
    }
    for (c, coordinator) in s.coordinators.iter().enumerate() {
        let mut coordinator = coordinator.clone();
        for i in &mut coordinator.batch {
            i.job = jobs[i.job as usize];
            i.worker = workers[i.worker as usize];
        }
        coordinator.batch.sort();
        coordinator.reaping = coordinator.reaping.map(|(j, l)| (jobs[j as usize], l));
        for d in &mut coordinator.promoting {
            *d = jobs[*d as usize];
        }
        coordinator.promoting.sort();
        coordinator.promote = coordinator.promote.map(|d| jobs[d as usize]);
        if let Some(read) = coordinator.counters_read.as_mut() {
            let old = read.clone();
            for (j, &v) in old.iter().enumerate() {
                read[jobs[j] as usize] = v;
            }
        }
        n.coordinators[coords[c] as usize] = coordinator;
    }
    for a in &mut n.acks {
        a.job = jobs[a.job as usize];
    }
    n.acks.sort();
    n
}

/// The representative of `s`'s class: its least renumbering.
pub fn representative(s: &World) -> World {
    let jobs = permutations(s.jobs.len());
    let workers = permutations(s.workers.len());
    let coords = permutations(s.coordinators.len());
    let mut best: Option<World> = None;
    for jp in &jobs {
        for wp in &workers {
            for cp in &coords {
                let candidate = renamed(s, jp, wp, cp);
                if best.as_ref().is_none_or(|b| candidate < *b) {
                    best = Some(candidate);
                }
            }
        }
    }
    best.unwrap_or_else(|| s.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::state::{JobState, Kind};
    use crate::model::{Action, Bounds, ProtocolModel, Variant};
    use stateright::Model;

    /// A world with two jobs, one claimed by worker 1 and finished through
    /// coordinator 1, the other claimed by worker 0.
    fn busy_world() -> World {
        let model = ProtocolModel::new(Variant::Correct, Bounds::two_jobs());
        let steps = [
            Action::Enqueue { job: 0 },
            Action::Enqueue { job: 1 },
            Action::Claim {
                worker: 1,
                job: 0,
                lost: false,
            },
            Action::Claim {
                worker: 0,
                job: 1,
                lost: false,
            },
            Action::SendFinish {
                worker: 1,
                kind: Kind::Complete,
                via: 1,
            },
        ];
        steps.iter().fold(model.initial(), |s, &a| {
            model.next_state(&s, a).expect("each step applies")
        })
    }

    #[test]
    fn every_renumbering_has_the_same_representative() {
        let s = busy_world();
        let rep = representative(&s);
        for jp in permutations(2) {
            for wp in permutations(2) {
                for cp in permutations(2) {
                    assert_eq!(representative(&renamed(&s, &jp, &wp, &cp)), rep);
                }
            }
        }
        // And it is a renumbering of the world, not another world.
        assert_eq!(rep.workers.iter().filter(|w| w.held.is_some()).count(), 2);
        assert_eq!(rep.coordinators.iter().map(|c| c.batch.len()).sum::<usize>(), 1);
    }

    #[test]
    fn renumbering_jobs_renumbers_the_dependency_graph() {
        let model = ProtocolModel::new(Variant::Correct, Bounds::fan_in());
        let s = model
            .next_state(
                &model.initial(),
                Action::Claim {
                    worker: 0,
                    job: 0,
                    lost: false,
                },
            )
            .expect("job 0 is queued");
        // Job 2 (blocked on 0 and 1) renamed 0: it now depends on 1 and 2.
        let r = renamed(&s, &[1, 2, 0], &[0, 1], &[0, 1]);
        assert_eq!(r.jobs[0].deps, 0b110);
        assert_eq!(r.jobs[0].state, JobState::Blocked);
        assert_eq!(r.jobs[1].state, JobState::Running);
        assert_eq!(representative(&r), representative(&s));
    }

    #[test]
    fn permutations_are_all_orderings() {
        assert_eq!(permutations(3).len(), 6);
        let mut p = permutations(3);
        p.sort();
        p.dedup();
        assert_eq!(p.len(), 6);
    }
}
