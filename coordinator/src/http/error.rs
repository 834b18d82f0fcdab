//! `ApiError`: every non-2xx answer, as `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use runlease_protocol::{ErrorBody, ErrorCode, ErrorDetail};

use crate::store::StoreError;

/// Seconds a client should wait before retrying an `overloaded` answer.
const RETRY_AFTER_SECS: u64 = 1;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The code (and so the status).
    pub code: ErrorCode,
    /// What happened and what to do next.
    pub message: String,
    /// Set when PostgreSQL was unavailable, so the request is counted in
    /// `runlease_db_unavailable_total`.
    pub db_unavailable: bool,
    /// Set when the caller asked for more than a limit of the coordinator
    /// allows: `overloaded` is then answered 429 instead of 503.
    pub too_many: bool,
}

/// Response extension marking an answer given because PostgreSQL was unavailable.
#[derive(Debug, Clone, Copy)]
pub struct DbUnavailable;

impl ApiError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            db_unavailable: false,
            too_many: false,
        }
    }

    /// 429 `overloaded` with `Retry-After`: the caller holds as much of a
    /// limited resource as it may (parked long-polls).
    pub fn too_many(message: impl Into<String>) -> Self {
        Self {
            too_many: true,
            ..Self::new(ErrorCode::Overloaded, message)
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    /// 422.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message)
    }

    /// 404 for a job.
    pub fn job_not_found() -> Self {
        Self::new(ErrorCode::NotFound, "no such job")
    }

    /// 409 `lease_lost`.
    pub fn lease_lost() -> Self {
        Self::new(
            ErrorCode::LeaseLost,
            "the lease is stale, foreign or forged: another attempt owns this job, or it already ended; drop the job and claim again",
        )
    }

    /// 403 `forbidden`: the caller's key is limited to other queues.
    pub fn forbidden_queue(queue: &str) -> Self {
        Self::new(
            ErrorCode::Forbidden,
            format!("this API key may not use queue {queue:?}"),
        )
    }

    /// 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "database unavailable");
                Self {
                    db_unavailable: true,
                    ..Self::new(
                        ErrorCode::Overloaded,
                        "the database is unavailable or saturated; retry after the Retry-After delay",
                    )
                }
            }
            StoreError::Timeout(operation) => {
                tracing::warn!(operation, "database operation timed out");
                Self {
                    db_unavailable: true,
                    ..Self::new(
                        ErrorCode::Overloaded,
                        "the database did not answer in time; retry after the Retry-After delay (a repeated finish is safe)",
                    )
                }
            }
            StoreError::ReadOnly(detail) => {
                tracing::warn!(%detail, "the PostgreSQL server reached accepts no writes");
                Self {
                    db_unavailable: true,
                    ..Self::new(
                        ErrorCode::Overloaded,
                        "the database is failing over; retry after the Retry-After delay (a repeated finish is safe)",
                    )
                }
            }
            StoreError::Stale(detail) => {
                tracing::warn!(%detail, "prepared statements outlived a schema change");
                Self {
                    db_unavailable: true,
                    ..Self::new(
                        ErrorCode::Overloaded,
                        "the database schema changed under this request; retry after the Retry-After delay (a repeated finish is safe)",
                    )
                }
            }
            StoreError::Retry(detail) => {
                tracing::warn!(%detail, "transient conflict in the database");
                Self::new(
                    ErrorCode::Overloaded,
                    "a transient conflict in the database; retry after the Retry-After delay",
                )
            }
            StoreError::Rejected(detail) => Self::invalid(format!(
                "PostgreSQL cannot store a value of this request: {detail}"
            )),
            other => {
                // 5xx bodies stay generic; the detail is logged once, here.
                tracing::error!(error = %other, "request failed");
                Self::new(
                    ErrorCode::Internal,
                    "internal error; the coordinator's log has the details",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = if self.too_many {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if self.db_unavailable {
            response.extensions_mut().insert(DbUnavailable);
        }
        if self.code == ErrorCode::Overloaded {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}
