//! HTTP/1.1 requests as the coordinator's own server reads them
//! (`http::h1`): the head parser and the chunked body decoder, over the
//! input as the bytes a connection sends.
//!
//! Invariants: nothing panics; a head that parses is taken off the front
//! of the input, and parses the same from its own bytes alone; its framing
//! agrees with its fields (a length is the value of every `Content-Length`
//! element and comes without `Transfer-Encoding`; chunked is a lone
//! `chunked` coding and comes without `Content-Length`; no body means
//! neither, or a length of 0; no empty element in either); the chunked decoder, given what follows the
//! head in two pieces split anywhere, comes to the same body and outcome as
//! given it whole, and never holds more than its cap.
#![no_main]

use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use runlease_coordinator::http::h1::{Chunked, Framing, Head, Step, parse_head};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let Ok(Some(head)) = parse_head(&mut buf) else {
        return;
    };
    let used = data.len() - buf.len();
    assert!(used > 0);
    let mut own = BytesMut::from(&data[..used]);
    let again = parse_head(&mut own)
        .expect("a head parses from its own bytes")
        .expect("whole");
    assert!(own.is_empty());
    assert_eq!(again.framing, head.framing);
    assert_eq!(again.keep_alive, head.keep_alive);
    assert_eq!(again.request.uri(), head.request.uri());
    assert_eq!(again.request.headers(), head.request.headers());
    framing_agrees(&head);
    if head.framing == Framing::Chunked {
        let rest = &data[used..];
        let cap = 1 + usize::from(rest.first().copied().unwrap_or(0)) * 16;
        let whole = decode(&[rest], cap);
        let split = usize::from(rest.last().copied().unwrap_or(0)) % (rest.len() + 1);
        let (a, b) = rest.split_at(split);
        assert_eq!(decode(&[a, b], cap), whole, "split at {split}");
        assert!(whole.1.len() <= cap);
    }
});

fn framing_agrees(head: &Head) {
    let fields = head.request.headers();
    let elements = |name| {
        fields
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>()
    };
    let lengths = elements(CONTENT_LENGTH);
    let codings = elements(TRANSFER_ENCODING);
    // An empty element (`Content-Length:` with no value) is refused.
    assert!(lengths.iter().chain(&codings).all(|e| !e.is_empty()), "{lengths:?} {codings:?}");
    match head.framing {
        Framing::Length(n) => {
            assert!(n > 0 && codings.is_empty());
            let is_n = |l: &Vec<u8>| {
                l.iter().all(u8::is_ascii_digit) && String::from_utf8_lossy(l).parse::<u64>() == Ok(n)
            };
            assert!(lengths.iter().all(is_n), "{lengths:?} {n}");
        }
        Framing::Chunked => {
            assert!(lengths.is_empty() && fields.get(CONTENT_LENGTH).is_none());
            assert_eq!(codings.len(), 1);
            assert!(codings[0].eq_ignore_ascii_case(b"chunked"));
        }
        Framing::Empty => {
            assert!(fields.get(TRANSFER_ENCODING).is_none());
            assert!(lengths.iter().all(|l| l.iter().all(|d| *d == b'0')), "{lengths:?}");
        }
    }
}

/// The decoder's outcome and body, fed `pieces` one after the other.
fn decode(pieces: &[&[u8]], cap: usize) -> (Result<Step, &'static str>, Vec<u8>) {
    let mut decoder = Chunked::default();
    let mut input = BytesMut::new();
    let mut out = BytesMut::new();
    let mut last = Ok(Step::More);
    for piece in pieces {
        input.extend_from_slice(piece);
        last = decoder.decode(&mut input, &mut out, cap);
        if last != Ok(Step::More) {
            break;
        }
    }
    (last, out.to_vec())
}
