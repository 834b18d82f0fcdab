//! The transitions: which actions a world enables, and what each does. Every
//! write to a job mirrors one statement of `coordinator/src/store/sql/`, with
//! its guard; the comments name it.

use super::state::{Ack, Attempt, Ended, Finish, Held, Item, JobState, Kind, Reply, Stage, World};
use super::{Action, ProtocolModel, Variant, deps};

impl ProtocolModel {
    /// Pushes the actions `s` enables onto `out`, in a fixed order (the
    /// checker rebuilds counterexample paths from action indices). With
    /// `explore` false, only the steps of a run without faults, cancels or
    /// admin actions (what the liveness witness may take), and no bound on
    /// claims.
    pub(super) fn enabled(&self, s: &World, explore: bool, out: &mut Vec<Action>) {
        let b = &self.bounds;
        // Faults and admin actions: only while exploring, within their bounds.
        let faults = explore && s.used.total() < b.disruptions;
        let lose = faults && s.used.lost_answers < b.lost_answers;
        for (j, job) in s.jobs.iter().enumerate() {
            // A dependent is enqueued once its dependencies exist.
            let deps_exist = deps::members(job.deps).all(|d| s.jobs[d].state != JobState::Absent);
            if job.state == JobState::Absent && deps_exist {
                out.push(Action::Enqueue { job: j as u8 });
            }
        }
        for (w, worker) in s.workers.iter().enumerate() {
            let worker_ix = w as u8;
            match &worker.held {
                None => {
                    for (j, job) in s.jobs.iter().enumerate() {
                        if job.state == JobState::Queued && (!explore || job.run_lease < job.max_leases) {
                            out.push(Action::Claim {
                                worker: worker_ix,
                                job: j as u8,
                                lost: false,
                            });
                            if lose {
                                out.push(Action::Claim {
                                    worker: worker_ix,
                                    job: j as u8,
                                    lost: true,
                                });
                            }
                        }
                    }
                }
                Some(held) => match held.finish {
                    None => {
                        out.push(Action::Heartbeat { worker: worker_ix });
                        for kind in Kind::ALL {
                            for via in 0..b.coordinators {
                                out.push(Action::SendFinish {
                                    worker: worker_ix,
                                    kind,
                                    via,
                                });
                            }
                        }
                    }
                    Some(Finish {
                        kind,
                        stage: Stage::Unanswered,
                        ..
                    }) => {
                        for via in 0..b.coordinators {
                            out.push(Action::SendFinish {
                                worker: worker_ix,
                                kind,
                                via,
                            });
                        }
                    }
                    Some(Finish {
                        stage: Stage::Sent(_),
                        ..
                    }) => {
                        if lose {
                            out.push(Action::LoseAnswer { worker: worker_ix });
                        }
                    }
                },
            }
        }
        for (c, coordinator) in s.coordinators.iter().enumerate() {
            let c = c as u8;
            if !coordinator.batch.is_empty() {
                if self.variant == Variant::CounterWithoutLock && coordinator.counters_read.is_none() {
                    out.push(Action::CommitBegin { c });
                } else {
                    out.push(Action::Commit { c });
                }
            }
            if coordinator.promote.is_some() {
                out.push(Action::PromoteWrite { c });
            } else if !coordinator.promoting.is_empty() {
                out.push(Action::PromoteRead { c });
            }
            if coordinator.reaping.is_some() {
                out.push(Action::ReapWrite { c });
            } else if self.variant != Variant::NoReaper {
                for (j, job) in s.jobs.iter().enumerate() {
                    if job.state == JobState::Running && !job.live {
                        out.push(Action::ReapRead { c, job: j as u8 });
                    }
                }
            }
            if faults && s.used.crashes < b.crashes && self.has_volatile(s, c) {
                out.push(Action::Crash { c });
            }
        }
        for (j, job) in s.jobs.iter().enumerate() {
            if job.state == JobState::Running && job.live {
                out.push(Action::Expire { job: j as u8 });
            }
        }
        if faults && s.used.cancels < b.cancels {
            for (j, job) in s.jobs.iter().enumerate() {
                let cancellable = matches!(job.state, JobState::Queued | JobState::Blocked)
                    || (job.state == JobState::Running && !job.cancel_requested);
                if cancellable {
                    out.push(Action::Cancel { job: j as u8 });
                }
            }
        }
        if faults && s.used.admin_retries < b.admin_retries {
            for (j, job) in s.jobs.iter().enumerate() {
                // An admin retry of a job that has dependencies is not
                // modelled (the model's graphs retry dependencies only).
                if matches!(job.state, JobState::Failed | JobState::Cancelled) && job.deps == 0 {
                    out.push(Action::AdminRetry { job: j as u8 });
                }
            }
        }
    }

