//! The example function (`src/bin/bootstrap.rs`): its settings, read from
//! `RUNLEASE_*` variables, and the handler it registers on the one queue it
//! is given.
//!
//! The handler does no real work: it completes every job it claims with an
//! echo of the job. So the example serves only the queue named in
//! `RUNLEASE_EXAMPLE_QUEUE`, which must be set (it refuses to start
//! without it), and never the queues of `RUNLEASE_QUEUES`, which is how a
//! function of your own is told its queues: deployed next to real work, it
//! would otherwise mark real jobs done without doing them.
//!
//! The handler echoes its job and can stand in for real work: a payload with
//! `"work_ms": N` takes N milliseconds, in steps of 100 ms, saving
//! `{"done_ms": n}` as its checkpoint after each step. A later attempt
//! resumes from the checkpoint. Told to stop (the invocation's deadline is
//! near), it returns an error, so the runtime releases the job with its
//! checkpoint and charges no attempt; the next invocation goes on from there.
//! Its result: `{"queue", "payload", "attempt", "run_lease", "work_ms",
//! "resumed_from_ms"}`.

use std::time::Duration;

use runlease_client::protocol::QueueName;
use runlease_client::{Client, JobContext, JobError, WorkerBuilder};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The coordinator the example function claims from (`RUNLEASE_URL`).
pub const ENV_URL: &str = "RUNLEASE_URL";
/// Its worker key (`RUNLEASE_KEY`, optional: a loopback coordinator without keys).
pub const ENV_KEY: &str = "RUNLEASE_KEY";
/// The one queue the example serves (`RUNLEASE_EXAMPLE_QUEUE`, required).
pub const ENV_EXAMPLE_QUEUE: &str = "RUNLEASE_EXAMPLE_QUEUE";
/// Jobs run at once by one invocation (`RUNLEASE_CONCURRENCY`, default 8).
pub const ENV_CONCURRENCY: &str = "RUNLEASE_CONCURRENCY";

/// One step of simulated work; a checkpoint is saved after each.
const WORK_STEP: Duration = Duration::from_millis(100);
/// Most simulated work a job may ask for: Lambda's longest timeout.
const MAX_WORK_MS: u64 = 15 * 60 * 1000;

/// Settings of the example function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExampleConfig {
    /// The coordinator's base URL.
    pub url: String,
    /// The worker key, if the coordinator wants one.
    pub key: Option<String>,
    /// The one queue served, named explicitly for the example.
    pub queue: QueueName,
    /// Jobs run at once.
    pub concurrency: usize,
}

impl ExampleConfig {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `get` (a variable's value, if set).
    /// `RUNLEASE_QUEUES` is never read.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let set = |name: &str| get(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let url = set(ENV_URL).ok_or_else(|| {
            Error::Config(format!(
                "{ENV_URL} is not set: give the coordinator's URL, e.g. https://runlease.example.com"
            ))
        })?;
        let queue = set(ENV_EXAMPLE_QUEUE).ok_or_else(|| {
            Error::Config(format!(
                "{ENV_EXAMPLE_QUEUE} is not set: the example handler completes every job it claims \
                 without doing any work, so it serves only the one queue named there (a queue for \
                 trying it out, never one with real jobs), and never the queues of RUNLEASE_QUEUES; \
                 deploy a function of your own for real work"
            ))
        })?;
        if queue.contains(',') {
            return Err(Error::Config(format!(
                "{ENV_EXAMPLE_QUEUE} names one queue, not a list: {queue:?}"
            )));
        }
        let queue = QueueName::new(&queue).map_err(|e| Error::Config(format!("{ENV_EXAMPLE_QUEUE}: {e}")))?;
        let concurrency = match set(ENV_CONCURRENCY) {
            None => runlease_client::worker::DEFAULT_CONCURRENCY,
            Some(v) => v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Error::Config(format!("{ENV_CONCURRENCY} must be a positive integer, not {v:?}"))
            })?,
        };
        Ok(Self {
            url,
            key: set(ENV_KEY),
            queue,
            concurrency,
        })
    }

    /// A worker builder with [`example_handler`] on the example's queue only.
    pub fn builder(&self) -> Result<WorkerBuilder> {
        let mut client = Client::builder(&self.url);
        if let Some(key) = &self.key {
            client = client.key(key);
        }
        Ok(WorkerBuilder::new(client.build()?)
            .concurrency(self.concurrency)
            .handle(self.queue.clone(), example_handler))
    }
}

