//! Why a command failed, and how that is printed: one `runlease: ...` line on
//! standard error, or with `--json` the protocol's error body
//! `{"error": {"code", "message"}}` on one line of standard error; either way
//! with a non-zero exit status.
//!
//! An error the coordinator answered keeps its code (`not_found`,
//! `conflict`, `invalid`, ...) and its message. An error found on this side
//! gets one of the codes below, which the coordinator never sends.

use std::process::ExitCode;

use runlease_client::Error;

/// The command line does not parse: an unknown verb or flag, a missing
/// argument, a value a flag does not take.
pub const USAGE: &str = "usage";
/// An argument parsed but was refused before anything was sent: a job id
/// that is not a UUID, a payload that is not JSON, a bad queue name or URL,
/// nothing to change.
pub const INVALID_ARGUMENT: &str = "invalid_argument";
/// The coordinator could not be reached (connection refused, DNS, TLS, a
/// time-out) or the connection broke.
pub const UNREACHABLE: &str = "unreachable";
/// The coordinator answered something that is not the protocol.
pub const BAD_ANSWER: &str = "bad_answer";
/// `wait` ran out of time before the job ended (exit status 124).
pub const TIMED_OUT: &str = "timed_out";
/// A bulk action was not confirmed with `--yes`: nothing changed.
pub const NOT_CONFIRMED: &str = "not_confirmed";
/// Standard input could not be read, or standard output written.
pub const IO: &str = "io";

/// Exit status of `wait` when the wait ran out (as timeout(1) does).
pub const EXIT_TIMED_OUT: u8 = 124;

/// A command's failure: its code, its message and its exit status.
#[derive(Debug)]
pub struct Failure {
    /// The protocol's error code, or one of this module's local codes.
    pub code: String,
    /// What went wrong (for an error the coordinator answered, its own
    /// message): the `message` of the JSON form.
    pub message: String,
    /// The one-line form: the message, prefixed with the kind of error the
    /// coordinator answered ("not found: ...").
    pub line: String,
    /// Exit status (1 unless said otherwise).
    pub exit: u8,
}

impl Failure {
    /// A failure with a local `code`, exit status 1.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Failure {
            code: code.to_owned(),
            line: message.clone(),
            message,
            exit: 1,
        }
    }

    /// An argument refused before anything was sent.
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(INVALID_ARGUMENT, message)
    }

    /// `wait` ran out of time (exit status 124).
    pub fn timed_out(message: impl Into<String>) -> Self {
        Failure {
            exit: EXIT_TIMED_OUT,
            ..Failure::new(TIMED_OUT, message)
        }
    }

    /// Prints the failure on standard error (as JSON with `json`) and gives
    /// its exit status.
    pub fn report(&self, json: bool) -> ExitCode {
        if json {
            let body = serde_json::json!({
                "error": {"code": self.code, "message": self.message}
            });
            eprintln!("{body}");
        } else {
            eprintln!("runlease: {}", self.line.replace('\n', " "));
        }
        ExitCode::from(self.exit)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match (e.code(), &e) {
            (Some(code), _) => code.as_str(),
            (None, Error::Transport(_)) => UNREACHABLE,
            (None, Error::Decode(_)) => BAD_ANSWER,
            (None, Error::WaitTimedOut(_)) => TIMED_OUT,
            (None, _) => INVALID_ARGUMENT,
        };
        let message = if e.code().is_some() {
            e.message()
        } else {
            e.to_string()
        };
        Failure {
            code: code.to_owned(),
            message,
            line: e.to_string(),
            exit: if code == TIMED_OUT { EXIT_TIMED_OUT } else { 1 },
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::new(IO, e.to_string())
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Failure::new(IO, format!("cannot print the answer as JSON: {e}"))
    }
}

/// Whether `--json` is on a command line that did not parse (it is global:
/// anywhere before a `--`).
pub fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("runlease")
            .chain(line.iter().copied())
            .map(Into::into)
            .collect()
    }

    #[test]
    fn json_is_seen_anywhere_before_a_double_dash() {
        assert!(json_requested(args(&["--json", "frobnicate"])));
        assert!(json_requested(args(&["get", "--bad", "--json"])));
        assert!(!json_requested(args(&["enqueue", "q", "--", "--json"])));
        assert!(!json_requested(args(&["get", "--jsonx"])));
        assert!(
            !json_requested(vec!["--json".into()]),
            "the program's own name is not an argument"
        );
    }

    #[test]
    fn an_answered_error_keeps_its_code_and_message_and_a_local_one_gets_a_local_code() {
        let f = Failure::from(Error::Forbidden("this key may not enqueue on q".into()));
        assert_eq!(
            (f.code.as_str(), f.message.as_str(), f.line.as_str(), f.exit),
            (
                "forbidden",
                "this key may not enqueue on q",
                "forbidden: this key may not enqueue on q",
                1
            )
        );
        let f = Failure::from(Error::Server {
            status: 500,
            message: "internal error".into(),
        });
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            ("internal", "internal error")
        );
        let f = Failure::from(Error::Transport("connection refused".into()));
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            (UNREACHABLE, "cannot reach the coordinator: connection refused")
        );
        assert_eq!(Failure::from(Error::Decode("eof".into())).code, BAD_ANSWER);
        assert_eq!(
            Failure::from(Error::Config("bad URL".into())).code,
            INVALID_ARGUMENT
        );
        assert_eq!(Failure::timed_out("still queued").exit, EXIT_TIMED_OUT);
    }
}
