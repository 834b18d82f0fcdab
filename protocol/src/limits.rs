//! Numeric bounds of the v1 protocol. Requests outside them are answered 422.

/// Longest queue name, in bytes.
pub const MAX_QUEUE_NAME_LEN: usize = 128;
/// Longest worker id, in bytes.
pub const MAX_WORKER_ID_LEN: usize = 128;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;
/// Longest concurrency key, in bytes.
pub const MAX_CONCURRENCY_KEY_LEN: usize = 255;
/// Most jobs in one `POST /v1/jobs/batch`.
pub const MAX_BATCH_JOBS: usize = 1000;
/// Most dependencies (`depends_on`) of one job.
pub const MAX_DEPENDENCIES: usize = 100;
/// Longest `ref` of a job in a batch, in bytes.
pub const MAX_REF_LEN: usize = 128;
/// Most dependents a job answer lists.
pub const MAX_DEPENDENTS_SHOWN: usize = 100;
/// Most leases one claim may ask for (`max_jobs`).
pub const MAX_CLAIM_JOBS: u32 = 1000;
/// Most queues one claim may name.
pub const MAX_CLAIM_QUEUES: usize = 100;
/// Longest long-poll of a claim or a job read (`wait_ms`).
pub const MAX_WAIT_MS: u64 = 60_000;
/// Most leases in one heartbeat or finish request.
pub const MAX_LEASES_PER_REQUEST: usize = 1000;
/// Largest `max_attempts`.
pub const MAX_ATTEMPTS_LIMIT: i32 = 1000;
/// Largest `timeout_ms`: one day.
pub const MAX_TIMEOUT_MS: i64 = 86_400_000;
/// Largest `delay_ms` and `retry_after_ms`: one year.
pub const MAX_DELAY_MS: i64 = 365 * 86_400_000;
/// Longest error message a worker may record, in bytes (longer ones are cut).
pub const MAX_ERROR_LEN: usize = 16 * 1024;

/// Whether PostgreSQL can store `value` as `jsonb`: no NUL character
/// (`\u0000`) in any string or key. A result, error or progress holding one
/// is answered 422.
pub fn storable_json(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => !s.contains('\0'),
        Value::Array(items) => items.iter().all(storable_json),
        Value::Object(map) => map.iter().all(|(k, v)| !k.contains('\0') && storable_json(v)),
        _ => true,
    }
}

/// Longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 128;
/// Default page size of `GET /v1/jobs`.
pub const DEFAULT_LIST_LIMIT: u32 = 50;
/// Largest page of `GET /v1/jobs`.
pub const MAX_LIST_LIMIT: u32 = 500;
/// Most ended attempts a job answer carries (the latest; older ones are
/// paged by `GET /v1/jobs/{id}/attempts`), and that page's default size.
pub const MAX_ATTEMPTS_PER_JOB_ANSWER: u32 = 100;
/// Largest page of `GET /v1/jobs/{id}/attempts`.
pub const MAX_ATTEMPTS_PAGE: u32 = 1000;
/// Most ids one `POST /v1/jobs/bulk` may name.
pub const MAX_BULK_IDS: usize = 10_000;
/// Largest `max_running` and `max_running_per_key`.
pub const MAX_RUNNING_LIMIT: i32 = 1_000_000;
/// Largest `rate_limit.per_s` and `rate_limit.burst`.
pub const MAX_RATE: i32 = 1_000_000;
/// Smallest `rate_limit.per_s`: one start every 1,000 s.
pub const MIN_RATE_PER_S: f64 = 0.001;
/// Longest retention a queue may set: ten years, in ms.
pub const MAX_RETENTION_MS: i64 = 10 * 365 * 86_400_000;
/// The window of a queue's `throughput` figures: jobs that ended in the
/// last minute.
pub const THROUGHPUT_WINDOW_MS: i64 = 60_000;
/// Longest endpoint URL, bytes.
pub const MAX_ENDPOINT_URL_LEN: usize = 2048;
/// Default `timeout_ms` of a queue's endpoint.
pub const DEFAULT_ENDPOINT_TIMEOUT_MS: i64 = 60_000;
/// Shortest `timeout_ms` of a queue's endpoint.
pub const MIN_ENDPOINT_TIMEOUT_MS: i64 = 1_000;
/// Longest `timeout_ms` of a queue's endpoint (15 minutes).
pub const MAX_ENDPOINT_TIMEOUT_MS: i64 = 900_000;
/// Default `concurrency` of a queue's endpoint.
pub const DEFAULT_ENDPOINT_CONCURRENCY: i64 = 10;
/// Most `concurrency` of a queue's endpoint.
pub const MAX_ENDPOINT_CONCURRENCY: i64 = 1_000;