    /// Whether a crash of `c` would lose anything (a crash of an idle
    /// coordinator is a restart that changes nothing).
    fn has_volatile(&self, s: &World, c: u8) -> bool {
        let coordinator = &s.coordinators[c as usize];
        !coordinator.batch.is_empty()
            || coordinator.reaping.is_some()
            || !coordinator.promoting.is_empty()
            || coordinator.promote.is_some()
            || coordinator.counters_read.is_some()
    }

    /// Whether a finishing call or heartbeat carrying `held` matches the job
    /// row `job` (the guard of `lease_heartbeat.sql` and `lease_finish.sql`).
    fn guard(&self, job: &super::state::Job, run_lease: u8, attempt: u8, heartbeat: bool) -> bool {
        if job.state != JobState::Running {
            return false;
        }
        match self.variant {
            Variant::GuardOnAttempt => job.attempt == attempt,
            Variant::HeartbeatWithoutGuard if heartbeat => true,
            _ => job.run_lease == run_lease,
        }
    }

    /// The world after `action`, or `None` when it does not apply.
    pub(super) fn step(&self, s: &World, action: Action) -> Option<World> {
        let mut n = s.clone();
        match action {
            Action::Enqueue { job } => {
                // job_enqueue.sql: the row is inserted queued (a job with
                // dependencies: blocked, queued or cancelled, by what they
                // are).
                let row = &mut n.jobs[job as usize];
                if row.state != JobState::Absent {
                    return None;
                }
                if row.deps == 0 {
                    row.state = JobState::Queued;
                } else {
                    if deps::members(row.deps).any(|d| n.jobs[d].state == JobState::Absent) {
                        return None;
                    }
                    self.enqueue_dependent(&mut n, usize::from(job));
                }
            }
            Action::Claim { worker, job, lost } => {
                // lease_claim.sql: a compare-and-set of a claimable row
                // (FOR UPDATE SKIP LOCKED re-checks the state): running,
                // run_lease + 1, attempt + 1, owned_by, a fresh expiry.
                if n.workers[worker as usize].held.is_some() {
                    return None;
                }
                let row = &mut n.jobs[job as usize];
                if row.state != JobState::Queued {
                    return None;
                }
                row.state = JobState::Running;
                row.run_lease += 1;
                row.attempt += 1;
                row.owner = Some(worker);
                row.live = true;
                let held = Held {
                    job,
                    run_lease: row.run_lease,
                    attempt: if self.variant == Variant::GuardOnAttempt {
                        row.attempt
                    } else {
                        0
                    },
                    granted: true,
                    finish: None,
                };
                if lost {
                    n.used.lost_answers += 1;
                } else {
                    n.workers[worker as usize].held = Some(held);
                }
            }
            Action::Heartbeat { worker } => {
                // lease_heartbeat.sql: guarded on (id, state = 'running',
                // run_lease); renews the expiry (an expired lease not yet
                // reaped too: the guard is on the lease, not on its expiry).
                let held = n.workers[worker as usize].held?;
                if held.finish.is_some() {
                    return None;
                }
                let row = &mut n.jobs[held.job as usize];
                let matched = self.guard(row, held.run_lease, held.attempt, true);
                if matched {
                    row.live = true;
                }
                if matched {
                    // `renewed` or `cancel_requested`: both renew the lease.
                    if let Some(h) = n.workers[worker as usize].held.as_mut() {
                        h.granted = true;
                    }
                } else {
                    // `lease_lost`: the worker stops the handler and drops it.
                    n.workers[worker as usize].held = None;
                }
            }
            Action::SendFinish { worker, kind, via } => {
                let held = n.workers[worker as usize].held?;
                let retry = match held.finish {
                    None => false,
                    Some(Finish {
                        kind: sent,
                        stage: Stage::Unanswered,
                        ..
                    }) if sent == kind => true,
                    _ => return None,
                };
                let item = Item {
                    kind,
                    job: held.job,
                    run_lease: held.run_lease,
                    attempt: held.attempt,
                    worker,
                };
                let batch = &mut n.coordinators[via as usize].batch;
                if let Err(at) = batch.binary_search(&item) {
                    batch.insert(at, item);
                }
                if self.variant == Variant::AckBeforeCommit {
                    // Answered 200 as it joins the batch.
                    answer(&mut n, worker, kind, Reply::Ok);
                } else if let Some(h) = n.workers[worker as usize].held.as_mut() {
                    // The worker has stopped the handler: it no longer
                    // counts on the lease, whatever the answer.
                    h.granted = false;
                    h.finish = Some(Finish {
                        kind,
                        stage: Stage::Sent(via),
                        retry,
                    });
                }
            }
            Action::CommitBegin { c } => {
                // The finish transaction begins and reads the counters.
                let counters = n.jobs.iter().map(|j| j.pending).collect();
                let coordinator = &mut n.coordinators[c as usize];
                if self.variant != Variant::CounterWithoutLock
                    || coordinator.batch.is_empty()
                    || coordinator.counters_read.is_some()
                {
                    return None;
                }
                coordinator.counters_read = Some(counters);
            }
            Action::Commit { c } => {
                let unread = n.coordinators[c as usize].counters_read.is_none();
                if self.variant == Variant::CounterWithoutLock && unread {
                    return None;
                }
                let batch = std::mem::take(&mut n.coordinators[c as usize].batch);
                if batch.is_empty() {
                    return None;
                }
                self.commit(&mut n, c, &batch);
                n.coordinators[c as usize].counters_read = None;
            }
            Action::LoseAnswer { worker } => {
                let h = n.workers[worker as usize].held.as_mut()?;
                let f = h.finish.as_mut()?;
                // The answer is lost, whether the batch has been written
                // (it stands) or not yet (it will be, answering no one).
                if !matches!(f.stage, Stage::Sent(_)) {
                    return None;
                }
                f.stage = Stage::Unanswered;
                n.used.lost_answers += 1;
            }
            Action::Crash { c } => {
                // The process restarts with nothing in memory: the batch is
                // not written (its transaction never began or is rolled
                // back), the reaper's read is forgotten, the connections of
                // waiting callers reset (they retry).
                let coordinator = &mut n.coordinators[c as usize];
                coordinator.batch.clear();
                coordinator.reaping = None;
                coordinator.promoting.clear();
                coordinator.promote = None;
                coordinator.counters_read = None;
                for w in &mut n.workers {
                    if let Some(f) = w.held.as_mut().and_then(|h| h.finish.as_mut())
                        && f.stage == Stage::Sent(c)
                    {
                        f.stage = Stage::Unanswered;
                    }
                }
                n.used.crashes += 1;
            }
            Action::Expire { job } => {
                let row = &mut n.jobs[job as usize];
                if row.state != JobState::Running || !row.live {
                    return None;
                }
                row.live = false;
                for w in &mut n.workers {
                    if let Some(h) = w.held.as_mut().filter(|h| h.job == job) {
                        h.granted = false;
                    }
                }
            }
            Action::ReapRead { c, job } => {
                // lease_reap.sql, `expired`: running and expired.
                let row = &n.jobs[job as usize];
                if self.variant == Variant::NoReaper
                    || n.coordinators[c as usize].reaping.is_some()
                    || row.state != JobState::Running
                    || row.live
                {
                    return None;
                }
                n.coordinators[c as usize].reaping = Some((job, row.run_lease));
            }
            Action::ReapWrite { c } => {
                // lease_reap.sql, `reaped`: guarded on state = 'running',
                // the run_lease read and lease_expires_at <= now().
                let (job, read) = n.coordinators[c as usize].reaping.take()?;
                let row = &mut n.jobs[job as usize];
                let matched = row.state == JobState::Running
                    && (self.variant == Variant::ReaperWithoutRecheck
                        || (row.run_lease == read && !row.live));
                if matched {
                    row.state = if row.cancel_requested {
                        JobState::Cancelled
                    } else if row.attempt < self.bounds.max_attempts {
                        JobState::Queued
                    } else {
                        JobState::Failed
                    };
                    row.live = false;
                    let ended = row.state.is_terminal();
                    end_attempt(&mut n, job, Ended::LeaseExpired, read);
                    if ended {
                        // The same transaction settles what waits on the job.
                        self.settle(&mut n, usize::from(job), None);
                    }
                }
            }
            Action::Cancel { job } => {
                let row = &mut n.jobs[job as usize];
                // job_cancel.sql: a claimable or blocked job is cancelled
                // at once, and what waits on it is settled in the same
                // statement; a running one gets cancel_requested_at (once).
                match row.state {
                    JobState::Queued | JobState::Blocked => {
                        row.state = JobState::Cancelled;
                        self.settle(&mut n, usize::from(job), None);
                    }
                    JobState::Running if !row.cancel_requested => row.cancel_requested = true,
                    _ => return None,
                }
                n.used.cancels += 1;
            }
            Action::AdminRetry { job } => {
                // job_retry.sql: failed or cancelled back to queued, attempt
                // 0, cancel_requested_at cleared; run_lease untouched.
                let row = &mut n.jobs[job as usize];
                if !matches!(row.state, JobState::Failed | JobState::Cancelled) || row.deps != 0 {
                    return None;
                }
                row.state = JobState::Queued;
                row.attempt = 0;
                row.cancel_requested = false;
                n.used.admin_retries += 1;
            }
            Action::PromoteRead { c } => self.promote_read(&mut n, usize::from(c))?,
            Action::PromoteWrite { c } => self.promote_write(&mut n, usize::from(c))?,
        }
        forget(&mut n);
        Some(n)
    }

