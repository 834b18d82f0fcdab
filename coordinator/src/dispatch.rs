//! Dispatch: SQS wake-ups that start Lambda workers. A queue bound to an SQS
//! queue (`RUNLEASE_SQS_QUEUES`) gets wake-up messages whenever jobs on it
//! become due — enqueued, or due again after a retry, release or reap. The
//! number of messages follows the backlog: one per `RUNLEASE_SQS_JOBS_PER_WAKEUP`
//! jobs (a burst of 10,000 fans out to 1,000 invocations; a trickle sends one
//! per job). A message is a hint (`{"queue": q, "jobs": n}`): the woken
//! worker claims from the coordinator over HTTP. Sends that fail leave the
//! jobs unmarked, so the next pass sends again; jobs stay claimable meanwhile.
//!
//! The sender ([`Dispatcher`]) needs the AWS SDK and is built with the `sqs`
//! cargo feature (on by default). The bindings' parsing is always built, so
//! a build without the feature refuses a configuration that names SQS
//! queues instead of ignoring it.

use std::collections::HashMap;
#[cfg(feature = "sqs")]
use std::collections::HashSet;
#[cfg(feature = "sqs")]
use std::sync::{Arc, Mutex};
#[cfg(feature = "sqs")]
use std::time::Duration;

#[cfg(feature = "sqs")]
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use runlease_protocol::QueueName;
#[cfg(feature = "sqs")]
use tokio::sync::broadcast;
#[cfg(feature = "sqs")]
use tokio_util::sync::CancellationToken;

#[cfg(feature = "sqs")]
use crate::metrics::{Metrics, QueueLabels};
#[cfg(feature = "sqs")]
use crate::store::{Store, StoreError};
#[cfg(feature = "sqs")]
use crate::wake::{Wake, jittered};

/// Whether this build can send SQS wake-ups (the `sqs` cargo feature).
pub const SQS_BUILT_IN: bool = cfg!(feature = "sqs");

/// Most jobs one pass signals per queue.
#[cfg(feature = "sqs")]
const DISPATCH_BATCH: i64 = 10_000;
/// SQS's limit of entries per `SendMessageBatch`.
#[cfg(feature = "sqs")]
const SQS_BATCH: usize = 10;

/// Parses `RUNLEASE_SQS_QUEUES`: comma-separated `queue=sqs_queue_url`.
pub fn parse_bindings(spec: &str) -> Result<HashMap<QueueName, String>, String> {
    let mut bindings = HashMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (queue, url) = entry
            .split_once('=')
            .ok_or_else(|| format!("RUNLEASE_SQS_QUEUES: {entry:?} is not queue=sqs_queue_url"))?;
        let queue = QueueName::new(queue.trim()).map_err(|e| format!("RUNLEASE_SQS_QUEUES: {e}"))?;
        let url = url.trim();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(format!(
                "RUNLEASE_SQS_QUEUES: the SQS queue URL of {queue} must be an http(s) URL"
            ));
        }
        if bindings.insert(queue.clone(), url.to_owned()).is_some() {
            return Err(format!("RUNLEASE_SQS_QUEUES: queue {queue} is bound twice"));
        }
    }
    Ok(bindings)
}

