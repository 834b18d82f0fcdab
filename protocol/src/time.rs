//! Instants on the wire: RFC 3339 in UTC with a `Z`, and the fraction of a
//! second as chrono writes it (none, or 3, 6 or 9 digits), exactly what
//! chrono's own `Serialize` writes. The job answer writes each instant as
//! one finished string: chrono's `Serialize` hands serde_json a `Display`
//! that is escaped one character at a time, the slowest part of answering a
//! batch enqueue of 1,000 jobs.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// Serializes an instant (`#[serde(serialize_with = "crate::time::instant")]`).
pub(crate) fn instant<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// [`instant`] for an instant that may be absent (`null`).
pub(crate) fn maybe_instant<S: Serializer>(at: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => instant(at, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    struct Ours(#[serde(serialize_with = "instant")] DateTime<Utc>);

    #[derive(Serialize)]
    struct Maybe(#[serde(serialize_with = "maybe_instant")] Option<DateTime<Utc>>);

    #[test]
    fn an_instant_is_written_as_chrono_writes_it() {
        let second = Utc.with_ymd_and_hms(2026, 12, 5, 22, 57, 47).unwrap();
        for nanos in [0, 602_000_000, 602_077_000, 602_077_123, 1_000, 7] {
            let at = second + chrono::Duration::nanoseconds(nanos);
            assert_eq!(
                serde_json::to_string(&Ours(at)).unwrap(),
                serde_json::to_string(&at).unwrap(),
                "{nanos} ns past the second"
            );
        }
        assert_eq!(serde_json::to_string(&Maybe(None)).unwrap(), "null");
        assert_eq!(
            serde_json::to_string(&Maybe(Some(second))).unwrap(),
            "\"2026-12-05T22:57:47Z\""
        );
    }
}
