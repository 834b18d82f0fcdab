//! The runlease v1 wire contract, shared by the coordinator and every client.
//!
//! Nothing here talks to a network or a database: these are the names, types
//! and limits that `docs/protocol.md` describes, so the coordinator and the
//! clients cannot drift apart.
//!
//! Layout:
//! - [`ids`]: `JobId`, `RunLease`, `WorkerId`, `QueueName`, `LeaseToken`.
//! - [`job`]: `JobState`, the `Job` answer, its `Attempt` chronology and
//!   its dependencies.
//! - [`producer`]: enqueue, batch enqueue, queue listing.
//! - [`admin`]: job listing, bulk actions, queue settings.
//! - [`retry`]: retry policies (backoff, retry window) and why a retry was planned.
//! - [`schedules`]: cron schedules.
//! - [`worker`]: claim, heartbeat, complete, fail, release, finish.
//! - [`error`]: the error body and its codes.
//! - [`routes`]: the HTTP paths.
//! - [`trace`]: W3C `traceparent`, carried from an enqueue to each lease.
//! - [`limits`]: numeric bounds every side validates against.

pub mod admin;
pub mod error;
pub mod ids;
pub mod job;
pub mod limits;
pub mod producer;
pub mod retry;
pub mod routes;
pub mod schedules;
mod time;
pub mod trace;
pub mod worker;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use ids::{JobId, LeaseToken, QueueName, RunLease, WorkerId};
pub use job::{Attempt, AttemptOutcome, Job, JobLink, JobState, LeaseDependency, OnDependencyFailure};
pub use retry::{Backoff, RetryReason};
pub use trace::TraceParent;
