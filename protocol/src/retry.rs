//! Retry policies: how long a failed job waits before its next attempt,
//! how many attempts it gets and for how long it is retried at all, and
//! the reasons the chronology gives for each retry (or for none).
//!
//! A job's policy is its own (set at enqueue), else its queue's (queue
//! settings), else the coordinator's defaults, field by field.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_ATTEMPTS_LIMIT, MAX_BACKOFF_FACTOR, MAX_BACKOFF_MS, MAX_RETRY_WINDOW_MS};

/// The delay before the retry after the n-th failed attempt:
/// `min(max_ms, base_ms * factor^(n-1))`, of which the share `jitter` is
/// drawn at random. A field left out takes the next policy's (the queue's,
/// then the coordinator's: base 1 s, max 5 min, factor 2, jitter 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// The first delay, ms: 0..=604,800,000 (a week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<i64>,
    /// The longest delay, ms: 0..=604,800,000, at least `base_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<i64>,
    /// How much each delay grows over the one before: 1..=10 (1: constant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// The share of each delay drawn at random, 0..=1: 1 waits anywhere
    /// from 0 to the full delay (full jitter), 0 waits the delay exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

impl Backoff {
    /// Whether it sets no field.
    pub fn is_empty(&self) -> bool {
        *self == Backoff::default()
    }

    /// Checks the bounds; the error names the field and what it must be.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in [("base_ms", self.base_ms), ("max_ms", self.max_ms)] {
            if let Some(v) = value
                && !(0..=MAX_BACKOFF_MS).contains(&v)
            {
                return Err(format!("backoff.{name} must be between 0 and {MAX_BACKOFF_MS}"));
            }
        }
        if let (Some(base), Some(max)) = (self.base_ms, self.max_ms)
            && max < base
        {
            return Err("backoff.max_ms must be at least backoff.base_ms".into());
        }
        if let Some(f) = self.factor
            && !(1.0..=MAX_BACKOFF_FACTOR).contains(&f)
        {
            return Err(format!(
                "backoff.factor must be between 1 and {MAX_BACKOFF_FACTOR}"
            ));
        }
        if let Some(j) = self.jitter
            && !(0.0..=1.0).contains(&j)
        {
            return Err("backoff.jitter must be between 0 and 1".into());
        }
        Ok(())
    }
}

/// Checks `max_attempts` against its bounds.
pub fn check_max_attempts(n: i32) -> Result<(), String> {
    if (1..=MAX_ATTEMPTS_LIMIT).contains(&n) {
        Ok(())
    } else {
        Err(format!("max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}"))
    }
}

/// Checks `retry_window_ms` against its bounds.
pub fn check_retry_window(ms: i64) -> Result<(), String> {
    if (1..=MAX_RETRY_WINDOW_MS).contains(&ms) {
        Ok(())
    } else {
        Err(format!(
            "retry_window_ms must be between 1 and {MAX_RETRY_WINDOW_MS}"
        ))
    }
}

/// Why a failed or expired attempt was retried when it was, or why it
/// ended its job: the code an attempt's `retry_reason` starts with (then
/// `: ` and the numbers that decided it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// Retried after the policy's backoff.
    Backoff,
    /// Retried after the delay the worker gave (`retry_after_ms`).
    RetryAfter,
    /// The lease expired; retried at once (the expiry was the wait).
    LeaseExpired,
    /// Not retried: the next start would be past the retry window.
    RetryWindowEnded,
    /// Not retried: every attempt of the budget was used.
    AttemptsExhausted,
    /// Not retried: the worker marked the failure not retryable.
    NotRetryable,
}

impl RetryReason {
    /// Every reason.
    pub const ALL: [RetryReason; 6] = [
        RetryReason::Backoff,
        RetryReason::RetryAfter,
        RetryReason::LeaseExpired,
        RetryReason::RetryWindowEnded,
        RetryReason::AttemptsExhausted,
        RetryReason::NotRetryable,
    ];

    /// The code, as a `retry_reason` starts with it.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Backoff => "backoff",
            RetryReason::RetryAfter => "retry_after",
            RetryReason::LeaseExpired => "lease_expired",
            RetryReason::RetryWindowEnded => "retry_window_ended",
            RetryReason::AttemptsExhausted => "attempts_exhausted",
            RetryReason::NotRetryable => "not_retryable",
        }
    }

    /// The reason a `retry_reason` text gives (its code, before the colon).
    pub fn of(text: &str) -> Option<RetryReason> {
        let code = text.split(':').next()?;
        RetryReason::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// Whether the job was queued again.
    pub fn retried(self) -> bool {
        matches!(
            self,
            RetryReason::Backoff | RetryReason::RetryAfter | RetryReason::LeaseExpired
        )
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_is_checked_field_by_field() {
        assert!(Backoff::default().check().is_ok());
        let ok = Backoff {
            base_ms: Some(100),
            max_ms: Some(100),
            factor: Some(1.0),
            jitter: Some(0.0),
        };
        assert!(ok.check().is_ok());
        let bad = |b: Backoff| b.check().unwrap_err();
        assert!(
            bad(Backoff {
                base_ms: Some(-1),
                ..ok
            })
            .contains("base_ms")
        );
        assert!(
            bad(Backoff {
                max_ms: Some(50),
                ..ok
            })
            .contains("at least")
        );
        assert!(
            bad(Backoff {
                factor: Some(0.5),
                ..ok
            })
            .contains("factor")
        );
        assert!(
            bad(Backoff {
                factor: Some(f64::NAN),
                ..ok
            })
            .contains("factor")
        );
        assert!(
            bad(Backoff {
                jitter: Some(1.5),
                ..ok
            })
            .contains("jitter")
        );
        assert!(serde_json::from_str::<Backoff>(r#"{"base": 1}"#).is_err());
    }

    #[test]
    fn reasons_are_read_from_their_code() {
        for r in RetryReason::ALL {
            assert_eq!(RetryReason::of(&format!("{r}: 12 ms")), Some(r));
        }
        assert_eq!(RetryReason::of("lease expired"), None);
    }
}
