//! The table of answers: what an endpoint's answer (or its absence) does
//! to the job. Pure: the dispatcher reads the answer, this decides.

use std::time::Duration;

use runlease_protocol::limits::storable_json;
use serde_json::Value;

use crate::store::leases::Outcome;

/// The most of an answer's body read.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// The most of an error answer's body kept in the job's error.
pub const ERROR_BODY_BYTES: usize = 1024;
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What came back from one request.
#[derive(Debug)]
pub enum Reply {
    /// An answer: its status, the headers that matter and the body read
    /// (at most [`MAX_ANSWER_BYTES`]; `truncated` when there was more).
    Answered {
        /// HTTP status.
        status: u16,
        /// `runlease-no-retry: true`.
        no_retry: bool,
        /// `Retry-After`, in seconds, capped at [`MAX_RETRY_AFTER`].
        retry_after: Option<Duration>,
        /// The body read.
        body: Vec<u8>,
        /// More body than was read.
        truncated: bool,
    },
    /// No answer within the endpoint's `timeout_ms`.
    TimedOut {
        /// The timeout, ms.
        timeout_ms: i64,
    },
    /// No connection: refused, reset before an answer, DNS, TLS, or an
    /// address the guard refused.
    NoConnection {
        /// What went wrong.
        error: String,
    },
}

/// How the request ended, as the metric `outcome` label and logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ended {
    /// 2xx other than 202: completed.
    Completed,
    /// 202: the function holds the lease now.
    HandedOff,
    /// 429 or 503: released, the endpoint backed off.
    Busy,
    /// 4xx/5xx with `runlease-no-retry: true`: failed for good.
    FailedNoRetry,
    /// Any other 4xx/5xx (or an answer that cannot be a result): failed.
    Failed,
    /// No answer in time: failed, retryable.
    TimedOut,
    /// No connection: released, the endpoint backed off.
    NoConnection,
    /// Cancelled while open: the request was aborted.
    Cancelled,
    /// The lease was lost while the request was open: the answer was refused.
    LeaseLost,
}

impl Ended {
    /// The `outcome` label of `runlease_endpoint_requests_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Completed => "completed",
            Ended::HandedOff => "handed_off",
            Ended::Busy => "busy",
            Ended::FailedNoRetry => "failed_no_retry",
            Ended::Failed => "failed",
            Ended::TimedOut => "timed_out",
            Ended::NoConnection => "no_connection",
            Ended::Cancelled => "cancelled",
            Ended::LeaseLost => "lease_lost",
        }
    }
}

/// What to do with the lease after a reply.
#[derive(Debug)]
pub struct Decision {
    /// How the request ended.
    pub ended: Ended,
    /// The outcome to write with the lease's guard (`None`: a hand-off,
    /// the function finishes it).
    pub outcome: Option<Outcome>,
    /// Whether the endpoint is backed off, and for how long at least (its
    /// `Retry-After`), when it said.
    pub back_off: Option<Option<Duration>>,
}

/// The job's error for an answer: the status and the first 1 kB of the body.
fn error_of(status: u16, body: &[u8]) -> String {
    let mut cut = body.len().min(ERROR_BODY_BYTES);
    let text = loop {
        match std::str::from_utf8(&body[..cut]) {
            Ok(t) => break t.to_owned(),
            // A character cut in two at the end: one byte less.
            Err(e) if e.valid_up_to() > 0 && cut > e.valid_up_to() && cut - e.valid_up_to() < 4 => {
                cut = e.valid_up_to();
            }
            Err(_) => break String::from_utf8_lossy(&body[..cut]).into_owned(),
        }
    };
    let text = text.replace('\0', "");
    if text.trim().is_empty() {
        format!("endpoint answered {status}")
    } else {
        format!("endpoint answered {status}: {}", text.trim())
    }
}

