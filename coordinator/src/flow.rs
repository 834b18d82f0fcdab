//! Flow control: [`admit`], the arithmetic of a limited queue's claim (how
//! many jobs `max_running` and the rate limit's token bucket let start), and
//! [`FlowControl`], this coordinator's view of which queues have limits
//! (`max_running`, `max_running_per_key`, `rate_limit`, an endpoint's
//! `concurrency`) and endpoints, refreshed from
//! PostgreSQL every second. The view only picks the path a claim takes: the
//! limits themselves are read and enforced in PostgreSQL, under the queue's
//! settings row lock, so a view a moment old can delay a queue's claims by
//! up to a second (a limit just set) but never let one past a limit (but for
//! a shared claim statement already running when a limit is first set: see
//! ADR 014).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use runlease_protocol::QueueName;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::leases::LimitKind;
use crate::store::queues::{EndpointKeys, EndpointSetting, QueueSettings, RateLimit};
use crate::store::{Store, StoreError};
use crate::wake::Wake;

/// A limited queue's limits and the state of its token bucket, as read
/// under its settings row lock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Most running jobs of the queue.
    pub max_running: Option<i32>,
    /// The token bucket's rate and size.
    pub rate_limit: Option<RateLimit>,
    /// Tokens in the bucket when it was last charged (`None`: never; a new
    /// bucket is full).
    pub tokens: Option<f64>,
    /// When the bucket was last charged.
    pub refilled_at: Option<DateTime<Utc>>,
}

/// What [`admit`] lets a claim start.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Jobs that may start now (at most what was wanted).
    pub allowed: usize,
    /// Slots each limit held back.
    pub held_back: Vec<(LimitKind, usize)>,
    /// Tokens in the bucket at `now`, refilled, before this claim takes any
    /// (`None`: no rate limit); the claim charges what it starts.
    pub tokens: Option<f64>,
    /// When the next token is due, if the rate limit held slots back.
    pub retry_in: Option<Duration>,
}

