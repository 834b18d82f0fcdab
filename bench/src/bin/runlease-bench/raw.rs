//! PostgreSQL alone: the coordinator's own guarded statements (enqueue,
//! claim, complete) straight from tokio-postgres, 100 jobs per statement, on a
//! few connections at once, over the rows runlease's client enqueues (each
//! with an idempotency key). This is the ceiling runlease is measured against.

use std::time::{Duration, Instant};

use runlease_coordinator::store::sql;
use runlease_tests::TestDb;

use crate::stats::Cpu;
use serde_json::{Value, json};
use uuid::Uuid;

/// Jobs per statement.
pub const PER_STATEMENT: usize = 100;
/// Connections working at once.
const CONNECTIONS: usize = 4;

/// What PostgreSQL alone did.
pub struct Raw {
    /// Enqueue phase.
    pub enqueue: Duration,
    /// Claim + complete phase.
    pub drain: Duration,
    /// CPU µs per job in the claim + complete phase: this process (the
    /// statements' client), and the rest of the machine (PostgreSQL).
    pub cpu: (f64, f64),
}

/// Runs `jobs` through enqueue, claim and complete, 100 per statement.
pub async fn run(jobs: usize) -> Raw {
    let db = TestDb::new().await;

    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let client = db.client().await;
        // Every job is enqueued: the first connections take the remainder.
        let share = jobs / CONNECTIONS + usize::from(c < jobs % CONNECTIONS);
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(sql::JOB_ENQUEUE.sql()).await.unwrap();
            let mut left = share;
            while left > 0 {
                let n = left.min(PER_STATEMENT);
                left -= n;
                // The rows runlease's client enqueues: each with an
                // idempotency key (which every claim and complete then
                // carries into its index).
                enqueue_rows(&client, &stmt, "raw", n, true).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let enqueue = started.elapsed();

    let cpu = Cpu::now();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let client = db.client().await;
        tasks.push(tokio::spawn(async move {
            // Planned as the coordinator plans its claims, for the session.
            let planning = sql::CLAIM_SCAN_PLANNING.replace("SET LOCAL", "SET");
            client.batch_execute(&planning).await.unwrap();
            let claim = client.prepare(sql::LEASE_CLAIM.sql()).await.unwrap();
            let finish = client.prepare(sql::LEASE_FINISH.sql()).await.unwrap();
            let worker = format!("raw-{c}");
            let slots: Vec<&str> = vec![worker.as_str(); PER_STATEMENT];
            let queues = vec!["raw"];
            let mut completed = 0;
            loop {
                let rows = claim_slots(&client, &claim, &queues, &slots).await.unwrap();
                if rows.is_empty() {
                    return completed;
                }
                completed += complete(&client, &finish, &rows).await.unwrap();
            }
        }));
    }
    let mut completed = 0;
    for t in tasks {
        completed += t.await.unwrap();
    }
    let drain = started.elapsed();
    assert_eq!(
        completed, jobs,
        "PostgreSQL alone: every job enqueued is completed once"
    );
    let cpu = Cpu::now().per_job_since(cpu, jobs);
    Raw { enqueue, drain, cpu }
}

/// Runs `lease_claim.sql` (`claim`, prepared on `client`) for `slots` on
/// `queues` with a 15 s lease, and answers the leases it handed out.
pub async fn claim_slots(
    client: &tokio_postgres::Client,
    claim: &tokio_postgres::Statement,
    queues: &[&str],
    slots: &[&str],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    client
        .query(
            claim,
            &[
                &queues,
                &slots,
                &15_000i64,
                &300_000i64,
                &None::<i64>,
                &false,
                &None::<chrono::DateTime<chrono::Utc>>,
                // No claim floors: each scan from its queue's first entry.
                &Vec::<Option<i32>>::new(),
                &Vec::<Option<chrono::DateTime<chrono::Utc>>>::new(),
                &Vec::<Option<Uuid>>::new(),
            ],
        )
        .await
}