/// The result of a 2xx answer: its JSON body, `null` when empty, the body
/// as a JSON string when it is not JSON; `Err` when it cannot be stored.
fn result_of(body: &[u8], truncated: bool) -> Result<Value, String> {
    if truncated {
        return Err(format!(
            "endpoint answered more than {MAX_ANSWER_BYTES} bytes: a result must be smaller"
        ));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let value = serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
    if storable_json(&value) {
        Ok(value)
    } else {
        Err("endpoint answered a result with a NUL character (\\u0000), which cannot be stored".into())
    }
}

fn fail(ended: Ended, error: String, retryable: bool) -> Decision {
    Decision {
        ended,
        outcome: Some(Outcome::Fail {
            error,
            retryable,
            retry_after_ms: None,
        }),
        back_off: None,
    }
}

/// Decides what `reply` does; `release_delay` is how long a job released
/// for an endpoint that cannot take it waits (its backoff) when the
/// endpoint named no `Retry-After`.
pub fn decide(reply: Reply, release_delay: Duration) -> Decision {
    let release = |ended, after: Option<Duration>| Decision {
        ended,
        outcome: Some(Outcome::Release {
            progress: None,
            delay_ms: Some(after.unwrap_or(release_delay).as_millis() as i64),
        }),
        back_off: Some(after),
    };
    match reply {
        Reply::TimedOut { timeout_ms } => fail(
            Ended::TimedOut,
            format!("endpoint timed out after {timeout_ms} ms"),
            true,
        ),
        Reply::NoConnection { .. } => release(Ended::NoConnection, None),
        Reply::Answered { status: 202, .. } => Decision {
            ended: Ended::HandedOff,
            outcome: None,
            back_off: None,
        },
        Reply::Answered {
            status: 200..=299,
            body,
            truncated,
            ..
        } => match result_of(&body, truncated) {
            Ok(result) => Decision {
                ended: Ended::Completed,
                outcome: Some(Outcome::Complete { result }),
                back_off: None,
            },
            Err(error) => fail(Ended::Failed, error, false),
        },
        Reply::Answered {
            status: 429 | 503,
            retry_after,
            no_retry: false,
            ..
        } => release(Ended::Busy, retry_after),
        Reply::Answered {
            status,
            no_retry,
            body,
            ..
        } => {
            let error = error_of(status, &body);
            if no_retry {
                fail(Ended::FailedNoRetry, error, false)
            } else {
                fail(Ended::Failed, error, true)
            }
        }
    }
}

/// A `Retry-After` value: seconds, or an HTTP date; capped at
/// [`MAX_RETRY_AFTER`].
pub fn parse_retry_after(raw: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let raw = raw.trim();
    let after = match raw.parse::<u64>() {
        Ok(s) => Duration::from_secs(s),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(raw).ok()?;
            (at.with_timezone(&chrono::Utc) - now)
                .to_std()
                .unwrap_or(Duration::ZERO)
        }
    };
    Some(after.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answered(status: u16, body: &str) -> Reply {
        Reply::Answered {
            status,
            no_retry: false,
            retry_after: None,
            body: body.as_bytes().to_vec(),
            truncated: false,
        }
    }

    const BACKOFF: Duration = Duration::from_secs(1);

    #[test]
    fn every_row_of_the_table() {
        let d = decide(answered(200, r#"{"ok": 1}"#), BACKOFF);
        assert!(matches!(d.outcome, Some(Outcome::Complete { ref result }) if *result == json!({"ok": 1})));
        let d = decide(answered(204, ""), BACKOFF);
        assert!(matches!(
            d.outcome,
            Some(Outcome::Complete { result: Value::Null })
        ));
        let d = decide(answered(200, "plain words"), BACKOFF);
        assert!(
            matches!(d.outcome, Some(Outcome::Complete { ref result }) if *result == json!("plain words"))
        );
        let d = decide(answered(202, ""), BACKOFF);
        assert_eq!((d.ended, d.outcome.is_none()), (Ended::HandedOff, true));
        let d = decide(
            Reply::Answered {
                status: 429,
                no_retry: false,
                retry_after: Some(Duration::from_secs(7)),
                body: vec![],
                truncated: false,
            },
            BACKOFF,
        );
        assert!(matches!(
            d.outcome,
            Some(Outcome::Release {
                delay_ms: Some(7000),
                ..
            })
        ));
        assert_eq!(d.back_off, Some(Some(Duration::from_secs(7))));
        let d = decide(answered(503, ""), BACKOFF);
        assert!(matches!(
            d.outcome,
            Some(Outcome::Release {
                delay_ms: Some(1000),
                ..
            })
        ));
        let d = decide(
            Reply::Answered {
                status: 400,
                no_retry: true,
                retry_after: None,
                body: b"bad".to_vec(),
                truncated: false,
            },
            BACKOFF,
        );
        assert!(
            matches!(d.outcome, Some(Outcome::Fail { retryable: false, ref error, .. }) if error == "endpoint answered 400: bad")
        );
        let d = decide(answered(500, &"x".repeat(5000)), BACKOFF);
        match d.outcome {
            Some(Outcome::Fail {
                retryable: true,
                error,
                ..
            }) => assert_eq!(error.len(), "endpoint answered 500: ".len() + 1024),
            other => panic!("{other:?}"),
        }
        let d = decide(Reply::TimedOut { timeout_ms: 1500 }, BACKOFF);
        assert!(
            matches!(d.outcome, Some(Outcome::Fail { retryable: true, ref error, .. }) if error == "endpoint timed out after 1500 ms")
        );
        let d = decide(
            Reply::NoConnection {
                error: "refused".into(),
            },
            BACKOFF,
        );
        assert_eq!(d.ended, Ended::NoConnection);
        assert_eq!(d.back_off, Some(None));
        let d = decide(
            Reply::Answered {
                status: 200,
                no_retry: false,
                retry_after: None,
                body: vec![b'1'; 10],
                truncated: true,
            },
            BACKOFF,
        );
        assert!(matches!(d.outcome, Some(Outcome::Fail { retryable: false, .. })));
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_capped() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(parse_retry_after("5", now), Some(Duration::from_secs(5)));
        assert_eq!(parse_retry_after("999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
