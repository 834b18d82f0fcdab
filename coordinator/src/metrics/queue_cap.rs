//! The bound on `queue` label values. Queue names come from clients, and
//! every name would otherwise become a new series in each per-queue family,
//! without limit. The first `RUNLEASE_METRICS_MAX_QUEUES` distinct names this
//! process meets get their own label value; later names share
//! [`OVERFLOW_QUEUE`]. The choice lasts for the life of the process (a
//! restart chooses again), so a queue never moves between its own series and
//! the overflow one while a process runs.

use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// The `queue` label value shared by queues past the cap. Parentheses are
/// not allowed in queue names, so no real queue can be mistaken for it.
pub const OVERFLOW_QUEUE: &str = "(other)";

/// Which queue names have a label value of their own.
#[derive(Debug)]
pub struct QueueCap {
    max: usize,
    known: RwLock<HashSet<String>>,
    /// Distinct queue label values in use (not counting the overflow one).
    pub labels: Gauge,
    /// Observations recorded under the overflow label.
    pub overflowed: Counter,
    warned: AtomicBool,
}

impl QueueCap {
    /// A cap of `max` distinct queue label values (at least 1).
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            known: RwLock::default(),
            labels: Gauge::default(),
            overflowed: Counter::default(),
            warned: AtomicBool::new(false),
        }
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The label value of `queue`: its own name while the cap has room or
    /// once it has one, [`OVERFLOW_QUEUE`] otherwise (the overflow value
    /// itself stays as it is).
    pub fn label<'a>(&self, queue: &'a str) -> &'a str {
        if queue == OVERFLOW_QUEUE || self.admit(queue) {
            queue
        } else {
            OVERFLOW_QUEUE
        }
    }

    fn admit(&self, queue: &str) -> bool {
        // Most calls are settled under the read lock; the write lock, taken
        // only for a name not seen yet, settles it again (another call may
        // have admitted it, or taken the last room, meanwhile).
        let settled = {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            self.settled(&known, queue)
        };
        let admitted = settled.unwrap_or_else(|| {
            let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
            self.settled(&known, queue).unwrap_or_else(|| {
                known.insert(queue.to_owned());
                self.labels.set(known.len() as i64);
                true
            })
        });
        // Warned with no lock held.
        if !admitted {
            self.warn_once(queue);
        }
        admitted
    }

    /// Whether `known` already settles `queue`: `Some(true)` if it has a
    /// label value of its own, `Some(false)` if the cap is full, `None` if
    /// there is room for it.
    fn settled(&self, known: &HashSet<String>, queue: &str) -> Option<bool> {
        if known.contains(queue) {
            Some(true)
        } else if known.len() >= self.max {
            Some(false)
        } else {
            None
        }
    }

    fn warn_once(&self, queue: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = self.max,
                %queue,
                overflow = OVERFLOW_QUEUE,
                "more queues than RUNLEASE_METRICS_MAX_QUEUES: further queues share the overflow queue label in metrics (runlease_metrics_queue_overflow_total counts them)"
            );
        }
    }
}

/// A label set with a `queue` label, which [`Capped`] bounds.
pub trait QueueLabelled: Clone {
    /// The queue label.
    fn queue(&self) -> &str;
    /// The same labels with `queue` instead.
    fn with_queue(&self, queue: &str) -> Self;
}

/// A metric family whose `queue` label is bounded by a [`QueueCap`]; used
/// like a [`Family`].
pub struct Capped<S, M, C = fn() -> M> {
    family: Family<S, M, C>,
    cap: Arc<QueueCap>,
}

impl<S: Clone + std::hash::Hash + Eq, M: Default> Capped<S, M> {
    /// An empty family bounded by `cap`.
    pub fn new(cap: Arc<QueueCap>) -> Self {
        Self {
            family: Family::new_with_constructor(M::default as fn() -> M),
            cap,
        }
    }
}

impl<S: Clone + std::hash::Hash + Eq, M> Capped<S, M, fn() -> M> {
    /// An empty family bounded by `cap` whose metrics `make` makes (a
    /// histogram's buckets).
    pub fn with_constructor(cap: Arc<QueueCap>, make: fn() -> M) -> Self {
        Self {
            family: Family::new_with_constructor(make),
            cap,
        }
    }
}

impl<S, M, C> Capped<S, M, C>
where
    S: QueueLabelled + std::hash::Hash + Eq,
    C: MetricConstructor<M>,
{
    /// The metric of `labels`, its queue replaced by the overflow value when
    /// past the cap.
    pub fn get_or_create(&self, labels: &S) -> impl Deref<Target = M> + '_ {
        let queue = labels.queue();
        let label = self.cap.label(queue);
        if label == queue {
            self.family.get_or_create(labels)
        } else {
            self.cap.overflowed.inc();
            self.family.get_or_create(&labels.with_queue(label))
        }
    }

    /// Removes every series (figures read afresh at each scrape).
    pub fn clear(&self) {
        self.family.clear();
    }
}

impl<S, M, C: Clone> Clone for Capped<S, M, C> {
    fn clone(&self) -> Self {
        Self {
            family: self.family.clone(),
            cap: self.cap.clone(),
        }
    }
}

impl<S, M, C> fmt::Debug for Capped<S, M, C>
where
    Family<S, M, C>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capped").field("family", &self.family).finish()
    }
}

impl<S, M: TypedMetric, C> TypedMetric for Capped<S, M, C> {
    const TYPE: MetricType = <M as TypedMetric>::TYPE;
}

impl<S, M, C> EncodeMetric for Capped<S, M, C>
where
    S: Clone + std::hash::Hash + Eq + EncodeLabelSet,
    M: EncodeMetric + TypedMetric,
    C: MetricConstructor<M>,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        self.family.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
    struct L {
        queue: String,
    }

    impl QueueLabelled for L {
        fn queue(&self) -> &str {
            &self.queue
        }
        fn with_queue(&self, queue: &str) -> Self {
            L {
                queue: queue.to_owned(),
            }
        }
    }

    fn l(q: &str) -> L {
        L { queue: q.to_owned() }
    }

    #[test]
    fn queues_past_the_cap_share_the_overflow_label() {
        let cap = Arc::new(QueueCap::new(2));
        let family: Capped<L, Counter> = Capped::new(cap.clone());
        for q in ["a", "b", "c", "d", "a", "c"] {
            family.get_or_create(&l(q)).inc();
        }
        assert_eq!(family.family.get_or_create(&l("a")).get(), 2);
        assert_eq!(family.family.get_or_create(&l("b")).get(), 1);
        assert_eq!(family.family.get_or_create(&l(OVERFLOW_QUEUE)).get(), 3);
        // No real queue can be named like the overflow label.
        assert!(runlease_protocol::QueueName::new(OVERFLOW_QUEUE).is_err());
        assert_eq!(cap.labels.get(), 2);
        assert_eq!(cap.overflowed.get(), 3);
        // A queue that got a label keeps it; one that did not never gets one.
        assert_eq!(cap.label("b"), "b");
        assert_eq!(cap.label("c"), OVERFLOW_QUEUE);
    }
}
