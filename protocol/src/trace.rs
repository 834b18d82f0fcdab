//! W3C Trace Context: the `traceparent` a producer sends with an enqueue,
//! stored with the job and handed to its worker on every lease, so the
//! worker's span joins the producer's trace.
//!
//! The form is `VERSION-TRACE_ID-PARENT_ID-FLAGS`, lowercase hex:
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`. A value that
//! does not parse is ignored, as the W3C recommendation asks of a receiver
//! (the job simply has no trace context); it is never an error.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The HTTP header (and JSON field) name.
pub const TRACEPARENT: &str = "traceparent";

/// A valid `traceparent`, kept in its version-00 form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct TraceParent(String);

/// Why a `traceparent` was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTraceParent(pub &'static str);

impl fmt::Display for InvalidTraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid traceparent: {}", self.0)
    }
}

impl std::error::Error for InvalidTraceParent {}

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceParent {
    /// Parses a header value. Version `00` must be exactly 55 characters;
    /// a later version may carry more after a `-`, which is dropped (the
    /// value is handed on as version 00, the one this side understands).
    /// Version `ff`, all-zero ids and uppercase hex are refused.
    pub fn parse(value: &str) -> Result<Self, InvalidTraceParent> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        // ASCII before slicing: the slices below must fall on char boundaries.
        if !value.is_ascii() {
            return Err(InvalidTraceParent("not ASCII"));
        }
        if bytes.len() < 55 {
            return Err(InvalidTraceParent("shorter than 55 characters"));
        }
        let (version, trace_id, parent_id, flags) =
            (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(InvalidTraceParent("fields are not separated by '-'"));
        }
        if !(lower_hex(version) && lower_hex(trace_id) && lower_hex(parent_id) && lower_hex(flags)) {
            return Err(InvalidTraceParent("fields must be lowercase hex"));
        }
        if version == "ff" {
            return Err(InvalidTraceParent("version ff is invalid"));
        }
        if version == "00" && bytes.len() != 55 {
            return Err(InvalidTraceParent("version 00 is exactly 55 characters"));
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return Err(InvalidTraceParent("unexpected text after the flags"));
        }
        if trace_id.bytes().all(|b| b == b'0') {
            return Err(InvalidTraceParent("trace-id is all zeros"));
        }
        if parent_id.bytes().all(|b| b == b'0') {
            return Err(InvalidTraceParent("parent-id is all zeros"));
        }
        Ok(Self(format!("00-{trace_id}-{parent_id}-{flags}")))
    }

    /// The whole value, as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The id of the producer's span this job was enqueued under: 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        &self.0[36..52]
    }

    /// Whether the producer sampled its trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.0[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TraceParent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TraceParent::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.as_str(), GOOD);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert!(!TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap().sampled());
    }

    #[test]
    fn refuses_what_w3c_calls_invalid() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn later_versions_are_handed_on_as_version_00() {
        let t = TraceParent::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        )
        .unwrap();
        assert_eq!(t.as_str(), GOOD);
    }

    #[test]
    fn json_round_trip_validates() {
        let t: TraceParent = serde_json::from_str(&format!("\"{GOOD}\"")).unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{GOOD}\""));
        assert!(serde_json::from_str::<TraceParent>("\"nope\"").is_err());
    }
}
