//! The prune loop: deletes terminal jobs, with their attempts, once they have
//! been terminal longer than their queue's retention, and folds the tally
//! deltas. Every replica runs it; the prune lock lets one at a time work
//! (the others find it taken and wait for their next pass).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use runlease_protocol::{JobState, QueueName};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::RetentionConfig;
use crate::metrics::{DepthLabels, Metrics};
use crate::store::prune::{Folded, Pruned, Recount, Sweep};
use crate::store::{Store, StoreError};
use crate::wake::jittered;

/// How often the tally deltas are folded between prune passes.
pub const FOLD_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest time between two recounts of the tallies by one
/// coordinator (each reads the index of every terminal job kept), or after
/// one that failed. With no recount in that time, one asked for is made at
/// the next fold.
pub const RECOUNT_INTERVAL: Duration = Duration::from_secs(60);

/// How long terminal jobs are kept, ms; 0 keeps them forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// `done` jobs (`RUNLEASE_RETENTION_DONE_MS`).
    pub done_ms: i64,
    /// `failed` and `cancelled` jobs (`RUNLEASE_RETENTION_FAILED_MS`).
    pub failed_ms: i64,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Another replica held the prune lock: this pass did nothing.
    pub busy: bool,
    /// Jobs deleted.
    pub pruned: u64,
    /// Prune statements run.
    pub statements: u64,
}

/// Clears a pruner's recounting flag when dropped.
struct Recounting(Arc<AtomicBool>);

impl Drop for Recounting {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The prune loop of one coordinator.
#[derive(Clone)]
pub struct Pruner {
    store: Store,
    metrics: Arc<Metrics>,
    settings: RetentionConfig,
    cancel: CancellationToken,
    /// When the last recount that counted (or failed) started.
    last_recount: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Whether a recount of this pruner is running.
    recounting: Arc<AtomicBool>,
}

impl Pruner {
    /// A pruner keeping terminal jobs as `settings` say, deleting at most
    /// `prune_batch` rows per statement, every `prune_interval`.
    pub fn new(
        store: Store,
        metrics: Arc<Metrics>,
        settings: RetentionConfig,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            store,
            metrics,
            settings,
            cancel,
            last_recount: Arc::default(),
            recounting: Arc::default(),
        }
    }

    /// Folds the tallies, then, if a change made outside the coordinator
    /// asked for a recount or a sweep, starts them (in a task of its own, so the loop
    /// goes on) unless one of this pruner is running or counted in the last
    /// [`RECOUNT_INTERVAL`]. Answers false if another replica holds the
    /// prune lock. A recount that fails is counted and logged, and waits
    /// for the next interval.
    async fn fold(&self) -> Result<bool, StoreError> {
        let Folded::Done { recount_asked } = self.store.fold_tallies().await? else {
            return Ok(false);
        };
        if !recount_asked {
            return Ok(true);
        }
        let due = {
            let last = self.last_recount.lock().expect("never held across a panic");
            last.is_none_or(|at| at.elapsed() >= RECOUNT_INTERVAL)
        };
        if due && !self.recounting.swap(true, Ordering::AcqRel) {
            // Cleared however the task ends. Not stopped at shutdown: a
            // recount cut off mid-statement would hand its connection back
            // to the pool still busy; the process exits under it instead.
            let running = Recounting(self.recounting.clone());
            let pruner = self.clone();
            tokio::spawn(async move {
                let _running = running;
                pruner.recount().await;
            });
        }
        Ok(true)
    }

