//! `LambdaWorker`: one invocation runs the client's worker runtime in deadline
//! mode until its queues are idle, then answers as the event requires.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsBatchResponse;
use lambda_runtime::{Context, LambdaEvent, service_fn};
use runlease_client::protocol::WorkerId;
use runlease_client::worker::DEFAULT_RELEASE_MARGIN;
use runlease_client::{WorkerBuilder, WorkerReport};
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::invocation::{Invocation, WakeUp, message_id};

/// Default claim long-poll inside an invocation. A wake-up is sent after its
/// jobs committed, so they are claimable at once; the wait only catches jobs
/// enqueued a moment later, and bounds what an idle invocation (a duplicate
/// wake-up, an empty sweep) is billed for.
pub const DEFAULT_LAMBDA_CLAIM_WAIT: Duration = Duration::from_secs(1);

/// Default time an invocation assumes it has when its deadline is not a real
/// one (see [`LambdaWorker::unknown_deadline_budget`]): Lambda's longest
/// function timeout, which no invocation outlives.
pub const DEFAULT_UNKNOWN_DEADLINE_BUDGET: Duration = Duration::from_secs(15 * 60);

/// A deadline further in the past than this when the invocation starts is
/// not a wall-clock instant Lambda sent (Lambda's deadline is at least a
/// second ahead when it hands out the invocation, and the function's clock
/// is the host's), but a placeholder.
const IMPLAUSIBLY_PAST: Duration = Duration::from_secs(24 * 60 * 60);

/// Longest worker id the protocol accepts.
const MAX_WORKER_ID_LEN: usize = 128;

/// Serves a [`WorkerBuilder`]'s handlers inside Lambda: one worker per
/// invocation, in deadline mode, until its queues are idle.
#[derive(Clone)]
pub struct LambdaWorker {
    builder: WorkerBuilder,
    release_margin: Duration,
    claim_wait: Duration,
    invocation_worker_ids: bool,
    unknown_deadline_budget: Duration,
}

/// What one invocation answered, with what its worker did.
#[derive(Debug, Clone, PartialEq)]
pub struct Invoked {
    /// What the function returns to Lambda.
    pub answer: Answer,
    /// The invocation's worker report.
    pub report: WorkerReport,
}

/// What the function returns to Lambda.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// For SQS events: `{"batchItemFailures": [{"itemIdentifier": <messageId>}]}`,
    /// naming the wake-ups SQS should deliver again.
    Batch(SqsBatchResponse),
    /// For scheduled and direct invocations: what the sweep did.
    Sweep(SweepAnswer),
}

/// The answer to a scheduled or direct invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepAnswer {
    /// `scheduled` or `direct`.
    pub invocation: &'static str,
    /// Attempts completed.
    pub completed: u64,
    /// Attempts failed.
    pub failed: u64,
    /// Attempts released before the deadline (no attempt charged).
    pub released: u64,
    /// Attempts dropped without a word (lease lost, fenced).
    pub abandoned: u64,
}

/// Whether an invocation's worker acted on the coordinator's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// At least one claim was answered.
    Answered,
    /// Every claim failed: the coordinator is unreachable (or refused us).
    Unreachable,
    /// Not one claim was sent: the time left was below the release margin.
    NoTime,
}

impl Reach {
    fn of(report: &WorkerReport) -> Self {
        match (report.claims_answered, report.claims_failed) {
            (0, 0) => Reach::NoTime,
            (0, _) => Reach::Unreachable,
            _ => Reach::Answered,
        }
    }
}

impl LambdaWorker {
    /// Serves `builder`'s handlers, with the default release margin (2 s) and
    /// claim wait (1 s), and a worker id per invocation.
    pub fn new(builder: WorkerBuilder) -> Self {
        Self {
            builder,
            release_margin: DEFAULT_RELEASE_MARGIN,
            claim_wait: DEFAULT_LAMBDA_CLAIM_WAIT,
            invocation_worker_ids: true,
            unknown_deadline_budget: DEFAULT_UNKNOWN_DEADLINE_BUDGET,
        }
    }

    /// How long before the invocation's deadline held jobs are stopped and
    /// released. Keep it above the builder's stop grace (default 1 s), so the
    /// release still goes out in time.
    pub fn release_margin(mut self, margin: Duration) -> Self {
        self.release_margin = margin;
        self
    }

