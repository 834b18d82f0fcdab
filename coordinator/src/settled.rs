//! Announces the jobs whose dependencies settled. The transaction that ends
//! a dependency settles its dependents (see [`crate::store::dependencies`]);
//! once it commits, the store sends them here, whichever operation ended the
//! dependency (a finish, the reaper, a cancel, a delete). A job queued from
//! `blocked` wakes the claims of its queue on every coordinator, as an
//! enqueue does; a job cancelled by a failed dependency wakes the readers
//! waiting for its end. Each is counted and logged.

use std::sync::Arc;

use runlease_protocol::{JobState, QueueName};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, Via};
use crate::store::dependencies::Settled;
use crate::wake::Wake;

/// Announces what `settled` receives until it closes or `cancel` fires.
pub async fn run(
    mut settled: UnboundedReceiver<Vec<Settled>>,
    wake: Wake,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    loop {
        let jobs = tokio::select! {
            jobs = settled.recv() => match jobs {
                Some(jobs) => jobs,
                None => return,
            },
            () = cancel.cancelled() => return,
        };
        announce(&wake, &metrics, jobs).await;
    }
}

/// Counts, logs and wakes for one transaction's settled jobs.
async fn announce(wake: &Wake, metrics: &Metrics, jobs: Vec<Settled>) {
    let mut queues: Vec<QueueName> = Vec::new();
    for job in &jobs {
        metrics.transition_of(
            job.queue.as_str(),
            job.state,
            job.created_at,
            job.finished_at,
            Via::Dependency,
        );
        match job.state {
            JobState::Queued => {
                job_event!(job.traced, job_id = %job.job_id, queue = %job.queue, "dependencies done: job queued");
                if !queues.contains(&job.queue) {
                    queues.push(job.queue.clone());
                }
            }
            _ => {
                tracing::info!(job_id = %job.job_id, queue = %job.queue, state = %job.state, "a dependency failed: job cancelled");
                wake.terminal(job.job_id);
            }
        }
    }
    if queues.is_empty() {
        return;
    }
    // The jobs are committed either way: a wake-up that does not go out
    // leaves them to the claims' re-check timer.
    if let Err(e) = wake.enqueued(&queues).await {
        tracing::warn!(error = %e, queues = queues.len(), "wake-up of jobs queued by their dependencies not delivered");
    }
}
