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
    /// The key is missing or unknown (401 `unauthorized`).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The key lacks the role or the queue this call needs (403 `forbidden`).
    #[error("forbidden: {0}")]
    Forbidden(String),
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

    /// The protocol's error code when the coordinator answered the error
    /// (`not_found`, `conflict`, ...; `internal` for any 5xx other than
    /// `overloaded`); `None` when it arose on this side: the coordinator
    /// unreachable, an answer that does not parse, a wait that ran out, bad
    /// client settings.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::LeaseLost(_) => Some(ErrorCode::LeaseLost),
            Error::NotFound(_) => Some(ErrorCode::NotFound),
            Error::Unauthorized(_) => Some(ErrorCode::Unauthorized),
            Error::Forbidden(_) => Some(ErrorCode::Forbidden),
            Error::Conflict(_) => Some(ErrorCode::Conflict),
            Error::Invalid { code, .. } => Some(*code),
            Error::Overloaded { .. } => Some(ErrorCode::Overloaded),
            Error::Server { .. } => Some(ErrorCode::Internal),
            Error::Transport(_) | Error::Decode(_) | Error::WaitTimedOut(_) | Error::Config(_) => None,
        }
    }

    /// The coordinator's own message for an error it answered, or this
    /// side's description of the others (the text of [`Error::code`]'s
    /// error, without the prefix `Display` adds).
    pub fn message(&self) -> String {
        match self {
            Error::LeaseLost(m)
            | Error::NotFound(m)
            | Error::Unauthorized(m)
            | Error::Forbidden(m)
            | Error::Conflict(m)
            | Error::Invalid { message: m, .. }
            | Error::Overloaded { message: m, .. }
            | Error::Server { message: m, .. }
            | Error::Transport(m)
            | Error::Decode(m)
            | Error::Config(m) => m.clone(),
            Error::WaitTimedOut(_) => self.to_string(),
        }
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