    /// The claim long-poll of every invocation; it replaces the builder's own.
    pub fn claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = wait;
        self
    }

    /// Whether each invocation claims as `<function name>:<request id>`
    /// (default), so a job's attempts name the invocation that ran them and
    /// its logs are one search away. `false` keeps the builder's worker id.
    pub fn invocation_worker_ids(mut self, yes: bool) -> Self {
        self.invocation_worker_ids = yes;
        self
    }

    /// The time an invocation assumes it has when its context carries no
    /// real deadline: none at all (a hand-made `Context`), or one more than a
    /// day in the past. Lambda always sends one; local emulators may not
    /// (`cargo lambda watch` 1.9 sends the constant 600000, ten minutes after
    /// the epoch). Default: 15 min, Lambda's longest timeout.
    pub fn unknown_deadline_budget(mut self, budget: Duration) -> Self {
        self.unknown_deadline_budget = budget;
        self
    }

    /// Runs the Lambda runtime loop: polls the Runtime API for invocations
    /// and handles each with [`LambdaWorker::handle`]. Returns only when the
    /// Runtime API fails.
    pub async fn serve(self) -> std::result::Result<(), lambda_runtime::Error> {
        lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
            let this = self.clone();
            async move { this.handle(event).await }
        }))
        .await
    }

    /// Handles one invocation: the answer Lambda gets.
    pub async fn handle(&self, event: LambdaEvent<Value>) -> Result<Answer> {
        self.invoke(event).await.map(|invoked| invoked.answer)
    }

    /// Handles one invocation, returning the worker's report too.
    ///
    /// - SQS wake-ups: answered with a partial batch response naming every
    ///   wake-up when the worker never reached the coordinator (all claims
    ///   failed, or there was no time to claim), so SQS delivers them again;
    ///   otherwise none (each is only a hint, and the claims acted on them).
    /// - Scheduled and direct invocations: a sweep, answered with counts; an
    ///   error when the coordinator was not reached, so the failure shows in
    ///   the function's error metrics and asynchronous retries.
    pub async fn invoke(&self, event: LambdaEvent<Value>) -> Result<Invoked> {
        let (payload, ctx) = event.into_parts();
        let invocation = Invocation::classify(payload);
        let span = tracing::info_span!("invocation", request_id = %ctx.request_id, kind = invocation.kind());
        async move {
            if let Invocation::Wake(sqs) = &invocation {
                log_hints(sqs.records.iter().map(|r| r.body.as_deref()));
            }
            let report = self.run_worker(&ctx).await?;
            let reach = Reach::of(&report);
            tracing::info!(?report, ?reach, "invocation done");
            let answer = match invocation {
                Invocation::Wake(sqs) => {
                    let mut batch = SqsBatchResponse::default();
                    if reach != Reach::Answered {
                        batch.set_failures(sqs.records.iter().filter_map(message_id));
                        tracing::warn!(
                            failures = batch.batch_item_failures.len(),
                            ?reach,
                            "wake-ups not acted on: SQS will deliver them again"
                        );
                    }
                    Answer::Batch(batch)
                }
                Invocation::Scheduled | Invocation::Direct(_) => match reach {
                    Reach::Answered => Answer::Sweep(SweepAnswer {
                        invocation: invocation.kind(),
                        completed: report.completed,
                        failed: report.failed,
                        released: report.released,
                        abandoned: report.abandoned,
                    }),
                    Reach::Unreachable => {
                        return Err(Error::Unreachable {
                            claims_failed: report.claims_failed,
                        });
                    }
                    Reach::NoTime => {
                        return Err(Error::TooLittleTime {
                            margin_ms: millis(self.release_margin),
                        });
                    }
                },
            };
            Ok(Invoked { answer, report })
        }
        .instrument(span)
        .await
    }

    /// Runs a worker of the builder's handlers until its queues are idle,
    /// stopping and releasing what it holds `release_margin` before the
    /// invocation's deadline.
    pub async fn run_worker(&self, ctx: &Context) -> Result<WorkerReport> {
        let deadline = deadline_of(ctx, self.unknown_deadline_budget);
        tracing::info!(
            deadline_ms = ctx.deadline,
            time_left_ms = millis(deadline.saturating_duration_since(Instant::now())),
            "claiming until idle or the deadline"
        );
        let mut builder = self
            .builder
            .clone()
            .claim_wait(self.claim_wait)
            .deadline(deadline, self.release_margin)
            .until_idle(true);
        if self.invocation_worker_ids
            && let Some(id) = invocation_worker_id(ctx)
        {
            builder = builder.worker_id(id);
        }
        Ok(builder.build()?.run(CancellationToken::new()).await)
    }
}

/// Serves `builder`'s handlers inside Lambda with the default settings: the
/// one call a function's `main` makes.
///
/// ```no_run
/// # async fn f(builder: runlease_client::WorkerBuilder) -> Result<(), lambda_runtime::Error> {
/// runlease_worker_lambda::serve(builder).await
/// # }
/// ```
pub async fn serve(builder: WorkerBuilder) -> std::result::Result<(), lambda_runtime::Error> {
    LambdaWorker::new(builder).serve().await
}