    /// One recount of the tallies and one sweep of the attempt log, each
    /// if it was asked for.
    async fn recount(&self) {
        let started = Instant::now();
        let counted = self.store.recount_tallies().await.map(|recount| match recount {
            Recount::Counted => {
                self.metrics.tally_recounts.inc();
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "terminal tallies counted again after changes of jobs made outside the coordinator"
                );
                true
            }
            Recount::NotAsked | Recount::Busy => false,
        });
        let counted = self.worked(counted, "counting the tallies again");
        let swept = self.store.sweep_attempts().await.map(|sweep| match sweep {
            Sweep::Swept { attempts } => {
                self.metrics
                    .attempts_swept
                    .inc_by(u64::try_from(attempts).unwrap_or(0));
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    attempts,
                    "attempts of jobs deleted outside the coordinator swept"
                );
                true
            }
            Sweep::NotAsked | Sweep::Busy => false,
        });
        let swept = self.worked(swept, "sweeping the attempts of deleted jobs");
        if counted || swept {
            *self.last_recount.lock().expect("never held across a panic") = Some(started);
        }
    }

    /// Whether a step of [`Pruner::recount`] did anything or failed: the
    /// recount interval counts from either. A failure is counted and logged.
    fn worked(&self, step: Result<bool, StoreError>, what: &str) -> bool {
        step.unwrap_or_else(|e| {
            self.metrics.prune_errors.inc();
            tracing::warn!(error = %e, "{what} failed; retrying after the recount interval");
            true
        })
    }

    /// One pass: folds the tallies, then deletes every expired terminal job,
    /// a statement (one short transaction) of at most `batch` rows at a time.
    pub async fn run_once(&self) -> Result<PruneReport, StoreError> {
        let mut report = PruneReport::default();
        if !self.fold().await? {
            report.busy = true;
            return Ok(report);
        }
        let overrides: HashMap<QueueName, _> = self.store.queue_settings().await?.into_iter().collect();
        let queues = self.store.queues_with_terminal_jobs().await?;
        let terminal = [JobState::Done, JobState::Failed, JobState::Cancelled];
        let retention = self.settings.retention();
        let batch = i64::from(self.settings.prune_batch);
        for (queue, state) in queues.iter().flat_map(|q| terminal.map(|s| (q, s))) {
            let settings = overrides.get(queue);
            let keep_ms = match state {
                JobState::Done => settings
                    .and_then(|s| s.retention_done_ms)
                    .unwrap_or(retention.done_ms),
                _ => settings
                    .and_then(|s| s.retention_failed_ms)
                    .unwrap_or(retention.failed_ms),
            };
            if keep_ms <= 0 {
                continue;
            }
            loop {
                if self.cancel.is_cancelled() {
                    return Ok(report);
                }
                report.statements += 1;
                let deleted = match self.store.prune(queue, state, keep_ms, batch).await? {
                    Pruned::Busy => {
                        report.busy = true;
                        return Ok(report);
                    }
                    Pruned::Deleted(deleted) => deleted,
                };
                let n = deleted.len();
                report.pruned += n as u64;
                if n > 0 {
                    self.metrics
                        .jobs_pruned
                        .get_or_create(&DepthLabels {
                            queue: queue.to_string(),
                            state: state.as_str().to_owned(),
                        })
                        .inc_by(n as u64);
                    tracing::debug!(%queue, %state, jobs = n, "pruned terminal jobs past their retention");
                }
                if (n as i64) < batch {
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Runs passes until `cancel` fires; between passes, folds the tallies
    /// every [`FOLD_INTERVAL`] so a scrape reads few rows.
    pub async fn run(self) {
        let mut next_pass = Instant::now() + jittered(self.settings.prune_interval);
        loop {
            let nap = jittered(FOLD_INTERVAL).min(next_pass.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep(nap) => {}
            }
            if Instant::now() < next_pass {
                if let Err(e) = self.fold().await {
                    self.metrics.prune_errors.inc();
                    tracing::warn!(error = %e, "folding the tallies failed; retrying");
                }
                continue;
            }
            next_pass = Instant::now() + jittered(self.settings.prune_interval);
            match self.run_once().await {
                Ok(report) if report.pruned > 0 => {
                    tracing::info!(jobs = report.pruned, statements = report.statements, "prune pass");
                }
                Ok(_) => {}
                Err(e) => {
                    self.metrics.prune_errors.inc();
                    tracing::warn!(error = %e, "prune pass failed; retrying next interval");
                }
            }
        }
    }
}
