//! Redis: wake-up signals between coordinators, never the truth. Two
//! channels under the configured prefix: `<prefix>:wake` carries a queue that
//! may have claimable jobs, `<prefix>:terminal` a job that reached a terminal
//! state. Each message is `<origin>\n<value>[\n<value>...]`, one value per
//! line; a coordinator ignores its own (it woke its local waiters already).
//!
//! Publishing uses one multiplexed connection, re-made on failure with a
//! backoff during which publishes fail fast. The subscriber reconnects with
//! backoff and resubscribes; while it is down, parked waiters fall back to
//! their timer re-check.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use runlease_protocol::{JobId, QueueName};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::wake::local::LocalWake;

/// Bound on one publish, connection included.
const PUBLISH_TIMEOUT: Duration = Duration::from_millis(500);
/// First reconnect delay; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest reconnect delay.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A failed publish.
#[derive(Debug, thiserror::Error)]
#[error("redis publish failed: {0}")]
pub struct PublishError(pub String);

struct Publisher {
    conn: Option<MultiplexedConnection>,
    /// After a failure, publishes fail fast until this instant.
    retry_at: Option<Instant>,
    backoff: Duration,
}

/// The Redis side of wake-ups.
pub struct RedisLink {
    client: redis::Client,
    wake_channel: String,
    terminal_channel: String,
    origin: String,
    publisher: Mutex<Publisher>,
    subscribed: AtomicBool,
    publishing: AtomicBool,
}