/// The invocation's deadline on the monotonic clock. The Runtime API gives it
/// as wall-clock milliseconds; it is read once, here, against the function's
/// own clock, which is the clock Lambda enforces it with. A context without a
/// real deadline gets `unknown_budget` from now.
fn deadline_of(ctx: &Context, unknown_budget: Duration) -> Instant {
    let now = SystemTime::now();
    let stated = ctx.deadline();
    let past = now.duration_since(stated).unwrap_or(Duration::ZERO);
    if ctx.deadline == 0 || past > IMPLAUSIBLY_PAST {
        tracing::warn!(
            deadline_ms = ctx.deadline,
            assumed_ms = millis(unknown_budget),
            "the invocation carries no real deadline (a local emulator?): assuming the unknown-deadline budget"
        );
        return Instant::now() + unknown_budget;
    }
    let left = stated.duration_since(now).unwrap_or(Duration::ZERO);
    Instant::now() + left
}

/// `<function name>:<request id>`, reduced to what a worker id may hold.
fn invocation_worker_id(ctx: &Context) -> Option<WorkerId> {
    if ctx.request_id.is_empty() {
        return None;
    }
    let function = match ctx.env_config.function_name.as_str() {
        "" => "lambda",
        name => name,
    };
    let id: String = format!("{function}:{}", ctx.request_id)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '@'))
        .collect();
    // Keep the request id (the end) when a long function name must give way.
    let skip = id.len().saturating_sub(MAX_WORKER_ID_LEN);
    WorkerId::new(&id[skip..]).ok()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Logs what the wake-ups say. They are hints: nothing depends on them.
fn log_hints<'a>(bodies: impl Iterator<Item = Option<&'a str>>) {
    let mut per_queue: BTreeMap<String, u64> = BTreeMap::new();
    let mut malformed = 0usize;
    for body in bodies {
        match body.and_then(WakeUp::parse) {
            Some(w) => *per_queue.entry(w.queue).or_default() += w.jobs,
            None => malformed += 1,
        }
    }
    if malformed > 0 {
        tracing::warn!(
            malformed,
            "messages that are not runlease wake-ups; claiming anyway"
        );
    }
    tracing::info!(?per_queue, "woken up");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ctx(request_id: &str, function: &str) -> Context {
        let mut ctx = Context::default();
        ctx.request_id = request_id.to_owned();
        ctx.env_config = Arc::new(lambda_runtime::Config {
            function_name: function.to_owned(),
            ..Default::default()
        });
        ctx
    }

    #[test]
    fn worker_ids_name_the_invocation() {
        let id = invocation_worker_id(&ctx("8476a536-e9f4-11e8-9739-2dfe598c3fcd", "jobs-fn"));
        assert_eq!(
            id.map(|i| i.as_str().to_owned()).as_deref(),
            Some("jobs-fn:8476a536-e9f4-11e8-9739-2dfe598c3fcd")
        );
        assert!(invocation_worker_id(&ctx("", "f")).is_none());
        let long = "f".repeat(200);
        let id = invocation_worker_id(&ctx("req-1", &long)).map(|i| i.as_str().to_owned());
        assert_eq!(id.as_deref().map(str::len), Some(MAX_WORKER_ID_LEN));
        assert!(id.as_deref().is_some_and(|i| i.ends_with(":req-1")));
        let odd = invocation_worker_id(&ctx("a b$c", "")).map(|i| i.as_str().to_owned());
        assert_eq!(odd.as_deref(), Some("lambda:abc"));
    }

    #[test]
    fn deadlines_come_from_the_context_unless_they_are_not_real() {
        let budget = Duration::from_secs(600);
        let with = |deadline: u64| {
            let mut ctx = Context::default();
            ctx.deadline = deadline;
            deadline_of(&ctx, budget).saturating_duration_since(Instant::now())
        };
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(millis)
            .unwrap_or_default();
        let left = with(now_ms + 3_000);
        assert!(
            left <= Duration::from_secs(3) && left > Duration::from_millis(2_500),
            "{left:?}"
        );
        // Passed a moment ago: no time left (a real, spent deadline).
        assert_eq!(with(now_ms - 5_000), Duration::ZERO);
        // None, or cargo-lambda's placeholder: the budget.
        for placeholder in [0, 600_000] {
            let left = with(placeholder);
            assert!(left > Duration::from_secs(599) && left <= budget, "{left:?}");
        }
    }

    #[test]
    fn reach_follows_the_claim_counts() {
        let report = |answered, failed| WorkerReport {
            claims_answered: answered,
            claims_failed: failed,
            ..Default::default()
        };
        assert_eq!(Reach::of(&report(0, 0)), Reach::NoTime);
        assert_eq!(Reach::of(&report(0, 3)), Reach::Unreachable);
        assert_eq!(Reach::of(&report(1, 2)), Reach::Answered);
    }

    #[test]
    fn answers_serialize_as_lambda_expects() {
        let mut batch = SqsBatchResponse::default();
        batch.add_failure("m1");
        assert_eq!(
            serde_json::to_value(Answer::Batch(batch)).ok(),
            Some(serde_json::json!({"batchItemFailures": [{"itemIdentifier": "m1"}]}))
        );
        assert_eq!(
            serde_json::to_value(Answer::Batch(SqsBatchResponse::default())).ok(),
            Some(serde_json::json!({"batchItemFailures": []}))
        );
    }
}
