//! Extractors whose rejections answer with the protocol's error body, so no
//! malformed input ever gets a framework-default plain-text answer.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use runlease_protocol::trace::TRACEPARENT;
use runlease_protocol::{ErrorCode, JobId, QueueName, TraceParent};
use serde::de::DeserializeOwned;

use crate::auth::{Action, Caller};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::serve::BodyDeadline;

/// A JSON body: 413 over the size limit, 400 when it is not JSON, 422 when
/// fields are missing, mistyped, unknown or out of range. No Content-Type is
/// required, so `curl -d` works as is.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The accept loop sets the body's deadline (RUNLEASE_BODY_TIMEOUT_MS);
        // a router served some other way (tests' `oneshot`) has none.
        let deadline = req.extensions().get::<BodyDeadline>().map(|d| d.0);
        let read = Bytes::from_request(req, state);
        // Boxed: the handler's future holds the space of its extractors'
        // while it runs, a parked claim's for a minute.
        let read = Box::pin(async move {
            match deadline {
                Some(at) => tokio::time::timeout_at(at, read).await.ok(),
                None => Some(read.await),
            }
        });
        let read = read.await.ok_or_else(|| {
            ApiError::bad_request(
                "the request body did not arrive within RUNLEASE_BODY_TIMEOUT_MS; send it at once",
            )
        })?;
        let bytes = read.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    ErrorCode::TooLarge,
                    "request body is larger than RUNLEASE_MAX_BODY_BYTES",
                )
            } else {
                ApiError::bad_request(format!("cannot read the request body: {}", rejection.body_text()))
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses a JSON document, telling syntax errors (400) from shape errors (422).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        // serde_json calls some shape errors syntax: a value of another JSON
        // type where an enum's name is expected ("expected value"). A body
        // that is a JSON document is 422 whatever the error says; one
        // nested past the parser's limit is not a document it can read (400).
        let shape = match e.classify() {
            Category::Data => true,
            Category::Syntax | Category::Eof | Category::Io => {
                serde_json::from_slice::<serde_json::Value>(bytes).is_ok()
            }
        };
        if shape {
            ApiError::invalid(format!("invalid request: {e}"))
        } else {
            ApiError::bad_request(format!("request body is not valid JSON: {e}"))
        }
    })
}

/// A job id from the path; anything but a UUID is 400.
pub struct JobIdPath(pub JobId);

impl<S: Send + Sync> FromRequestParts<S> for JobIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        raw.parse::<JobId>()
            .map(JobIdPath)
            .map_err(|_| ApiError::bad_request(format!("job id {raw:?} is not a UUID")))
    }
}

/// The W3C `traceparent` header of a request, when there is exactly one
/// and it is valid. Anything else is ignored (as the W3C recommendation asks
/// of a receiver): the job is stored without trace context, never refused.
pub struct TraceContext(pub Option<TraceParent>);

impl TraceContext {
    /// Reads the header of `headers`.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<TraceParent> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return None;
        };
        match value
            .to_str()
            .map_err(|_| "not visible ASCII")
            .and_then(|v| TraceParent::parse(v).map_err(|e| e.0))
        {
            Ok(t) => Some(t),
            Err(why) => {
                tracing::debug!(why, "ignored an invalid traceparent header");
                None
            }
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for TraceContext {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(TraceContext(Self::from_headers(&parts.headers)))
    }
}

/// A queue name from the path; one that is not a queue name is 422.
pub struct QueuePath(pub QueueName);

impl<S: Send + Sync> FromRequestParts<S> for QueuePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        QueueName::new(raw)
            .map(QueuePath)
            .map_err(|e| ApiError::invalid(format!("queue: {e}")))
    }
}

/// Query parameters; a bad one is 400.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| QueryParams(q))
            .map_err(|r| ApiError::bad_request(format!("invalid query: {}", r.body_text())))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if state.keys.is_empty() {
            return Ok(Caller::open());
        }
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "send Authorization: Bearer <key>"))?;
        let key = crate::auth::bearer(header).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "the Authorization header must be Bearer <key>",
            )
        })?;
        state
            .keys
            .lookup(key)
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown API key"))
    }
}

/// 403 unless the caller's role allows `action`.
pub fn require(caller: &Caller, action: Action) -> Result<(), ApiError> {
    if caller.role.allows(action) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "a {:?} key may not do this ({action:?}); use a key with the right role",
                caller.role
            ),
        ))
    }
}

/// [`require`], and the caller's key may use `queue` (403 otherwise).
pub fn require_for_queue(caller: &Caller, action: Action, queue: &QueueName) -> Result<(), ApiError> {
    require(caller, action)?;
    if caller.may_use_queue(queue) {
        Ok(())
    } else {
        Err(ApiError::forbidden_queue(queue.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use runlease_protocol::admin::BulkJobsRequest;
    use runlease_protocol::worker::FinishRequest;

    use super::*;

    #[test]
    fn a_json_body_of_the_wrong_shape_is_invalid_not_bad_request() {
        // Found by the fuzz target request_body: serde_json reports a value
        // of another JSON type where an enum's name is expected as a syntax
        // error ("expected value"), which was answered 400 "not valid JSON".
        for body in [
            r#"{"action": ["retry"], "queue": "emails", "states": ["failed"]}"#,
            r#"{"action": "retry", "queue": "emails", "states": [1]}"#,
        ] {
            let error = parse_json::<BulkJobsRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(error.code, ErrorCode::Invalid, "{body}: {}", error.message);
        }
        let body = r#"{"items": [{"lease_token": "rl2.x", "action": 7}]}"#;
        let error = parse_json::<FinishRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(error.code, ErrorCode::Invalid, "{}", error.message);
        // What is not JSON stays 400.
        for body in ["", "{", r#"{"action": retry}"#, "[1,]"] {
            let error = parse_json::<BulkJobsRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(error.code, ErrorCode::BadRequest, "{body}: {}", error.message);
        }
    }
}