impl RedisLink {
    /// A link to the Redis at `url`, with channels under `prefix`.
    pub fn new(url: &str, prefix: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("invalid RUNLEASE_REDIS_URL: {e}"))?;
        Ok(Self {
            client,
            wake_channel: format!("{prefix}:wake"),
            terminal_channel: format!("{prefix}:terminal"),
            origin: uuid::Uuid::now_v7().simple().to_string(),
            publisher: Mutex::new(Publisher {
                conn: None,
                retry_at: None,
                backoff: MIN_BACKOFF,
            }),
            subscribed: AtomicBool::new(false),
            publishing: AtomicBool::new(true),
        })
    }

    /// Whether the subscription is up and the last publish went through.
    pub fn healthy(&self) -> bool {
        self.subscribed.load(Ordering::Relaxed) && self.publishing.load(Ordering::Relaxed)
    }

    /// Tells every coordinator that `queue` may have claimable jobs.
    pub async fn publish_queue(&self, queue: &QueueName) -> Result<(), PublishError> {
        self.publish(&self.wake_channel, queue.as_str()).await
    }

    /// Tells every coordinator, in one message, that each of `queues` may
    /// have claimable jobs.
    pub async fn publish_queues(&self, queues: &[QueueName]) -> Result<(), PublishError> {
        let values: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
        self.publish(&self.wake_channel, &values.join("\n")).await
    }

    /// Tells every coordinator, in one message, that each of `jobs` reached
    /// a terminal state.
    pub async fn publish_terminals(&self, jobs: &[JobId]) -> Result<(), PublishError> {
        let values: Vec<String> = jobs.iter().map(JobId::to_string).collect();
        self.publish(&self.terminal_channel, &values.join("\n")).await
    }

    /// The cached connection, or why not to try now: after a failure,
    /// publishes fail fast until the backoff passes (without extending it).
    fn connection(&self) -> Result<Option<MultiplexedConnection>, PublishError> {
        let publisher = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = publisher.retry_at
            && Instant::now() < at
        {
            return Err(PublishError(
                "Redis is unreachable; retrying after a backoff".into(),
            ));
        }
        Ok(publisher.conn.clone())
    }

    fn failed(&self, error: &str) {
        let mut publisher = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
        publisher.conn = None;
        publisher.retry_at = Some(Instant::now() + publisher.backoff);
        publisher.backoff = (publisher.backoff * 2).min(MAX_BACKOFF);
        if self.publishing.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error,
                "Redis publish failed: wake-ups between coordinators are degraded"
            );
        }
    }

    async fn publish(&self, channel: &str, value: &str) -> Result<(), PublishError> {
        let message = format!("{}\n{value}", self.origin);
        let cached = self.connection()?;
        let attempt = async {
            let mut conn = match cached {
                Some(conn) => conn,
                None => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(PUBLISH_TIMEOUT))
                        .set_response_timeout(Some(PUBLISH_TIMEOUT));
                    let conn = self
                        .client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map_err(|e| PublishError(e.to_string()))?;
                    self.publisher.lock().unwrap_or_else(|p| p.into_inner()).conn = Some(conn.clone());
                    conn
                }
            };
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(&message)
                .query_async::<i64>(&mut conn)
                .await
                .map_err(|e| PublishError(e.to_string()))
        };
        match tokio::time::timeout(PUBLISH_TIMEOUT * 2, attempt).await {
            Ok(Ok(_receivers)) => {
                let mut publisher = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
                publisher.retry_at = None;
                publisher.backoff = MIN_BACKOFF;
                drop(publisher);
                if !self.publishing.swap(true, Ordering::Relaxed) {
                    tracing::info!("Redis publishes go through again");
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.failed(&e.0);
                Err(e)
            }
            Err(_) => {
                self.failed("timed out");
                Err(PublishError("timed out".into()))
            }
        }
    }

    /// Subscribes and forwards other coordinators' signals to `local` until
    /// `cancel` fires, reconnecting with backoff.
    pub async fn subscribe(&self, local: LocalWake, cancel: CancellationToken) {
        let mut backoff = MIN_BACKOFF;
        loop {
            match self.listen(&local, &cancel).await {
                Ok(()) => return,
                Err(e) => {
                    local.claim_floors().hearing(false);
                    if self.subscribed.swap(false, Ordering::Relaxed) {
                        // It was up: start the next outage's backoff afresh.
                        backoff = MIN_BACKOFF;
                        tracing::warn!(error = %e, "Redis subscription lost: parked waiters fall back to their timers");
                    } else {
                        tracing::debug!(error = %e, "Redis subscription attempt failed");
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = cancel.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One subscription: `Ok` when cancelled, `Err` when the connection failed.
    async fn listen(&self, local: &LocalWake, cancel: &CancellationToken) -> Result<(), String> {
        let mut pubsub = tokio::time::timeout(PUBLISH_TIMEOUT * 2, self.client.get_async_pubsub())
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        pubsub
            .subscribe(&self.wake_channel)
            .await
            .map_err(|e| e.to_string())?;
        pubsub
            .subscribe(&self.terminal_channel)
            .await
            .map_err(|e| e.to_string())?;
        self.subscribed.store(true, Ordering::Relaxed);
        local.claim_floors().hearing(true);
        tracing::info!(channels = %format!("{}, {}", self.wake_channel, self.terminal_channel), "subscribed to Redis wake-ups");
        // Anything published while we were away is lost: wake every waiter so
        // it re-checks PostgreSQL now rather than at its next timer.
        local.wake_all();
        let mut messages = pubsub.on_message();
        loop {
            let msg = tokio::select! {
                msg = messages.next() => msg,
                () = cancel.cancelled() => return Ok(()),
            };
            let Some(msg) = msg else {
                return Err("connection closed".into());
            };
            let Ok(payload) = msg.get_payload::<String>() else {
                continue;
            };
            let Some((origin, values)) = payload.split_once('\n') else {
                continue;
            };
            if origin == self.origin {
                continue;
            }
            // One value per line: a message may carry many.
            let channel = msg.get_channel_name();
            for value in values.split('\n') {
                if channel == self.wake_channel {
                    if let Ok(queue) = QueueName::new(value) {
                        local.queue_ready(&queue);
                    }
                } else if channel == self.terminal_channel
                    && let Ok(job) = value.parse::<JobId>()
                {
                    local.job_terminal(job);
                }
            }
        }
    }
}