    /// One finish statement (`Store::finish`, `lease_finish.sql`), each item
    /// guarded per row, the first item of a lease applying (the batch is in
    /// its canonical order: completes, fails, releases); after the commit,
    /// `lease_finish_missed.sql` tells a repeat of an outcome already applied
    /// under the same lease by the same worker (200) from a stale lease (409).
    /// Then every caller is answered.
    fn commit(&self, n: &mut World, c: u8, batch: &[Item]) {
        // What the statements wrote: (job, the row's run_lease, kind), the
        // `applied` map of `Store::finish`.
        let mut applied: Vec<(u8, u8, Kind)> = Vec::new();
        let max_attempts = self.bounds.max_attempts;
        // The batch is in its canonical order: completes, fails, releases.
        for item in batch {
            let row = &mut n.jobs[item.job as usize];
            if !self.guard(row, item.run_lease, item.attempt, false) {
                continue;
            }
            let (state, outcome) = match item.kind {
                Kind::Complete => (JobState::Done, Ended::Completed),
                Kind::Fail if row.cancel_requested => (JobState::Cancelled, Ended::Cancelled),
                Kind::Fail if row.attempt < max_attempts => (JobState::Queued, Ended::Failed),
                Kind::Fail => (JobState::Failed, Ended::Failed),
                Kind::Release if row.cancel_requested => (JobState::Cancelled, Ended::Cancelled),
                Kind::Release => {
                    // The attempt's charge is given back.
                    row.attempt -= 1;
                    (JobState::Queued, Ended::Released)
                }
            };
            row.state = state;
            row.live = false;
            let row_lease = row.run_lease;
            end_attempt(n, item.job, outcome, item.run_lease);
            if state.is_terminal() {
                // The same transaction settles what waits on the job: promotes
                // it, or cancels it down the graph.
                self.settle(n, usize::from(item.job), Some(c));
            }
            applied.push((item.job, row_lease, item.kind));
        }
        // After the commit, each item is answered on its own: the outcome
        // its lease got in this batch (another kind of the same lease is
        // stale), else a repeat of what its lease's attempt row records.
        let replies: Vec<Reply> = batch
            .iter()
            .map(|item| {
                let in_batch = applied
                    .iter()
                    .find(|(j, l, _)| *j == item.job && *l == item.run_lease)
                    .map(|&(_, _, kind)| kind);
                let ok = match in_batch {
                    Some(kind) => kind == item.kind,
                    None => n.jobs[item.job as usize].attempts.iter().any(|a| {
                        a.run_lease == item.run_lease
                            && a.worker == item.worker
                            && item.kind.matches(a.outcome)
                    }),
                };
                if ok { Reply::Ok } else { Reply::LeaseLost }
            })
            .collect();
        for (item, reply) in batch.iter().zip(replies) {
            // Only a caller still waiting on this coordinator hears it (with
            // the answer sent before the commit, it already did).
            let waiting = n.workers[item.worker as usize].held.is_some_and(|h| {
                h.job == item.job
                    && h.run_lease == item.run_lease
                    && h.finish.is_some_and(|f| f.stage == Stage::Sent(c))
            });
            if waiting {
                answer(n, item.worker, item.kind, reply);
            }
        }
    }
}