/// How many of `wanted` jobs a limited queue may start at `now` with
/// `running` jobs running: `max_running` leaves room for the difference,
/// the token bucket (refilled at `per_s` since it was last charged, up to
/// `burst`) for its whole tokens. Pure arithmetic: the store reads the
/// inputs and writes the bucket back under the queue's settings row lock.
pub fn admit(limits: &Limits, wanted: usize, running: i64, now: DateTime<Utc>) -> Admission {
    let tokens = limits.rate_limit.map(|rate| {
        let elapsed = limits.refilled_at.map_or(0.0, |at| {
            ((now - at).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
        });
        let burst = f64::from(rate.burst);
        (limits.tokens.unwrap_or(burst) + rate.per_s * elapsed).min(burst)
    });
    let mut admission = Admission {
        allowed: wanted,
        held_back: Vec::new(),
        tokens,
        retry_in: None,
    };
    if let Some(max) = limits.max_running {
        let room = usize::try_from((i64::from(max) - running).max(0)).unwrap_or(0);
        if room < admission.allowed {
            admission
                .held_back
                .push((LimitKind::MaxRunning, admission.allowed - room));
            admission.allowed = room;
        }
    }
    if let (Some(tokens), Some(rate)) = (tokens, limits.rate_limit) {
        let whole = tokens.floor().max(0.0) as usize;
        if whole < admission.allowed {
            admission
                .held_back
                .push((LimitKind::Rate, admission.allowed - whole));
            admission.allowed = whole;
            // The next token is due when the bucket reaches its next whole
            // number (a rate so small the wait overflows leaves it to the
            // re-check timer).
            let missing = (whole as f64 + 1.0 - tokens).max(0.0);
            admission.retry_in = Duration::try_from_secs_f64(missing / rate.per_s).ok();
        }
    }
    admission
}

/// How often the view is refreshed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The queues with flow-control limits, and their settings.
pub struct FlowControl {
    settings: RwLock<HashMap<QueueName, QueueSettings>>,
    store: Store,
    wake: Wake,
    metrics: Arc<Metrics>,
}

/// Whether a queue's claims take the limited path: it has a limit, or an
/// endpoint (whose `concurrency` holds as `max_running` does).
fn limited(s: &QueueSettings) -> bool {
    s.max_running.is_some()
        || s.max_running_per_key.is_some()
        || s.rate_limit.is_some()
        || s.endpoint.is_some()
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

    /// The queues served by an endpoint, with the endpoint and its live
    /// signing secrets.
    pub fn endpoints(&self) -> Vec<(QueueName, EndpointSetting, Option<EndpointKeys>)> {
        let Ok(settings) = self.settings.read() else {
            return Vec::new();
        };
        settings
            .iter()
            .filter_map(|(q, s)| Some((q.clone(), s.endpoint.clone()?, s.endpoint_keys.clone())))
            .collect()
    }

    /// `queue`'s endpoint and its live signing secrets, if it has one.
    pub fn endpoint(&self, queue: &QueueName) -> Option<(EndpointSetting, Option<EndpointKeys>)> {
        let settings = self.settings.read().ok()?;
        let s = settings.get(queue)?;
        Some((s.endpoint.clone()?, s.endpoint_keys.clone()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::microseconds((secs * 1e6) as i64)
    }

    fn limits(
        max_running: Option<i32>,
        rate: Option<(f64, i32)>,
        tokens: Option<f64>,
        refilled: Option<f64>,
    ) -> Limits {
        Limits {
            max_running,
            rate_limit: rate.map(|(per_s, burst)| RateLimit { per_s, burst }),
            tokens,
            refilled_at: refilled.map(at),
        }
    }

    #[test]
    fn max_running_leaves_room_for_the_difference() {
        let l = limits(Some(10), None, None, None);
        let a = admit(&l, 8, 4, at(0.0));
        assert_eq!(
            (a.allowed, a.held_back.clone()),
            (6, vec![(LimitKind::MaxRunning, 2)])
        );
        assert_eq!((a.tokens, a.retry_in), (None, None));
        assert_eq!(admit(&l, 5, 4, at(0.0)).held_back, vec![]);
        // More running than the limit (it was lowered): none, never negative.
        assert_eq!(admit(&l, 3, 12, at(0.0)).allowed, 0);
    }

    #[test]
    fn a_new_bucket_is_full_and_refills_at_its_rate_up_to_its_burst() {
        let fresh = limits(None, Some((2.0, 5)), None, None);
        let a = admit(&fresh, 8, 0, at(100.0));
        assert_eq!((a.allowed, a.tokens), (5, Some(5.0)));
        assert_eq!(a.held_back, vec![(LimitKind::Rate, 3)]);
        // Empty a second ago at 2 a second: 2 tokens; the third is due in 0.5 s.
        let drained = limits(None, Some((2.0, 5)), Some(0.0), Some(99.0));
        let a = admit(&drained, 8, 0, at(100.0));
        assert_eq!(a.allowed, 2);
        assert_eq!(a.retry_in, Some(Duration::from_millis(500)));
        // Long idle: capped at the burst.
        let idle = limits(None, Some((2.0, 5)), Some(1.0), Some(0.0));
        assert_eq!(admit(&idle, 3, 0, at(100.0)).tokens, Some(5.0));
        // A clock that went back does not drain the bucket.
        let ahead = limits(None, Some((2.0, 5)), Some(1.5), Some(200.0));
        assert_eq!(admit(&ahead, 3, 0, at(100.0)).tokens, Some(1.5));
    }

    #[test]
    fn both_limits_hold_back_in_turn_and_the_lower_wins() {
        let both = limits(Some(4), Some((1.0, 10)), Some(2.5), Some(50.0));
        let a = admit(&both, 6, 1, at(50.0));
        assert_eq!(a.allowed, 2);
        assert_eq!(
            a.held_back,
            vec![(LimitKind::MaxRunning, 3), (LimitKind::Rate, 1)]
        );
        assert_eq!(a.retry_in, Some(Duration::from_millis(500)));
        // A tiny rate whose next token is ages away leaves it to the timer.
        let tiny = limits(None, Some((1e-300, 1)), Some(0.0), Some(0.0));
        assert_eq!(admit(&tiny, 1, 0, at(0.0)).retry_in, None);
    }
}
