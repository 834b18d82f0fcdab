//! Queue figures for `/metrics` and `/v1/queues[/{queue}]`, read from PostgreSQL at
//! once while that is cheap, and from one background read while it is not.
//!
//! The live counts come from indexes over live rows (`queue_live_counts.sql`)
//! and the jobs that ended in the last minute from a range of the terminal
//! index (`queue_throughput.sql`). Both walk index entries, dead ones
//! included: right after a burst of a few hundred thousand jobs, until
//! vacuum has been over the table, one read takes tens of milliseconds, and
//! each scrape would pay it again. So:
//!
//! - A read answered directly is timed. When it took longer than
//!   [`Tuning::slow`] on a jobs table past [`Tuning::big_table`] rows
//!   (live and dead, as PostgreSQL's statistics count them), that kind of
//!   read (scrape or page) turns *slow*; it turns fast again once its reads
//!   have taken under half of it for [`Tuning::settle`] in a row (ten reads
//!   at least), or one finds the table small. Under a steady stream reads
//!   are quick most of the time and slow now and then: a short hysteresis
//!   made the kind flip back and forth, and each flip answered one request
//!   with a slow read of its own.
//! - While a kind is slow, a loop reads its figures every
//!   [`Tuning::refresh`] (or twenty times as long as one read took, if that
//!   is longer: a twentieth of one connection at most) and the requests are
//!   answered the latest of those reads, at most [`Tuning::max_age`] old,
//!   without a statement of their own. The loop times each read.
//! - The loop runs only while someone asks: it stops reading a kind nobody
//!   asked for in [`Tuning::idle`].
//! - One queue's page (`GET /v1/queues/{queue}`, [`QueueFiguresCache::queue`])
//!   is a page read: while those are slow it takes the queue's counts from
//!   the loop's latest and reads only the queue's settings, one row.
//!
//! A small table (every test database, most deployments between bursts)
//! always gets figures read at the moment it is asked.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use runlease_protocol::QueueName;

use crate::store::queues::QueueFigures;
use crate::store::{Store, StoreError};

/// When the figures are read from the loop instead of at once.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// A read slower than this (on a big table) turns its kind slow.
    pub slow: Duration,
    /// Jobs table rows (live and dead) under which reads are always direct.
    pub big_table: i64,
    /// How often the loop reads a slow kind's figures (at least).
    pub refresh: Duration,
    /// Oldest figures answered; older ones are read again at once.
    pub max_age: Duration,
    /// The loop stops reading a kind nobody asked for this long.
    pub idle: Duration,
    /// How long a slow kind's reads must all be quick before requests read
    /// for themselves again.
    pub settle: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            slow: Duration::from_millis(2),
            big_table: 20_000,
            refresh: Duration::from_secs(1),
            max_age: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            settle: Duration::from_secs(60),
        }
    }
}

/// Which figures: a scrape's (counts and tallies) or a page's (with the
/// jobs ended in the last minute and those held back by limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/metrics`.
    Scrape,
    /// `/v1/queues`.
    Page,
}

impl Kind {
    fn index(self) -> usize {
        match self {
            Kind::Scrape => 0,
            Kind::Page => 1,
        }
    }

    fn detail(self) -> bool {
        self == Kind::Page
    }
}

/// The figures of one read, and how long it took.
#[derive(Debug, Clone)]
struct Read {
    at: Instant,
    cost: Duration,
    figures: Arc<Vec<QueueFigures>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Answered from the loop's reads.
    slow: bool,
    /// Quick reads in a row while slow, and when the first of them began.
    quick: u32,
    quick_since: Option<Instant>,
    last: Option<Read>,
    asked_at: Option<Instant>,
}

/// Quick reads in a row (under half [`Tuning::slow`]), for
/// [`Tuning::settle`] at least, after which a slow kind is read for each
/// request again: a table that vacuum has not yet cleaned reads quickly at
/// times between slow reads.
const QUICK_IN_A_ROW: u32 = 10;

/// Figures as they were last read, and the loop that reads them while
/// reads are slow.
pub struct QueueFiguresCache {
    store: Store,
    tuning: Tuning,
    slots: Mutex<[Slot; 2]>,
    /// Told when a kind turns slow: the loop starts reading it.
    wanted: Notify,
}

/// What a request was answered: the figures, and how old they are (zero
/// when read for it).
#[derive(Debug, Clone)]
pub struct Answer {
    /// Every queue's figures.
    pub figures: Arc<Vec<QueueFigures>>,
    /// How long ago they were read.
    pub age: Duration,
}

impl QueueFiguresCache {
    /// A cache over `store`; its loop is [`Self::run`].
    pub fn new(store: Store, tuning: Tuning) -> Self {
        Self {
            store,
            tuning,
            slots: Mutex::default(),
            wanted: Notify::new(),
        }
    }

    fn slots(&self) -> MutexGuard<'_, [Slot; 2]> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The figures of every queue, for `kind`.
    pub async fn figures(&self, kind: Kind) -> Result<Answer, StoreError> {
        let now = Instant::now();
        if let Some(read) = self.cached(kind, now) {
            return Ok(Answer {
                age: now.saturating_duration_since(read.at),
                figures: read.figures,
            });
        }
        let read = self.read(kind).await?;
        Ok(Answer {
            figures: read.figures,
            age: Duration::ZERO,
        })
    }

