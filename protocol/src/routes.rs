//! HTTP paths of the v1 protocol.

/// `POST`: enqueue one job. `GET`: list a queue's jobs.
pub const JOBS: &str = "/v1/jobs";
/// `POST`: retry, cancel or delete the jobs a filter matches (admin).
pub const JOBS_BULK: &str = "/v1/jobs/bulk";
/// `POST`: enqueue up to 1000 jobs in one transaction.
pub const JOBS_BATCH: &str = "/v1/jobs/batch";
/// `GET`: read a job (`?wait_ms=`), with `{id}` the job id.
pub const JOB: &str = "/v1/jobs/{id}";
/// `GET`: a page of a job's attempt chronology (`?before=&limit=`).
pub const JOB_ATTEMPTS: &str = "/v1/jobs/{id}/attempts";
/// `POST`: cancel a job.
pub const JOB_CANCEL: &str = "/v1/jobs/{id}/cancel";
/// `POST`: put a failed or cancelled job back on its queue.
pub const JOB_RETRY: &str = "/v1/jobs/{id}/retry";
/// `POST`: claim leases.
pub const CLAIM: &str = "/v1/claim";
/// `POST`: renew leases.
pub const HEARTBEAT: &str = "/v1/heartbeat";
/// `POST`: complete a lease.
pub const COMPLETE: &str = "/v1/complete";
/// `POST`: fail a lease.
pub const FAIL: &str = "/v1/fail";
/// `POST`: give a lease back without charging an attempt.
pub const RELEASE: &str = "/v1/release";
/// `POST`: many finishing outcomes at once.
pub const FINISH: &str = "/v1/finish";
/// `GET`: per-queue figures.
pub const QUEUES: &str = "/v1/queues";
/// `GET`: one queue's figures and settings; `PATCH`: change its settings.
pub const QUEUE: &str = "/v1/queues/{queue}";
/// `GET`: the signing secret of a queue's endpoint (admin).
pub const QUEUE_ENDPOINT_SECRET: &str = "/v1/queues/{queue}/endpoint-secret";
/// `POST`: rotate the signing secret of a queue's endpoint (admin).
pub const QUEUE_ENDPOINT_SECRET_ROTATE: &str = "/v1/queues/{queue}/endpoint-secret/rotate";
/// `GET`: the caller's role and queues.
pub const WHOAMI: &str = "/v1/whoami";
/// `GET`: every schedule.
pub const SCHEDULES: &str = "/v1/schedules";
/// `PUT`: create or replace a schedule; `GET`: read it; `DELETE`: delete it.
pub const SCHEDULE: &str = "/v1/schedules/{name}";
/// `GET`: the process is up.
pub const HEALTHZ: &str = "/healthz";
/// `GET`: PostgreSQL reachable and migrations current.
pub const READYZ: &str = "/readyz";
/// `GET`: Prometheus text exposition.
pub const METRICS: &str = "/metrics";
/// `GET`: the OpenAPI description of this protocol.
pub const OPENAPI: &str = "/openapi.yaml";
/// `GET`: the web dashboard's page (not part of the JSON protocol).
pub const UI: &str = "/ui";
/// `GET`: a file of the web dashboard (script, style sheet, icon).
pub const UI_ASSET: &str = "/ui/{asset}";

/// [`QUEUE`] for `queue`, for clients (the name percent-encoded).
pub fn queue_path(queue: &str) -> String {
    let mut encoded = String::with_capacity(queue.len());
    for b in queue.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    QUEUE.replace("{queue}", &encoded)
}

/// [`SCHEDULE`] for `name`, for clients (the name percent-encoded).
pub fn schedule_path(name: &str) -> String {
    let queue = queue_path(name);
    SCHEDULE.replace("{name}", queue.trim_start_matches("/v1/queues/"))
}

/// `path` with its `{id}` replaced, for clients.
pub fn job_path(template: &str, id: impl std::fmt::Display) -> String {
    template.replace("{id}", &id.to_string())
}
