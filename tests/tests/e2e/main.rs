//! End-to-end tests: the real coordinator over a real PostgreSQL database of
//! each test's own. Modules are named by the behaviour they prove.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod auth;
mod bad_input;
mod batching;
mod bulk;
mod chaos;
mod claim_floors;
mod cli;
mod cli_conventions;
mod cli_endpoints;
mod cli_operations;
mod cli_schedules;
mod column_domains;
mod dashboard;
mod dashboard_graph;
mod database_faults;
mod dead_letters;
mod dependencies;
mod dependency_races;
mod dispatch;
mod edge_runtimes;
mod endpoints;
mod enqueue_claims;
mod failover;
mod fencing;
mod final_attempt;
mod finish_claim;
mod finish_races;
mod flow_control;
mod guards;
mod hostile_clients;
mod http1;
mod json_values;
mod lambda_emulator;
mod lambda_worker;
mod lifecycle;
mod listing;
mod long_poll;
mod metrics_cardinality;
mod openapi;
mod python_worker;
mod queue_figures;
mod queue_settings;
mod reaping;
mod redis_tls;
mod restart;
mod retention;
mod retry_policy;
mod schedules;
mod schema_snapshot;
mod sdk_edge;
mod sdk_python;
mod sdk_typescript;
mod secrets;
mod signals;
mod store;
mod tallies;
mod trace_context;
mod typescript_worker;
mod worker;

use runlease_tests::TestDb;
use uuid::Uuid;

/// Makes the leases of `ids` expired now, as if their workers had stopped
/// heartbeating a TTL ago.
pub async fn expire_leases(db: &TestDb, ids: &[Uuid]) {
    let client = db.client().await;
    let n = client
        .execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE state = 'running' AND id = ANY($1)",
            &[&ids.to_vec()],
        )
        .await
        .unwrap();
    assert_eq!(n as usize, ids.len(), "every lease to expire must be running");
}

/// Number of rows of `job_attempts` for a job with `outcome`.
pub async fn attempts_with(db: &TestDb, id: Uuid, outcome: &str) -> i64 {
    db.scalar(
        "SELECT count(*) FROM job_attempts WHERE job_id = $1 AND outcome::text = $2",
        &[&id, &outcome],
    )
    .await
}
