//! An endpoint's health on this coordinator: connection failures in a
//! row, and the pause before the next request (1 s doubling to 60 s after
//! failures, by default; an endpoint's `Retry-After` when it is busy).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::endpoint::UNHEALTHY_AFTER;

#[derive(Debug, Default)]
struct State {
    failures: u32,
    paused_until: Option<Instant>,
}

/// One endpoint's health.
#[derive(Debug)]
pub(super) struct Health {
    state: Mutex<State>,
    base: Duration,
    max: Duration,
}

/// What a change of health means for the metric and the queue's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Nothing to show.
    None,
    /// Failures in a row reached [`UNHEALTHY_AFTER`].
    Unhealthy,
    /// An answer after failures.
    Recovered,
}

impl Health {
    /// Healthy, backing off from `base` up to `max`.
    pub(super) fn new(base: Duration, max: Duration) -> Self {
        Self {
            state: Mutex::default(),
            base,
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long requests still wait, if they do.
    pub(super) fn paused_for(&self) -> Option<Duration> {
        let until = self.lock().paused_until?;
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// The pause after `failures` failures in a row.
    fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.base.saturating_mul(1 << doublings).min(self.max)
    }

    /// The pause one more failure would bring.
    pub(super) fn next_backoff(&self) -> Duration {
        self.backoff(self.lock().failures + 1)
    }

    /// A connection failed: one more in a row, and a pause.
    pub(super) fn failed(&self) -> Change {
        let mut state = self.lock();
        state.failures += 1;
        let pause = self.backoff(state.failures);
        state.paused_until = Some(Instant::now() + pause);
        if state.failures == UNHEALTHY_AFTER {
            Change::Unhealthy
        } else {
            Change::None
        }
    }

    /// The endpoint answered it is busy: a pause of `after` (its
    /// `Retry-After`) or the first backoff.
    pub(super) fn busy(&self, after: Option<Duration>) {
        let pause = after.unwrap_or(self.base);
        let mut state = self.lock();
        let until = Instant::now() + pause;
        state.paused_until = Some(state.paused_until.map_or(until, |u| u.max(until)));
    }

    /// The endpoint answered: failures in a row start again.
    pub(super) fn answered(&self) -> Change {
        let mut state = self.lock();
        let was = std::mem::take(&mut state.failures);
        if was > 0 { Change::Recovered } else { Change::None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_doubling_to_the_cap_and_turns_unhealthy_at_five() {
        let h = Health::new(Duration::from_secs(1), Duration::from_secs(60));
        let pauses: Vec<u64> = (1..=8).map(|f| h.backoff(f).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60]);
        let changes: Vec<Change> = (0..6).map(|_| h.failed()).collect();
        assert_eq!(changes[4], Change::Unhealthy);
        assert!(changes.iter().filter(|c| **c == Change::Unhealthy).count() == 1);
        assert!(h.paused_for().is_some());
        assert_eq!(h.answered(), Change::Recovered);
        assert_eq!(h.answered(), Change::None);
    }
}
