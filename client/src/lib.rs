//! Rust client for the runlease coordinator.
//!
//! - [`Client`]: typed producer and worker calls over one connection pool,
//!   retrying transient failures where repeating is safe.
//! - [`worker`]: the worker runtime (handlers per queue, concurrency, batched
//!   heartbeats, self-fencing, drain, deadline mode).
//! - [`Error`]: what a caller branches on.
//! - `src/bin/runlease/`: the `runlease` CLI (feature `cli`): `args` (the
//!   command line), `failure` (errors and their `--json` codes), `output`,
//!   and one module per verb with sub-verbs.

pub mod client;
pub mod error;
pub mod retry;
pub mod worker;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use retry::RetryPolicy;
pub use runlease_protocol as protocol;
pub use worker::{JobContext, JobError, Worker, WorkerBuilder, WorkerReport};
