//! Version 15: the checks of a single column of `jobs` held by the column's
//! type (a domain) instead of the table. The upgrade keeps every row and
//! rewrites neither the table nor an index; the database still refuses
//! every value the old checks refused, naming the rule.

use runlease_coordinator::store::migrate::migrate;
use runlease_protocol::JobState;
use runlease_tests::{TestCoordinator, TestDb, UpgradeDb};
use serde_json::json;

/// The storage of `jobs` and of each of its indexes, by name.
const STORAGE: &str =
    "SELECT string_agg(c.relname || '=' || pg_relation_filenode(c.oid), ' ' ORDER BY c.relname)
                       FROM pg_class c
                       WHERE c.oid = 'jobs'::regclass
                          OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs'::regclass)";

/// Every row of `jobs`, as one digest.
const ROWS: &str = "SELECT md5(string_agg(to_jsonb(j)::text, ',' ORDER BY j.id)) FROM jobs j";

#[tokio::test]
async fn the_column_domains_migration_keeps_every_row_and_rewrites_no_table_or_index() {
    let db = UpgradeDb::at("runlease_v14", 14).await;
    let client = db.client().await;
    // Rows using every column that changes type: a retry policy, a trace
    // context, a timeout, dependencies (a blocked dependent, a job others
    // depend on).
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts, timeout_ms, traceparent, backoff_base_ms,
                               backoff_max_ms, backoff_factor, backoff_jitter, retry_window_ms, dependents)
             SELECT gen_random_uuid(), 'q', jsonb_build_object('i', i), 5, 30000,
                    '00-0123456789abcdef0123456789abcdef-0123456789abcdef-01', 100, 60000, 2.5, 0.25, 600000, 1
             FROM generate_series(1, 20) AS i;
             INSERT INTO jobs (id, queue, state, payload, max_attempts, dependencies, dependencies_pending,
                               on_dependency_failure)
             VALUES (gen_random_uuid(), 'q', 'blocked', '{}', 3, 2, 1, 'cancel');",
        )
        .await
        .unwrap();
    let storage: String = client.query_one(STORAGE, &[]).await.unwrap().get(0);
    let rows: String = client.query_one(ROWS, &[]).await.unwrap().get(0);

    assert_eq!(migrate(&db.pool).await.unwrap(), vec![15]);
    let storage_after: String = client.query_one(STORAGE, &[]).await.unwrap().get(0);
    let rows_after: String = client.query_one(ROWS, &[]).await.unwrap().get(0);
    assert_eq!(rows, rows_after, "every row is unchanged");
    assert_eq!(
        storage, storage_after,
        "neither the table nor an index was rewritten"
    );
    let domain: String = client
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = 'jobs'::regclass AND attname = 'backoff_factor'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(domain, "backoff_factor");
    // The migrated rows stay writable: a row update checks the table's
    // checks, a write of a domain column that column's rules.
    let updated = client
        .execute(
            "UPDATE jobs SET backoff_factor = backoff_factor + 1, updated_at = now() WHERE queue = 'q'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(updated, 21);
    drop(client);
    db.drop().await;
}

#[tokio::test]
async fn the_database_refuses_what_a_column_domain_forbids_and_names_the_rule() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts)
             VALUES ('00000000-0000-7000-8000-000000000001', 'q', '{}', 3)",
        )
        .await
        .unwrap();
    let refused = [
        ("max_attempts = 0", "attempt_budget_positive"),
        ("timeout_ms = 0", "lease_timeout_ms_positive"),
        ("traceparent = '00-short-01'", "trace_context_form"),
        ("backoff_base_ms = -1", "backoff_ms_nonnegative"),
        ("backoff_max_ms = -1", "backoff_ms_nonnegative"),
        ("backoff_factor = 10.5", "backoff_factor_range"),
        ("backoff_jitter = 1.5", "backoff_jitter_range"),
        ("retry_window_ms = 0", "retry_window_ms_positive"),
        ("dependents = -1", "job_count_nonnegative"),
        ("dependencies = 101", "dependency_count_range"),
        (
            "on_dependency_failure = 'ignore', dependencies = 1",
            "dependency_failure_action",
        ),
        // What stays on the table: the checks that tie columns together.
        ("on_dependency_failure = 'run'", "jobs_dependencies"),
        ("dependencies = 1, dependencies_pending = 2", "jobs_dependencies"),
        (
            "dependencies = 1, dependencies_pending = 1, on_dependency_failure = 'cancel'",
            "jobs_dependencies",
        ),
        ("attempt = 4", "jobs_attempt_in_budget"),
        ("attempt = 3", "jobs_claimable_has_budget"),
        ("queue = ''", "jobs_queue_len"),
        ("idempotency_key = ''", "jobs_idempotency_key_len"),
        ("concurrency_key = ''", "jobs_concurrency_key_len"),
    ];
    for (set, rule) in refused {
        let err = client
            .execute(&format!("UPDATE jobs SET {set}"), &[])
            .await
            .expect_err(set);
        let db_error = err.as_db_error().unwrap_or_else(|| panic!("{set}: {err:?}"));
        assert_eq!(db_error.constraint(), Some(rule), "{set}: {db_error:?}");
    }
    // An insert is checked too.
    let err = client
        .execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts, backoff_jitter)
             VALUES ('00000000-0000-7000-8000-000000000002', 'q', '{}', 3, -0.5)",
            &[],
        )
        .await
        .expect_err("a jitter below 0");
    assert_eq!(
        err.as_db_error().and_then(|e| e.constraint()),
        Some("backoff_jitter_range")
    );
    let jobs: i64 = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(jobs, 1, "nothing refused was written");
}

#[tokio::test]
async fn a_coordinator_keeps_serving_after_a_migration_changes_the_tables_under_its_statements() {
    // During a rolling upgrade a newer coordinator migrates while an older
    // one serves on connections whose statements were prepared before:
    // PostgreSQL refuses to run a prepared statement whose result changed
    // type ("cached plan must not change result type").
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let first = c.api.enqueue("rolling", json!(1)).await;
    assert_eq!(c.api.job(first.id).await.id, first.id);
    let lease = c.api.claim_one("rolling", "w").await;
    assert_eq!(c.api.complete(&lease, json!("one")).await.0, 200);
    // The column types every job answer, lease and finish returns.
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE jobs ALTER COLUMN max_attempts TYPE integer, ALTER COLUMN timeout_ms TYPE bigint,
                              ALTER COLUMN traceparent TYPE text, ALTER COLUMN dependents TYPE integer",
        )
        .await
        .unwrap();
    // Each operation meets the change once, drops the connections that
    // prepared before it and runs again on a fresh one.
    let second = c.api.enqueue("rolling", json!(2)).await;
    assert_eq!(c.api.job(first.id).await.state, JobState::Done);
    let lease = c.api.claim_one("rolling", "w").await;
    assert_eq!(lease.job_id, second.id);
    let (status, body) = c.api.complete(&lease, json!("two")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(c.api.job(second.id).await.state, JobState::Done);
    let (_, metrics) = c.api.get_text("/metrics").await;
    let retries: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("runlease_db_retries_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(retries >= 1.0, "the retries are counted:\n{metrics}");
}
