//! Flow control as this coordinator sees it: which queues have limits
//! (`max_running`, `max_running_per_key`, `rate_limit`), refreshed from
//! PostgreSQL every second. The view only picks the path a claim takes: the
//! limits themselves are read and enforced in PostgreSQL, under the queue's
//! settings row lock, so a view a moment old can delay a queue's claims by
//! up to a second (a limit just set) but never let one past a limit (but for
//! a shared claim statement already running when a limit is first set: see
//! ADR 014).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use runlease_protocol::QueueName;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::queues::QueueSettings;
use crate::store::{Store, StoreError};
use crate::wake::Wake;

/// How often the view is refreshed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The queues with flow-control limits, and their settings.
pub struct FlowControl {
    settings: RwLock<HashMap<QueueName, QueueSettings>>,
    store: Store,
    wake: Wake,
    metrics: Arc<Metrics>,
}

fn limited(s: &QueueSettings) -> bool {
    s.max_running.is_some() || s.max_running_per_key.is_some() || s.rate_limit.is_some()
}

impl FlowControl {
    /// An empty view over `store`; [`FlowControl::refresh`] fills it.
    pub fn new(store: Store, wake: Wake, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            settings: RwLock::default(),
            store,
            wake,
            metrics,
        })
    }

    /// Which of `queues` have limits (in the order given).
    pub fn limited(&self, queues: &[QueueName]) -> Vec<QueueName> {
        let Ok(settings) = self.settings.read() else {
            return Vec::new();
        };
        if settings.is_empty() {
            return Vec::new();
        }
        queues
            .iter()
            .filter(|q| settings.get(*q).is_some_and(limited))
            .cloned()
            .collect()
    }

    /// Whether `queue` has limits: an ended lease of it frees a slot, so
    /// parked claimers (on every coordinator) are woken.
    pub fn is_limited(&self, queue: &QueueName) -> bool {
        self.settings
            .read()
            .is_ok_and(|s| s.get(queue).is_some_and(limited))
    }

    /// Takes `queue`'s new settings (a PATCH on this coordinator) at once.
    pub fn note(&self, queue: &QueueName, new: &QueueSettings) {
        if let Ok(mut settings) = self.settings.write() {
            settings.insert(queue.clone(), new.clone());
        }
    }

    /// Reads every queue's settings; a queue whose settings changed gets a
    /// local wake-up, so its parked claims look again under the new limits.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let fresh: HashMap<QueueName, QueueSettings> =
            self.store.queue_settings().await?.into_iter().collect();
        let changed: Vec<QueueName> = {
            let Ok(mut settings) = self.settings.write() else {
                return Ok(());
            };
            let changed = fresh
                .iter()
                .filter(|(q, s)| settings.get(*q) != Some(*s))
                .map(|(q, _)| q.clone())
                .chain(settings.keys().filter(|q| !fresh.contains_key(*q)).cloned())
                .collect();
            *settings = fresh;
            changed
        };
        for queue in &changed {
            self.wake.ready_here(queue);
        }
        Ok(())
    }

    /// Refreshes every [`REFRESH_INTERVAL`] until `cancel` fires.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.refresh().await {
                self.metrics.flow_refresh_errors.inc();
                tracing::warn!(error = %e, "cannot read queue settings; keeping the last view");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(REFRESH_INTERVAL) => {}
            }
        }
    }
}
