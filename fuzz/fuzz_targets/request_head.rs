//! What a request's head carries before any key is checked: its method
//! (the metric label of `http::method_label`), its `Host`, `Origin` and
//! `Sec-Fetch-Site` (open mode's guard, `http::origin::check`) and its
//! `traceparent` (`http::extract::TraceContext::from_headers`).
//!
//! Input: the method on the first line, then `name: value` header lines; a
//! line `:authority VALUE` gives the request target's authority (HTTP/2).
//! Lines that are no valid header are skipped, as hyper would refuse them.
//!
//! Invariants: a method's label is one of a fixed set, its own name for a
//! standard method; open mode admits a request only when the host it names
//! is `localhost` or a loopback address (judged by the `http` and `url`
//! crates' parsers, not the guard's), its `Origin` (if any) is that same
//! host, and it is not `cross-site`; the trace context is the one
//! `traceparent` header's value when it parses, and none otherwise.
#![no_main]

use http::header::{HOST, ORIGIN};
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use runlease_coordinator::http::extract::TraceContext;
use runlease_coordinator::http::{method_label, origin};
use runlease_protocol::TraceParent;

const LABELS: [&str; 10] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT", "other",
];

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&b| b == b'\n');
    if let Ok(method) = Method::from_bytes(lines.next().unwrap_or_default()) {
        let label = method_label(&method);
        assert!(LABELS.contains(&label), "{label}");
        if label != "other" {
            assert_eq!(label, method.as_str());
        }
    }
    let mut headers = HeaderMap::new();
    let mut authority = None;
    for line in lines {
        if let Some(value) = line.strip_prefix(b":authority ") {
            authority = std::str::from_utf8(value).ok();
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }

    if origin::check(&headers, authority).is_ok() {
        let host = match headers.get(HOST) {
            Some(value) => Some(value.to_str().expect("an admitted Host is ASCII")),
            None => authority,
        };
        if let Some(host) = host {
            assert!(is_loopback(host), "open mode admitted Host {host:?}");
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin
                .to_str()
                .expect("an admitted Origin is ASCII")
                .to_ascii_lowercase();
            let host = host
                .expect("an Origin is admitted only with a host")
                .to_ascii_lowercase();
            assert!(
                origin == format!("http://{host}") || origin == format!("https://{host}"),
                "open mode admitted Origin {origin:?} for Host {host:?}"
            );
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            assert!(!site.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        }
    }

    let values: Vec<&HeaderValue> = headers.get_all("traceparent").iter().collect();
    let expected = match values.as_slice() {
        [one] => one.to_str().ok().and_then(|v| TraceParent::parse(v).ok()),
        _ => None,
    };
    assert_eq!(TraceContext::from_headers(&headers), expected);
});

/// Whether `authority` names this machine, read by other parsers than the
/// guard's: `http`'s authority (host and port), then `url`'s host.
fn is_loopback(authority: &str) -> bool {
    let Ok(parsed) = authority.parse::<Authority>() else {
        return false;
    };
    if authority.contains('@') {
        return false;
    }
    match url::Host::parse(parsed.host()) {
        Ok(url::Host::Domain(name)) => name.strip_suffix('.').unwrap_or(&name) == "localhost",
        Ok(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Ok(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Err(_) => false,
    }
}
