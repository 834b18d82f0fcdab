//! The error body every non-2xx answer carries:
//! `{"error": {"code": "...", "message": "..."}}`.

use serde::{Deserialize, Serialize};

/// Machine-readable error codes. Each maps to exactly one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body is not JSON, or the path or query cannot be parsed.
    BadRequest,
    /// 422: well-formed JSON whose fields are missing, mistyped or out of range.
    Invalid,
    /// 401: no bearer key, or an unknown one.
    Unauthorized,
    /// 403: the key's role or queue list does not allow this.
    Forbidden,
    /// 404: no such job, or no such route.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the lease is stale, foreign or forged; the caller must drop the job.
    LeaseLost,
    /// 409: the job is in a state that does not allow this.
    Conflict,
    /// 413: the body is larger than `RUNLEASE_MAX_BODY_BYTES`.
    TooLarge,
    /// 429 or 503: try again after `Retry-After` seconds.
    Overloaded,
    /// 500: a fault on the coordinator's side; details are in its log.
    Internal,
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Invalid => 422,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::LeaseLost | ErrorCode::Conflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::Overloaded => 503,
            ErrorCode::Internal => 500,
        }
    }

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::Conflict => "conflict",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Internal => "internal",
        }
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// Code and human-readable message of an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable, machine-readable code.
    pub code: ErrorCode,
    /// What happened and what to do next.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_documented() {
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::Invalid,
            ErrorCode::LeaseLost,
            ErrorCode::TooLarge,
            ErrorCode::MethodNotAllowed,
        ] {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
