//! Runs runlease job handlers inside AWS Lambda.
//!
//! Build a [`runlease_client::WorkerBuilder`] exactly as for a long-running
//! worker and hand it to [`serve`]. Each invocation runs a worker of those
//! handlers in deadline mode with the invocation's deadline: it claims from
//! the coordinator over HTTP while time remains and its queues hold jobs,
//! heartbeats, and releases (no attempt charged) whatever it cannot finish
//! `release_margin` before the deadline. SQS messages are wake-ups, never
//! leases: each is only a hint that there is work.
//!
//! - [`function`]: [`LambdaWorker`] (settings, the per-invocation handler) and [`serve`].
//! - [`invocation`]: SQS wake-ups, EventBridge scheduled sweeps, direct invocations.
//! - [`example`]: settings and handler of the example `bootstrap` binary.
//! - [`error`]: what makes an invocation fail.
//! - `src/bin/bootstrap.rs`: the example function for `provided.al2023`.
//!
//! The crate depends on no database crate and no OpenSSL (`reqwest` with
//! rustls comes through `runlease-client`); `scripts/check-lambda-deps.sh`
//! checks it.

pub mod error;
pub mod example;
pub mod function;
pub mod invocation;

pub use aws_lambda_events;
pub use error::{Error, Result};
pub use function::{Answer, DEFAULT_LAMBDA_CLAIM_WAIT, Invoked, LambdaWorker, SweepAnswer, serve};
pub use invocation::{Invocation, WakeUp};
pub use lambda_runtime;
