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
            let stmt = client.prepare(sql::JOB_ENQUEUE).await.unwrap();
            let mut left = share;
            while left > 0 {
                let n = left.min(PER_STATEMENT);
                left -= n;
                let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
                let queues: Vec<&str> = vec!["raw"; n];
                let payloads: Vec<Value> = (0..n).map(|i| json!(i)).collect();
                let priorities: Vec<i32> = vec![0; n];
                let run_at: Vec<Option<chrono::DateTime<chrono::Utc>>> = vec![None; n];
                let delays: Vec<Option<i64>> = vec![None; n];
                let attempts: Vec<i32> = vec![4; n];
                let timeouts: Vec<Option<i64>> = vec![None; n];
                // The rows runlease's client enqueues: each with an
                // idempotency key (which every claim and complete then
                // carries into its index).
                let keys: Vec<Option<String>> = (0..n)
                    .map(|_| Some(format!("rl-client-{}", Uuid::new_v4().simple())))
                    .collect();
                client
                    .query(
                        &stmt,
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
                        ],
                    )
                    .await
                    .unwrap();
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
            let claim = client.prepare(sql::LEASE_CLAIM).await.unwrap();
            let finish = client.prepare(sql::LEASE_FINISH).await.unwrap();
            let worker = format!("raw-{c}");
            let slots: Vec<&str> = vec![worker.as_str(); PER_STATEMENT];
            let queues = vec!["raw"];
            loop {
                let rows = client
                    .query(
                        &claim,
                        &[
                            &queues,
                            &slots,
                            &15_000i64,
                            &300_000i64,
                            &None::<i64>,
                            &false,
                            &None::<chrono::DateTime<chrono::Utc>>,
                        ],
                    )
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return;
                }
                // The finish takes its items sorted by (id, run_lease), as the store sends them.
                let mut pairs: Vec<(Uuid, i64)> =
                    rows.iter().map(|r| (r.get("id"), r.get("run_lease"))).collect();
                pairs.sort_unstable();
                let (ids, leases): (Vec<Uuid>, Vec<i64>) = pairs.into_iter().unzip();
                let n = rows.len();
                let actions = vec!["complete"; n];
                let results: Vec<Option<Value>> = vec![Some(Value::Null); n];
                let none_text: Vec<Option<&str>> = vec![None; n];
                let none_bool: Vec<Option<bool>> = vec![None; n];
                let none_ms: Vec<Option<i64>> = vec![None; n];
                let none_json: Vec<Option<Value>> = vec![None; n];
                client
                    .query(
                        &finish,
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
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let drain = started.elapsed();
    let cpu = Cpu::now().per_job_since(cpu, jobs);
    Raw { enqueue, drain, cpu }
}
