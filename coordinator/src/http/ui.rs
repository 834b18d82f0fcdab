//! The web dashboard: `GET /ui` and the files under it, built into the
//! binary from `coordinator/ui/` (hand-written HTML, CSS and ES modules, no
//! build step; see docs/adr/015-dashboard-without-a-build-step.md). The
//! files need no key: the page asks for one and calls the JSON API with it.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use runlease_protocol::ErrorCode;
use sha2::{Digest, Sha256};

use crate::http::error::ApiError;

/// The page may load only what the coordinator serves, and run no inline
/// script or style: a value injected into the page cannot become code.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One built-in file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// The [`Asset`] of `coordinator/ui/<name>`.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("../../ui/", $name)),
        }
    };
}

/// Every file of the dashboard; `index.html` is also `GET /ui`.
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("style.css", CSS),
    asset!("app.js", JAVASCRIPT),
    asset!("api.js", JAVASCRIPT),
    asset!("dom.js", JAVASCRIPT),
    asset!("views.js", JAVASCRIPT),
    asset!("format.js", JAVASCRIPT),
    asset!("links.js", JAVASCRIPT),
    asset!("icon.svg", SVG),
];

/// Strong entity tags of the assets, computed once: a browser revalidates
/// each file (`no-cache`) and gets 304 until a new binary changes it.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body);
                let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })
}

fn serve(index: usize, request_headers: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    let fresh = request_headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type))],
            asset.body,
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, v);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// `GET /ui`: the dashboard's page.
pub async fn page(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

/// `GET /ui/{asset}`: one of its files; `/ui/` is the page too.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let name = if name.is_empty() {
        "index.html"
    } else {
        name.as_str()
    };
    ASSETS
        .iter()
        .position(|a| a.name == name)
        .map(|i| serve(i, &headers))
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no such dashboard file; open /ui"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_names_is_built_in() {
        let page = std::str::from_utf8(ASSETS[0].body).unwrap();
        for reference in page.split(['"', '\'']).filter(|s| s.starts_with("/ui/")) {
            let name = &reference["/ui/".len()..];
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "{reference} is not built in"
            );
        }
        for script in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            let text = std::str::from_utf8(script.body).unwrap();
            for module in text.split('"').filter(|s| s.starts_with("./")) {
                let name = &module[2..];
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{} imports {module}, not built in",
                    script.name
                );
            }
        }
    }
}
