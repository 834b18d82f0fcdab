//! The HTTP client of endpoints: one connection pool for every endpoint,
//! no proxies, no redirects, the guard's name lookup, at most
//! [`MAX_ANSWER_BYTES`] of an answer read, and each request bounded by its
//! endpoint's `timeout_ms`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::endpoint::answer::{MAX_ANSWER_BYTES, Reply, parse_retry_after};
use crate::endpoint::guard::{AllowList, GuardedResolver};

/// One signed request to send.
#[derive(Debug)]
pub struct Request<'a> {
    /// Where.
    pub url: &'a str,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`, `traceparent`.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body.
    pub body: Vec<u8>,
    /// The endpoint's `timeout_ms`.
    pub timeout: Duration,
}

/// The endpoint client.
#[derive(Clone)]
pub struct EndpointClient {
    http: reqwest::Client,
    allow: Arc<AllowList>,
}

/// An error and its causes, one line (reqwest's own message names only
/// the outermost).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl EndpointClient {
    /// A client that lets endpoints reach internal addresses only for the
    /// hosts `allow` lists.
    pub fn new(allow: Arc<AllowList>) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .tls_backend_native()
            .user_agent(concat!("runlease/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(GuardedResolver { allow: allow.clone() })
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot build the endpoint HTTP client: {}", describe(&e)))?;
        Ok(Self { http, allow })
    }

    /// Sends `req` and reads what comes back.
    pub async fn send(&self, req: Request<'_>) -> Reply {
        let timeout_ms = req.timeout.as_millis() as i64;
        match tokio::time::timeout(req.timeout, self.exchange(req)).await {
            Ok(reply) => reply,
            Err(_) => Reply::TimedOut { timeout_ms },
        }
    }

    async fn exchange(&self, req: Request<'_>) -> Reply {
        let url = match reqwest::Url::parse(req.url) {
            Ok(url) => url,
            Err(e) => {
                return Reply::NoConnection {
                    error: format!("endpoint.url: {e}"),
                };
            }
        };
        // An address written out is connected to without a lookup: checked here.
        if let Err(error) = self.allow.check_literal(&url) {
            return Reply::NoConnection { error };
        }
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        for (name, value) in req.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        let sent = self.http.post(url).headers(headers).body(req.body).send().await;
        let mut answer = match sent {
            Ok(answer) => answer,
            Err(e) => return Reply::NoConnection { error: describe(&e) },
        };
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let no_retry = header("runlease-no-retry").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let retry_after = header("retry-after").and_then(|v| parse_retry_after(&v, chrono::Utc::now()));
        let status = answer.status().as_u16();
        let mut body = Vec::new();
        let mut truncated = false;
        loop {
            match answer.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_ANSWER_BYTES - body.len();
                    if chunk.len() > room {
                        body.extend_from_slice(&chunk[..room]);
                        truncated = true;
                        break;
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    return Reply::NoConnection {
                        error: format!("the answer was cut off: {}", describe(&e)),
                    };
                }
            }
        }
        Reply::Answered {
            status,
            no_retry,
            retry_after,
            body,
            truncated,
        }
    }
}
