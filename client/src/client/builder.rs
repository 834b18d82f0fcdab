//! [`ClientBuilder`]: the settings of a [`Client`] and the HTTP client they make.

use std::time::Duration;

use super::Client;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;

/// Settings of a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    pub(super) base_url: String,
    pub(super) key: Option<String>,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) retry: RetryPolicy,
}

impl ClientBuilder {
    /// The bearer key sent with every request.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Timeout of one request, on top of its long-poll wait.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Retry policy of safe requests.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<Client> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Config(format!(
                "coordinator URL {base:?} must start with http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            // Below the coordinator's RUNLEASE_IDLE_TIMEOUT_MS (60 s by
            // default), so the client drops an idle connection before the
            // server closes it under a request.
            .pool_idle_timeout(Duration::from_secs(45))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            key: self.key,
            timeout: self.timeout,
            retry: self.retry,
            traceparent: None,
        })
    }
}
