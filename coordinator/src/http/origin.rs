//! Open mode's guard against web pages. With no API keys every caller is an
//! admin, and the coordinator listens on loopback only; but a browser on the
//! same machine is also on loopback. A page the developer visits could post
//! to `http://127.0.0.1:8080/v1/...` (a `text/plain` POST needs no CORS
//! preflight) or, through DNS rebinding, read answers under its own host
//! name. So in open mode a request is refused (403) when it names a `Host`
//! that is not a loopback address or `localhost`, carries an `Origin` other
//! than the coordinator's own, or says `Sec-Fetch-Site: cross-site`. Tools
//! that are not browsers (curl, the client crate, workers) send none of
//! these headers or only a loopback `Host`, and keep working.

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::http::header::{HOST, ORIGIN};
use axum::response::{IntoResponse, Response};
use runlease_protocol::ErrorCode;

use crate::http::AppState;
use crate::http::error::ApiError;
use crate::metrics::RefusedLabels;

/// The answer refusing a browser-driven request in open mode, or `None`:
/// always when API keys are configured (a page cannot send a bearer key it
/// does not know). Called by the request middleware (`observe`).
pub fn refusal(state: &AppState, request: &Request) -> Option<Response> {
    if !state.keys.is_empty() {
        return None;
    }
    let authority = request.uri().authority().map(|a| a.as_str());
    let (limit, message) = check(request.headers(), authority).err()?;
    state
        .metrics
        .requests_refused
        .get_or_create(&RefusedLabels { limit })
        .inc();
    tracing::warn!(limit, "refused a request in open mode: {message}");
    Some(ApiError::new(ErrorCode::Forbidden, message).into_response())
}

/// Why a request may not be served in open mode: the refusal's label and
/// message. `authority` is the request target's (HTTP/2's `:authority`).
pub fn check(headers: &HeaderMap, authority: Option<&str>) -> Result<(), (&'static str, String)> {
    let host = match headers.get(HOST) {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ("host", "the Host header is not ASCII".to_owned()))?,
        ),
        None => authority,
    };
    if let Some(host) = host
        && !is_loopback_authority(host)
    {
        return Err((
            "host",
            format!(
                "Host {host:?} is not a loopback address or localhost; with no RUNLEASE_API_KEYS the coordinator answers only requests addressed to loopback (set RUNLEASE_API_KEYS to serve other names)"
            ),
        ));
    }
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
    {
        return Err((
            "cross_origin",
            "a cross-site request from a web page; with no RUNLEASE_API_KEYS only the coordinator's own pages may call it".to_owned(),
        ));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let same = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")))
            .is_some_and(|o| host.is_some_and(|h| o.eq_ignore_ascii_case(h)));
        if !same {
            return Err((
                "cross_origin",
                "the request's Origin is not this coordinator; with no RUNLEASE_API_KEYS only the coordinator's own pages may call it".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Whether `host[:port]` names a loopback address or `localhost`.
fn is_loopback_authority(authority: &str) -> bool {
    if let Some(rest) = authority.strip_prefix('[') {
        // [v6]:port; a trailing dot is a name's (`localhost.`), never an
        // IP literal's.
        return match rest.split_once(']') {
            Some((v6, tail)) if tail.is_empty() || is_port(tail.strip_prefix(':')) => {
                v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
            }
            _ => false,
        };
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if is_port(Some(port)) => host,
        Some(_) => return false,
        None => authority,
    };
    // Unbracketed, a host is a name or an IPv4 literal: `::1:1` is no
    // `[::1]:1`.
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(port: Option<&str>) -> bool {
    port.is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn loopback_hosts_pass_and_others_are_refused() {
        for host in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:80",
            "[::1]:8080",
            "[::1]",
            "127.3.4.5",
            "localhost.",
        ] {
            assert_eq!(check(&headers(&[("host", host)]), None), Ok(()), "{host}");
        }
        for host in [
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "[::2]:80",
            "127.0.0.1:8080:9",
            "[::1]x",
            "0.0.0.0:8080",
            // Found by the fuzz target request_head: a trailing dot is a
            // name's (`localhost.`), never part of an IP literal.
            "[::1.]:8080",
            // Found by request_head too: an IPv6 literal is bracketed, so
            // this is no `[::1]:1` (and `::1:1` is not loopback).
            "::1:1",
            "::1",
        ] {
            assert_eq!(
                check(&headers(&[("host", host)]), None).map_err(|e| e.0),
                Err("host"),
                "{host}"
            );
        }
        // HTTP/2 names its authority in the request target.
        assert_eq!(
            check(&HeaderMap::new(), Some("rebound.example:8080")).map_err(|e| e.0),
            Err("host")
        );
        assert_eq!(check(&HeaderMap::new(), None), Ok(()));
    }

    #[test]
    fn only_the_coordinator_s_own_origin_passes() {
        let own = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]);
        assert_eq!(check(&own, None), Ok(()));
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:3000",
            "http://localhost:8080",
        ] {
            let h = headers(&[("host", "127.0.0.1:8080"), ("origin", origin)]);
            assert_eq!(check(&h, None).map_err(|e| e.0), Err("cross_origin"), "{origin}");
        }
        let cross = headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(check(&cross, None).map_err(|e| e.0), Err("cross_origin"));
        let same = headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-origin")]);
        assert_eq!(check(&same, None), Ok(()));
    }
}
