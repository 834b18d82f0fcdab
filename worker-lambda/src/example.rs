//! The example function (`src/bin/bootstrap.rs`): its settings, read from
//! `RUNLEASE_*` variables, and the handler it registers on every queue.
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
/// The queues it serves, comma-separated (`RUNLEASE_QUEUES`).
pub const ENV_QUEUES: &str = "RUNLEASE_QUEUES";
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
    /// The queues served.
    pub queues: Vec<QueueName>,
    /// Jobs run at once.
    pub concurrency: usize,
}

impl ExampleConfig {
    /// Reads the settings from the environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `get` (a variable's value, if set).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let set = |name: &str| get(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let url = set(ENV_URL).ok_or_else(|| {
            Error::Config(format!(
                "{ENV_URL} is not set: give the coordinator's URL, e.g. https://runlease.example.com"
            ))
        })?;
        let queues = set(ENV_QUEUES)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(|q| QueueName::new(q).map_err(|e| Error::Config(format!("{ENV_QUEUES}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        if queues.is_empty() {
            return Err(Error::Config(format!(
                "{ENV_QUEUES} is not set: list the queues to serve, comma-separated"
            )));
        }
        let concurrency = match set(ENV_CONCURRENCY) {
            None => runlease_client::worker::DEFAULT_CONCURRENCY,
            Some(v) => v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Error::Config(format!("{ENV_CONCURRENCY} must be a positive integer, not {v:?}"))
            })?,
        };
        Ok(Self {
            url,
            key: set(ENV_KEY),
            queues,
            concurrency,
        })
    }

    /// A worker builder with [`example_handler`] on every queue.
    pub fn builder(&self) -> Result<WorkerBuilder> {
        let mut client = Client::builder(&self.url);
        if let Some(key) = &self.key {
            client = client.key(key);
        }
        let mut builder = WorkerBuilder::new(client.build()?).concurrency(self.concurrency);
        for queue in &self.queues {
            builder = builder.handle(queue.clone(), example_handler);
        }
        Ok(builder)
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
            (ENV_QUEUES, " emails, ,reports "),
            (ENV_CONCURRENCY, "2"),
        ]);
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.url, "http://127.0.0.1:8080");
        assert_eq!(c.key.as_deref(), Some("k"));
        let queues: Vec<&str> = c.queues.iter().map(QueueName::as_str).collect();
        assert_eq!(queues, ["emails", "reports"]);
        assert_eq!(c.concurrency, 2);
        assert!(c.builder().is_ok());
    }

    #[test]
    fn missing_or_bad_settings_say_what_to_set() {
        let err = |vars: &[(&str, &str)]| config(vars).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(&[(ENV_QUEUES, "q")]).contains(ENV_URL));
        assert!(err(&[(ENV_URL, "http://x")]).contains(ENV_QUEUES));
        assert!(err(&[(ENV_URL, "http://x"), (ENV_QUEUES, "bad queue")]).contains(ENV_QUEUES));
        assert!(
            err(&[(ENV_URL, "http://x"), (ENV_QUEUES, "q"), (ENV_CONCURRENCY, "0")])
                .contains(ENV_CONCURRENCY)
        );
        let no_key = config(&[(ENV_URL, "http://x"), (ENV_QUEUES, "q"), (ENV_KEY, "")]);
        assert_eq!(no_key.ok().and_then(|c| c.key), None);
    }
}