/// The example handler (see the module docs).
pub async fn example_handler(ctx: JobContext) -> std::result::Result<Value, JobError> {
    let work_ms = ctx
        .raw_payload()
        .get("work_ms")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if work_ms > MAX_WORK_MS {
        return Err(JobError::permanent(format!(
            "work_ms {work_ms} is more than the {MAX_WORK_MS} ms a Lambda invocation can run"
        )));
    }
    let resumed_from = ctx
        .checkpoint()
        .and_then(|c| c.get("done_ms"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(work_ms);
    let mut done = resumed_from;
    while done < work_ms {
        let step = WORK_STEP.min(Duration::from_millis(work_ms - done));
        tokio::select! {
            () = tokio::time::sleep(step) => {}
            () = ctx.cancelled() => {
                return Err(JobError::retryable(format!("stopped after {done} of {work_ms} ms")));
            }
        }
        done += u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
        ctx.report_progress(json!({ "done_ms": done }));
    }
    Ok(json!({
        "queue": ctx.queue(),
        "payload": ctx.raw_payload(),
        "attempt": ctx.attempt(),
        "run_lease": ctx.run_lease().0,
        "work_ms": work_ms,
        "resumed_from_ms": resumed_from,
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<ExampleConfig> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ExampleConfig::from_lookup(|k| vars.get(k).cloned())
    }

    #[test]
    fn settings_come_from_runlease_variables() {
        let c = config(&[
            (ENV_URL, "http://127.0.0.1:8080"),
            (ENV_KEY, "k"),
            (ENV_EXAMPLE_QUEUE, " try-lambda "),
            (ENV_CONCURRENCY, "2"),
        ]);
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.url, "http://127.0.0.1:8080");
        assert_eq!(c.key.as_deref(), Some("k"));
        assert_eq!(c.queue.as_str(), "try-lambda");
        assert_eq!(c.concurrency, 2);
        assert!(c.builder().is_ok());
    }

    #[test]
    fn the_example_serves_only_its_own_queue() {
        // A function's queues (what the stack's Queues sets) are not the example's.
        let c = config(&[
            (ENV_URL, "http://x"),
            ("RUNLEASE_QUEUES", "emails,reports"),
            (ENV_EXAMPLE_QUEUE, "try-lambda"),
        ]);
        assert_eq!(c.unwrap_or_else(|e| panic!("{e}")).queue.as_str(), "try-lambda");

        // Without its own queue it refuses to start, whatever RUNLEASE_QUEUES says.
        for vars in [
            &[(ENV_URL, "http://x"), ("RUNLEASE_QUEUES", "emails,reports")][..],
            &[(ENV_URL, "http://x"), (ENV_EXAMPLE_QUEUE, " ")][..],
        ] {
            let e = config(vars).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(ENV_EXAMPLE_QUEUE), "{e}");
            assert!(e.contains("without doing any work"), "{e}");
        }
        let e = config(&[(ENV_URL, "http://x"), (ENV_EXAMPLE_QUEUE, "a,b")]).err();
        assert!(e.is_some_and(|e| e.to_string().contains("one queue, not a list")));
    }

    #[test]
    fn missing_or_bad_settings_say_what_to_set() {
        let err = |vars: &[(&str, &str)]| config(vars).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(&[(ENV_EXAMPLE_QUEUE, "q")]).contains(ENV_URL));
        assert!(err(&[(ENV_URL, "http://x")]).contains(ENV_EXAMPLE_QUEUE));
        assert!(err(&[(ENV_URL, "http://x"), (ENV_EXAMPLE_QUEUE, "bad queue")]).contains(ENV_EXAMPLE_QUEUE));
        assert!(
            err(&[
                (ENV_URL, "http://x"),
                (ENV_EXAMPLE_QUEUE, "q"),
                (ENV_CONCURRENCY, "0")
            ])
            .contains(ENV_CONCURRENCY)
        );
        let no_key = config(&[(ENV_URL, "http://x"), (ENV_EXAMPLE_QUEUE, "q"), (ENV_KEY, "")]);
        assert_eq!(no_key.ok().and_then(|c| c.key), None);
    }
}
