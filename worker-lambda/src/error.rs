//! The adapter's errors: one variant per thing a caller (or Lambda's error
//! report) branches on.

use lambda_runtime::Diagnostic;

/// What made an invocation fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The worker could not be built (no handler registered, say).
    #[error("cannot build the worker: {0}")]
    Worker(#[from] runlease_client::Error),
    /// A sweep (scheduled or direct) never got an answer from the coordinator.
    /// SQS wake-ups are not failed this way: they are named in the partial
    /// batch response instead.
    #[error(
        "the coordinator could not be reached ({claims_failed} claims failed, none answered); check RUNLEASE_URL, the key and the network path from the function"
    )]
    Unreachable {
        /// Claims that failed.
        claims_failed: u64,
    },
    /// Not one claim was sent: the invocation had less time left than the
    /// release margin (plus half a second to claim in).
    #[error(
        "the invocation had no time to claim: raise the function timeout well above the release margin of {margin_ms} ms"
    )]
    TooLittleTime {
        /// The release margin.
        margin_ms: u64,
    },
    /// Bad settings of the example function (`RUNLEASE_*` variables).
    #[error("{0}")]
    Config(String),
}

impl From<Error> for Diagnostic {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Worker(_) => "Runlease.Worker",
            Error::Unreachable { .. } => "Runlease.Unreachable",
            Error::TooLittleTime { .. } => "Runlease.TooLittleTime",
            Error::Config(_) => "Runlease.Config",
        };
        Diagnostic {
            error_type: kind.to_owned(),
            error_message: e.to_string(),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