/// `worker` receives `reply` to its finishing call of `kind`: the attempt
/// is over for it either way; a 200 is an acknowledgement.
fn answer(n: &mut World, worker: u8, kind: Kind, reply: Reply) {
    let Some(held) = n.workers[worker as usize].held.take() else {
        return;
    };
    if reply == Reply::Ok {
        let ack = Ack {
            job: held.job,
            run_lease: held.run_lease,
            kind,
        };
        if let Err(at) = n.acks.binary_search(&ack) {
            n.acks.insert(at, ack);
        }
    }
}

/// Appends the row of the attempt that `job`'s current lease ran (the
/// `recorded` CTE of every statement that ends one: `run_lease` and
/// `worker_id` from the job row), written by a caller carrying `by_lease`;
/// notes a row written under another lease, or out of lease order.
fn end_attempt(n: &mut World, job: u8, outcome: Ended, by_lease: u8) {
    let row = &mut n.jobs[job as usize];
    let stale = row.run_lease != by_lease;
    let misordered = row.run_lease != row.rows + 1;
    row.rows += 1;
    row.attempts.push(Attempt {
        run_lease: row.run_lease,
        worker: row.owner.unwrap_or(u8::MAX),
        outcome,
    });
    n.stale_write |= stale;
    n.misordered_row |= misordered;
}

/// Drops what no later step can read: acknowledgements whose row exists,
/// and rows (other than each job's latest) of leases nothing names any more.
fn forget(n: &mut World) {
    let jobs = &n.jobs;
    n.acks.retain(|ack| {
        !jobs[ack.job as usize]
            .attempts
            .iter()
            .any(|a| a.run_lease == ack.run_lease && ack.kind.matches(a.outcome))
    });
    let named = |job: u8, lease: u8, n: &World| {
        n.workers
            .iter()
            .any(|w| w.held.is_some_and(|h| h.job == job && h.run_lease == lease))
            || n.coordinators
                .iter()
                .any(|c| c.batch.iter().any(|i| i.job == job && i.run_lease == lease))
            || n.acks.iter().any(|a| a.job == job && a.run_lease == lease)
    };
    for j in 0..n.jobs.len() {
        let last = n.jobs[j].attempts.len().saturating_sub(1);
        let keep: Vec<bool> = n.jobs[j]
            .attempts
            .iter()
            .enumerate()
            .map(|(i, a)| i == last || named(j as u8, a.run_lease, n))
            .collect();
        let mut keep = keep.into_iter();
        n.jobs[j].attempts.retain(|_| keep.next().unwrap_or(true));
    }
}
