//! The client's errors: one variant per thing a caller branches on.

use std::time::Duration;

use runlease_protocol::{ErrorCode, Job};

/// What went wrong talking to the coordinator.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The lease is stale, foreign or forged: drop the job, do not retry.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// No such job (or route).
    #[error("not found: {0}")]
    NotFound(String),
    /// The key is missing, unknown (401) or lacks the role or queue (403).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The job is in a state that does not allow this (409 `conflict`).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The coordinator refused the request as malformed or out of range.
    #[error("invalid request ({}): {message}", code.as_str())]
    Invalid {
        /// `bad_request`, `invalid`, `too_large` or `method_not_allowed`.
        code: ErrorCode,
        /// The coordinator's explanation.
        message: String,
    },
    /// The coordinator is saturated or its database is down; try again later.
    #[error("coordinator overloaded: {message}")]
    Overloaded {
        /// The coordinator's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
        /// The coordinator's explanation.
        message: String,
    },
    /// A 5xx other than `overloaded`: a fault on the coordinator's side.
    #[error("coordinator error (HTTP {status}): {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// The coordinator's (generic) message.
        message: String,
    },
    /// The coordinator could not be reached, or the connection broke.
    #[error("cannot reach the coordinator: {0}")]
    Transport(String),
    /// An answer that does not parse as the protocol says.
    #[error("unexpected answer from the coordinator: {0}")]
    Decode(String),
    /// `wait` ran out of time; the job as last seen.
    #[error("job {} is still {} after the wait", .0.id, .0.state)]
    WaitTimedOut(Box<Job>),
    /// Bad client settings (e.g. an invalid base URL or queue name).
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// Whether repeating the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Transport(_) | Error::Overloaded { .. } | Error::Server { .. }
        )
    }

    /// The delay the coordinator asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Overloaded { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