/// Wake-up message bodies for `jobs` due jobs of `queue`.
pub fn wakeup_bodies(queue: &QueueName, jobs: usize, per_wakeup: usize) -> Vec<String> {
    let per_wakeup = per_wakeup.max(1);
    let mut bodies = Vec::with_capacity(jobs.div_ceil(per_wakeup));
    let mut left = jobs;
    while left > 0 {
        let n = left.min(per_wakeup);
        left -= n;
        bodies.push(serde_json::json!({"queue": queue.as_str(), "jobs": n}).to_string());
    }
    bodies
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DispatchReport {
    /// Jobs whose wake-ups went out.
    pub signalled: usize,
    /// Wake-up messages sent.
    pub messages: usize,
    /// Queues whose send failed (their jobs are sent again next pass).
    pub failed_queues: Vec<QueueName>,
}

/// The SQS dispatcher of one coordinator.
#[cfg(feature = "sqs")]
#[derive(Clone)]
pub struct Dispatcher {
    store: Store,
    sqs: aws_sdk_sqs::Client,
    bindings: Arc<HashMap<QueueName, String>>,
    per_wakeup: usize,
    interval: Duration,
    metrics: Arc<Metrics>,
    /// Queues whose last send failed: their next good send is a retry.
    failing: Arc<Mutex<HashSet<QueueName>>>,
}

#[cfg(feature = "sqs")]
impl Dispatcher {
    /// A dispatcher for `bindings`, sending through `sqs`.
    pub fn new(
        store: Store,
        sqs: aws_sdk_sqs::Client,
        bindings: HashMap<QueueName, String>,
        per_wakeup: usize,
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            sqs,
            bindings: Arc::new(bindings),
            per_wakeup: per_wakeup.max(1),
            interval,
            metrics,
            failing: Arc::default(),
        }
    }

    /// An SQS client from the standard AWS environment (region, credentials),
    /// with `endpoint` overriding the service URL (moto, LocalStack).
    pub async fn sqs_client(endpoint: Option<&str>) -> aws_sdk_sqs::Client {
        // A pass retries on its own schedule: one try per pass, bounded in time.
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(1))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_timeout(Duration::from_secs(10))
                    .build(),
            );
        if let Some(endpoint) = endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        aws_sdk_sqs::Client::new(&loader.load().await)
    }

    async fn send(&self, url: &str, bodies: &[String]) -> Result<(), String> {
        for (chunk_no, chunk) in bodies.chunks(SQS_BATCH).enumerate() {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(format!("w{chunk_no}-{i}"))
                        .message_body(body)
                        .build()
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .sqs
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
            if let Some(failed) = out.failed().first() {
                return Err(format!(
                    "SQS refused a wake-up: {} {:?}",
                    failed.code(),
                    failed.message()
                ));
            }
        }
        Ok(())
    }

    /// One pass over every bound queue.
    pub async fn run_once(&self) -> Result<DispatchReport, StoreError> {
        let mut report = DispatchReport::default();
        for (queue, url) in self.bindings.iter() {
            let labels = QueueLabels {
                queue: queue.to_string(),
            };
            let mut sent_messages = 0;
            let mut error = None;
            let signalled = self
                .store
                .dispatch_due(queue, DISPATCH_BATCH, |jobs| {
                    let bodies = wakeup_bodies(queue, jobs, self.per_wakeup);
                    sent_messages = bodies.len();
                    let error = &mut error;
                    async move {
                        match self.send(url, &bodies).await {
                            Ok(()) => true,
                            Err(e) => {
                                *error = Some(e);
                                false
                            }
                        }
                    }
                })
                .await?;
            if let Some(e) = error {
                tracing::warn!(%queue, error = %e, "SQS wake-ups not sent; the next pass sends them again");
                self.metrics.sqs_send_failures.get_or_create(&labels).inc();
                self.failing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(queue.clone());
                report.failed_queues.push(queue.clone());
                continue;
            }
            if signalled > 0 {
                self.metrics
                    .sqs_wakeups_sent
                    .get_or_create(&labels)
                    .inc_by(sent_messages as u64);
                if self
                    .failing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(queue)
                {
                    self.metrics.sqs_send_retries.get_or_create(&labels).inc();
                    tracing::info!(%queue, "SQS wake-ups go through again");
                }
                tracing::debug!(%queue, jobs = signalled, messages = sent_messages, "SQS wake-ups sent");
                report.signalled += signalled;
                report.messages += sent_messages;
            }
        }
        Ok(report)
    }

    /// Runs passes on every local wake-up of a bound queue (enqueue, release,
    /// reap, retry) and on a timer (jobs that became due), until `cancel`.
    pub async fn run(self, wake: Wake, cancel: CancellationToken) {
        let mut wakes = wake.subscribe_queues();
        // The timer's deadline outlives wake-ups of other queues: steady
        // enqueues elsewhere must not keep putting off the pass that finds
        // jobs which became due.
        let mut timer = tokio::time::Instant::now() + jittered(self.interval);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(timer) => {}
                w = wakes.recv() => match w {
                    Ok(Some(q)) if !self.bindings.contains_key(&q) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                },
            }
            timer = tokio::time::Instant::now() + jittered(self.interval);
            // Wake-ups that arrive while this pass runs are covered by it.
            while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = wakes.try_recv() {}
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "dispatch pass failed; retrying next interval");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ups_follow_the_backlog() {
        let q = QueueName::new("q").unwrap();
        assert_eq!(
            wakeup_bodies(&q, 1, 10),
            vec![r#"{"jobs":1,"queue":"q"}"#.to_owned()]
        );
        assert_eq!(wakeup_bodies(&q, 10_000, 10).len(), 1_000);
        assert_eq!(wakeup_bodies(&q, 25, 10).len(), 3);
        assert_eq!(wakeup_bodies(&q, 0, 10).len(), 0);
    }

    #[test]
    fn bindings_parse() {
        let b = parse_bindings(
            "emails=https://sqs.eu-west-1.amazonaws.com/1/emails, reports=http://127.0.0.1:5000/1/r",
        )
        .unwrap();
        assert_eq!(b.len(), 2);
        assert!(parse_bindings("emails").is_err());
        assert!(parse_bindings("bad queue=https://x").is_err());
        assert!(parse_bindings("q=ftp://x").is_err());
        assert!(parse_bindings("q=https://a,q=https://b").is_err());
        assert!(parse_bindings("").unwrap().is_empty());
    }
}