/// Completes the leases of `rows` (claim rows: `id`, `run_lease`) with
/// `finish` (`lease_finish.sql`, or a statement taking the same
/// parameters), each with the result JSON `null`, the items sorted by (id,
/// run_lease) as the store sends them. Answers how many took effect.
pub async fn complete(
    client: &tokio_postgres::Client,
    finish: &tokio_postgres::Statement,
    rows: &[tokio_postgres::Row],
) -> Result<usize, tokio_postgres::Error> {
    let mut pairs: Vec<(Uuid, i64)> = rows.iter().map(|r| (r.get("id"), r.get("run_lease"))).collect();
    pairs.sort_unstable();
    let (ids, leases): (Vec<Uuid>, Vec<i64>) = pairs.into_iter().unzip();
    let n = ids.len();
    let actions = vec!["complete"; n];
    let results: Vec<Option<Value>> = vec![Some(Value::Null); n];
    let none_text: Vec<Option<&str>> = vec![None; n];
    let none_bool: Vec<Option<bool>> = vec![None; n];
    let none_ms: Vec<Option<i64>> = vec![None; n];
    let none_json: Vec<Option<Value>> = vec![None; n];
    let answered = client
        .query(
            finish,
            &[
                &ids,
                &leases,
                &actions,
                &results,
                &none_text,
                &none_bool,
                &none_ms,
                &none_json,
                &1_000i64,
                &300_000i64,
            ],
        )
        .await?;
    Ok(answered.len())
}

/// Enqueues `n` jobs on `queue` with `enqueue` (`job_enqueue.sql`, prepared
/// on `client`) in one statement: payload the job's index, four attempts,
/// the default timeout, each with an idempotency key if `keyed` (as
/// runlease's client sends them), none otherwise (as `POST /v1/jobs/batch`
/// without keys).
pub async fn enqueue_rows(
    client: &tokio_postgres::Client,
    enqueue: &tokio_postgres::Statement,
    queue: &str,
    n: usize,
    keyed: bool,
) -> Result<(), tokio_postgres::Error> {
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let queues: Vec<&str> = vec![queue; n];
    let payloads: Vec<Value> = (0..n).map(|i| json!(i)).collect();
    let priorities: Vec<i32> = vec![0; n];
    let run_at: Vec<Option<chrono::DateTime<chrono::Utc>>> = vec![None; n];
    let delays: Vec<Option<i64>> = vec![None; n];
    let attempts: Vec<i32> = vec![4; n];
    let timeouts: Vec<Option<i64>> = vec![None; n];
    let keys: Vec<Option<String>> = (0..n)
        .map(|_| keyed.then(|| format!("rl-client-{}", Uuid::new_v4().simple())))
        .collect();
    let none: Vec<Option<&str>> = vec![None; n];
    // No dependencies: the statement's dependency columns are NULL arrays;
    // no retry policy of their own: NULL for each job.
    let (no_text, no_int): (Option<Vec<&str>>, Option<Vec<i32>>) = (None, None);
    let no_ms: Vec<Option<i64>> = vec![None; n];
    let no_float: Vec<Option<f64>> = vec![None; n];
    client
        .execute(
            enqueue,
            &[
                &ids,
                &queues,
                &payloads,
                &priorities,
                &run_at,
                &delays,
                &attempts,
                &timeouts,
                &keys,
                &none,
                &none,
                &no_text,
                &no_int,
                &no_int,
                &no_int,
                &no_text,
                &no_text,
                &4i32,
                &no_ms,
                &no_ms,
                &no_float,
                &no_float,
                &no_ms,
            ],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// PostgreSQL alone enqueues, claims and completes every job with the
    /// statements as they are now (`run` checks that each job was completed
    /// once).
    #[tokio::test]
    async fn runs_the_coordinator_s_statements() {
        let raw = super::run(1_000).await;
        assert!(raw.drain > std::time::Duration::ZERO);
        assert!(raw.cpu.0.is_finite() && raw.cpu.1.is_finite());
    }
}
