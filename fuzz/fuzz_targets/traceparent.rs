//! W3C `traceparent` values, from a header or a JSON field:
//! `TraceParent::parse` on any text, and the same text as a JSON string.
//!
//! Invariants: a value that parses is kept as 55 characters of version 00
//! (`00-` + 32 + `-` + 16 + `-` + 2 lowercase hex digits, no all-zero id),
//! its accessors read those fields, `sampled` is flag bit 0, parsing it again
//! gives the same value, and the JSON field accepts exactly what `parse`
//! accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runlease_protocol::TraceParent;

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = TraceParent::parse(text);
    let json = serde_json::to_string(text).expect("a string serialises");
    assert_eq!(
        serde_json::from_str::<TraceParent>(&json).ok(),
        parsed.clone().ok(),
        "the JSON field and the header parse alike: {text:?}"
    );
    let Ok(t) = parsed else {
        return;
    };
    let value = t.as_str();
    assert_eq!(value.len(), 55, "{value}");
    assert_eq!(t.to_string(), value);
    assert!(value.starts_with("00-"), "{value}");
    assert_eq!(&value[35..36], "-");
    assert_eq!(&value[52..53], "-");
    assert_eq!(t.trace_id(), &value[3..35]);
    assert_eq!(t.parent_id(), &value[36..52]);
    let flags = &value[53..55];
    assert!(
        lower_hex(t.trace_id()) && lower_hex(t.parent_id()) && lower_hex(flags),
        "{value}"
    );
    assert!(t.trace_id().bytes().any(|b| b != b'0'), "{value}");
    assert!(t.parent_id().bytes().any(|b| b != b'0'), "{value}");
    let flag_bits = u8::from_str_radix(flags, 16).expect("two hex digits");
    assert_eq!(t.sampled(), flag_bits & 1 == 1);
    assert_eq!(TraceParent::parse(value), Ok(t.clone()), "parse is stable");
    // What was sent, less surrounding blanks, holds the same fields.
    let sent = text.trim_matches([' ', '\t']);
    assert_eq!(&sent[3..55], &value[3..55]);
});