    /// One queue's page figures (`GET /v1/queues/{queue}`): while page
    /// figures come from the loop, that queue's counts are taken from its
    /// latest read and only the queue's settings (one row) are read now, so
    /// a change of settings shows at once; otherwise read now, and timed
    /// like a page read (one queue's read walks the same indexes).
    pub async fn queue(&self, queue: &QueueName) -> Result<QueueFigures, StoreError> {
        let now = Instant::now();
        if let Some(read) = self.cached(Kind::Page, now) {
            let mut figures = read
                .figures
                .iter()
                .find(|f| &f.queue == queue)
                .cloned()
                .unwrap_or_else(|| QueueFigures::empty(queue.clone()));
            self.store.read_settings_into(&mut figures).await?;
            return Ok(figures);
        }
        let cost = Instant::now();
        let figures = self.store.queue_figures(Some(queue), true).await?;
        self.settle(Kind::Page, None, now, cost.elapsed()).await?;
        figures
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Database(format!("queue figures answered no queue {queue}")))
    }

    /// The latest read of `kind` when requests are answered from the loop's
    /// reads and it is recent enough; notes that `kind` was asked for.
    fn cached(&self, kind: Kind, now: Instant) -> Option<Read> {
        let mut slots = self.slots();
        let slot = &mut slots[kind.index()];
        slot.asked_at = Some(now);
        slot.last
            .as_ref()
            .filter(|r| slot.slow && now.saturating_duration_since(r.at) <= self.tuning.max_age)
            .cloned()
    }

    /// Reads `kind`'s figures now, keeps them, and settles whether the kind
    /// is slow.
    async fn read(&self, kind: Kind) -> Result<Read, StoreError> {
        let at = Instant::now();
        let figures = self.store.queue_figures(None, kind.detail()).await?;
        let read = Read {
            at,
            cost: at.elapsed(),
            figures: Arc::new(figures),
        };
        self.settle(kind, Some(read.clone()), at, read.cost).await?;
        Ok(read)
    }

    /// Settles whether `kind` is slow after a read that began `at` and took
    /// `cost`, keeping `read` (when the read was of every queue) as the
    /// latest.
    async fn settle(
        &self,
        kind: Kind,
        read: Option<Read>,
        at: Instant,
        cost: Duration,
    ) -> Result<(), StoreError> {
        // Only a read that is not quick asks how big the table is: a quick
        // one is quick whatever its size.
        let quick = cost <= self.tuning.slow / 2;
        let big = !quick && self.store.jobs_table_rows().await? >= self.tuning.big_table;
        let turned_slow = {
            let mut slots = self.slots();
            let slot = &mut slots[kind.index()];
            // A read that started before the one kept is older: keep the newer.
            if let Some(read) = read
                && slot.last.as_ref().is_none_or(|r| r.at <= at)
            {
                slot.last = Some(read);
            }
            let was = slot.slow;
            if cost > self.tuning.slow && big {
                slot.slow = true;
                slot.quick = 0;
            } else if !quick && !big {
                // A small table: read for each request at once.
                slot.slow = false;
            } else if !quick {
                // Neither slow nor quick: the quick run starts again.
                slot.quick = 0;
            } else if slot.slow {
                if slot.quick == 0 {
                    slot.quick_since = Some(at);
                }
                slot.quick += 1;
                let settled = slot
                    .quick_since
                    .is_some_and(|since| at.saturating_duration_since(since) >= self.tuning.settle);
                slot.slow = slot.quick < QUICK_IN_A_ROW || !settled;
            }
            slot.slow && !was
        };
        let slow = self.slots()[kind.index()].slow;
        if turned_slow {
            tracing::debug!(
                ?kind,
                cost_ms = cost.as_millis() as u64,
                "queue figures are slow to read: reading them in the background"
            );
        }
        // Also when it was slow already: the loop may have gone idle since.
        if slow {
            self.wanted.notify_one();
        }
        Ok(())
    }

    /// The kinds the loop should read now: slow, and asked for lately.
    fn due(&self, now: Instant) -> Vec<Kind> {
        let slots = self.slots();
        [Kind::Scrape, Kind::Page]
            .into_iter()
            .filter(|k| {
                let slot = &slots[k.index()];
                slot.slow
                    && slot
                        .asked_at
                        .is_some_and(|t| now.saturating_duration_since(t) < self.tuning.idle)
            })
            .collect()
    }

    /// Reads the slow kinds' figures until `shutdown`, every
    /// [`Tuning::refresh`] or twenty times a read's cost if longer.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let due = self.due(Instant::now());
            let mut pause = self.tuning.refresh;
            for kind in &due {
                match self.read(*kind).await {
                    Ok(read) => pause = pause.max(read.cost * 20),
                    Err(e) => tracing::warn!(error = %e, ?kind, "cannot read queue figures"),
                }
            }
            // At most max_age between reads, or the requests read themselves.
            let pause = pause.min(self.tuning.max_age / 2);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause), if !due.is_empty() => {}
                () = self.wanted.notified(), if due.is_empty() => {}
            }
        }
    }
}
