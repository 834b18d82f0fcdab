//! The example runlease worker function: serves the one queue named in
//! `RUNLEASE_EXAMPLE_QUEUE` (required; never the queues of `RUNLEASE_QUEUES`)
//! of the coordinator at `RUNLEASE_URL` (key in `RUNLEASE_KEY`) with the
//! example handler (`runlease_worker_lambda::example`), which completes jobs
//! without doing real work. Built for Lambda's `provided.al2023` runtime,
//! whose entry point is a binary named `bootstrap`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = runlease_worker_lambda::example::ExampleConfig::from_env()?;
    runlease_worker_lambda::serve(config.builder()?).await
}
