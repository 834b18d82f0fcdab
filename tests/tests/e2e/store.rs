//! The store's set-up: statements, migrations, database creation, TLS.

use runlease_coordinator::store::{sql, tally};
use runlease_tests::{TestCoordinator, TestDb, admin, test_config};

#[tokio::test]
async fn every_statement_prepares_against_the_migrated_schema() {
    let db = TestDb::new().await;
    let client = db.client().await;
    for (name, text) in sql::ALL {
        assert!(
            text.trim_start().starts_with("--"),
            "{name}.sql opens with its header comment"
        );
        let statement = client
            .prepare(text)
            .await
            .unwrap_or_else(|e| panic!("{name}.sql does not prepare: {e}"));
        // tokio-postgres binds no Rust value to a parameter of a domain
        // type (a column's own type, for a bare `$n` written into it): each
        // statement casts its parameters to the base types.
        for (i, ty) in statement.params().iter().enumerate() {
            assert!(
                !matches!(ty.kind(), tokio_postgres::types::Kind::Domain(_)),
                "{name}.sql: ${} is of the domain {}: cast it to its base type",
                i + 1,
                ty.name()
            );
        }
    }
}

#[tokio::test]
async fn concurrent_migrators_create_the_database_once_and_apply_once() {
    let name = format!("runlease_fresh_{}", uuid::Uuid::new_v4().simple());
    let url = runlease_tests::url_for(&name);
    let config = test_config(&url);
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move { runlease_coordinator::migrate(&config).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let admin = admin().await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let applied: i64 = client
        .query_one("SELECT count(*) FROM runlease_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        applied as usize,
        runlease_coordinator::store::migrate::MIGRATIONS.len()
    );
    drop(client);
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
}

#[tokio::test]
async fn sslmode_require_connects_over_tls() {
    let db = TestDb::new().await;
    let url = format!("{}?sslmode=require", db.url);
    let c = TestCoordinator::start_with(&db, |cfg| cfg.database.url = url).await;
    c.api.enqueue("tls", serde_json::json!(1)).await;
    let client = db.client().await;
    let encrypted: Vec<bool> = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.datname = current_database() AND a.application_name = 'runlease-coordinator'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!encrypted.is_empty(), "the coordinator holds connections");
    assert!(
        encrypted.iter().all(|e| *e),
        "every coordinator connection is encrypted"
    );
}

/// The generic plan (what a prepared statement runs after its first few
/// executions) of `statement` with `args`, over a backlog of 20,000 jobs.
/// The claim statement's arguments for a plan: two queues without claim
/// floors, three slots.
const CLAIM_ARGS: &str =
    "'{q0,q1}', '{w,w,w}', 15000, 300000, NULL, false, NULL, '{NULL,NULL}', '{NULL,NULL}', '{NULL,NULL}'";

/// The claim floor's read's arguments: two queues, one with a floor.
const FLOOR_ARGS: &str = "'{q0,q1}', '{0,NULL}', '{2026-01-01T00:00:00Z,NULL}', \
     '{00000000-0000-0000-0000-000000000001,NULL}'";

async fn generic_plan(client: &tokio_postgres::Client, statement: &str, args: &str) -> String {
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; PREPARE probe AS {statement}"
        ))
        .await
        .unwrap();
    let rows = client
        .query(&format!("EXPLAIN (COSTS OFF) EXECUTE probe({args})"), &[])
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A connection plans its claim (and its finish, in the same transaction)
/// once, at its first: on a coordinator that claims before anything is
/// enqueued, that is on an empty table, where a scan of the whole table
/// looks cheaper than any index. The plan made then must still reach rows
/// through the indexes, or every later claim on that connection reads
/// every job.
#[tokio::test]
async fn plans_made_on_an_empty_table_still_reach_rows_through_indexes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute(tally::Open::Claims.sql()).await.unwrap();
    client.batch_execute(sql::CLAIM_SCAN_PLANNING).await.unwrap();
    let claim = generic_plan(&client, sql::LEASE_CLAIM.sql(), CLAIM_ARGS).await;
    let floor = generic_plan(&client, sql::LEASE_CLAIM_FLOOR, FLOOR_ARGS).await;
    client
        .batch_execute(sql::CLAIM_SCAN_PLANNING_RESET)
        .await
        .unwrap();
    let plans = [
        ("lease_claim", claim),
        ("lease_claim_floor", floor),
        (
            "lease_finish",
            generic_plan(
                &client,
                sql::LEASE_FINISH.sql(),
                "'{}'::uuid[], '{}'::bigint[], '{}'::text[], '{}'::jsonb[], '{}'::text[], '{}'::boolean[], '{}'::bigint[], '{}'::jsonb[], 1000, 60000",
            )
            .await,
        ),
        (
            "job_dependents_settled",
            generic_plan(&client, sql::JOB_DEPENDENTS_SETTLED.sql(), "'{}'::uuid[], '{}'::text[]").await,
        ),
    ];
    client.batch_execute("COMMIT").await.unwrap();
    for (name, plan) in plans {
        assert!(!plan.contains("Seq Scan"), "{name}:\n{plan}");
        if name == "lease_claim_floor" {
            assert!(plan.contains("jobs_claim_idx"), "{name}:\n{plan}");
        } else {
            assert!(plan.contains("jobs_pkey"), "{name}:\n{plan}");
        }
    }
}

#[tokio::test]
async fn claim_and_guarded_updates_cost_what_they_touch_not_the_table() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "ALTER TABLE jobs SET (autovacuum_enabled = false);
             INSERT INTO jobs (id, queue, payload, max_attempts)
             SELECT gen_random_uuid(), 'q' || (g % 3), to_jsonb(g), 4 FROM generate_series(1, 20000) g",
        )
        .await
        .unwrap();
    // No statistics yet (a new table), statistics that say every job is
    // claimable, then that every job is running: none may turn a batch's
    // statement into a scan of all the claimable or all the running jobs,
    // or into a nested loop over the batch for each of its rows.
    let states = [
        "SELECT 1",
        "ANALYZE jobs",
        "UPDATE jobs SET state = 'running', run_lease = 1, attempt = 1, owned_by = 'w',
             claimed_at = now(), lease_expires_at = now() + interval '1 hour';
         ANALYZE jobs",
    ];
    for set_up in states {
        client.batch_execute(set_up).await.unwrap();

        // A claim scans each queue's claim index in order and stops at the
        // slots: no sort of every claimable row. It then updates the rows it
        // locked through the primary key (one lookup per row), never by a
        // scan of the table: the coordinator runs it with its generic plan,
        // so this is the plan every claim gets (planned under the claim
        // transaction's settings, as the store plans it).
        client.batch_execute(tally::Open::Claims.sql()).await.unwrap();
        client.batch_execute(sql::CLAIM_SCAN_PLANNING).await.unwrap();
        let claim = generic_plan(&client, sql::LEASE_CLAIM.sql(), CLAIM_ARGS).await;
        // The claim floor's read walks the claim index from the floor, in
        // its order, and stops at the first entry: never another index and
        // a sort (with few claimable jobs in the statistics, an index on
        // (queue, state) looks cheaper, and reads the queue's history).
        let floor = generic_plan(&client, sql::LEASE_CLAIM_FLOOR, FLOOR_ARGS).await;
        client.batch_execute("COMMIT").await.unwrap();
        assert!(floor.contains("jobs_claim_idx"), "{floor}");
        assert!(!floor.contains("jobs_list_idx"), "{floor}");
        assert!(!floor.contains("Sort"), "{floor}");
        assert!(!claim.contains("jobs_list_idx"), "{claim}");
        assert!(claim.contains("Index Scan using jobs_claim_idx"), "{claim}");
        assert!(claim.contains("Index Scan using jobs_pkey on jobs j"), "{claim}");
        assert!(!claim.contains("Seq Scan on jobs"), "{claim}");
        assert!(!claim.contains("jobs_running_idx"), "{claim}");
        assert!(!claim.contains("Sort Key: jobs.priority"), "{claim}");
        assert!(!claim.contains("Join Filter"), "{claim}");
        assert!(!claim.contains("Hash Join"), "{claim}");
        assert!(!claim.contains("Merge Join"), "{claim}");

        // The guarded array updates reach their rows through the primary
        // key, one lookup per item: no semi-join re-reading the batch for
        // every row, no scan of the table or of every running job. The
        // heartbeat locks its rows first, in id order; the finish's update
        // locks as it goes, in the items' id order (a nested loop over
        // them), with no lock pass of its own. (The store runs the finish
        // under the claim's settings only, the second plan below; the
        // first shows it needs them for none of this.)
        let arrays = [
            (
                "lease_finish",
                sql::LEASE_FINISH.sql(),
                "'{}'::uuid[], '{}'::bigint[], '{}'::text[], '{}'::jsonb[], '{}'::text[], '{}'::boolean[], '{}'::bigint[], '{}'::jsonb[], 1000, 60000",
            ),
            (
                "lease_heartbeat",
                sql::LEASE_HEARTBEAT,
                "'{}'::uuid[], '{}'::bigint[], '{}'::jsonb[], 15000, 300000",
            ),
        ];
        for (name, statement, args) in arrays {
            let plan = generic_plan(&client, statement, args).await;
            // A finish whose batch carries claims runs in the claim's
            // transaction, under its settings: the same plan shape there.
            client.batch_execute(tally::Open::Claims.sql()).await.unwrap();
            let riding = generic_plan(&client, statement, args).await;
            client.batch_execute("COMMIT").await.unwrap();
            for plan in [plan, riding] {
                // The finish's own update (the plan before the attempt log;
                // dependents and follow-ups are later statements of its
                // transaction, only when there are some).
                let plan = match plan.find("CTE recorded") {
                    Some(end) if name == "lease_finish" => {
                        assert!(!plan.contains("job_dependencies"), "{name}:\n{plan}");
                        assert!(!plan.contains("Insert on jobs"), "{name}:\n{plan}");
                        plan[..end].to_owned()
                    }
                    _ => plan,
                };
                assert!(!plan.contains("Semi Join"), "{name}:\n{plan}");
                assert!(!plan.contains("Seq Scan on jobs"), "{name}:\n{plan}");
                assert!(!plan.contains("jobs_running_idx"), "{name}:\n{plan}");
                assert!(!plan.contains("Join Filter"), "{name}:\n{plan}");
                assert!(plan.contains("jobs_pkey"), "{name}:\n{plan}");
                if name == "lease_finish" {
                    assert!(!plan.contains("LockRows"), "{name}:\n{plan}");
                    assert!(plan.contains("Nested Loop"), "{name}:\n{plan}");
                    // The items drive the loop, in the order the store
                    // sorted them (id order): that order is its lock order.
                    let items = plan.find("Function Scan on t");
                    let rows = plan.find("Index Scan using jobs_pkey on jobs j");
                    assert!(
                        matches!((items, rows), (Some(i), Some(r)) if i < r),
                        "{name}:\n{plan}"
                    );
                    assert!(!plan.contains("Hash Join"), "{name}:\n{plan}");
                    assert!(!plan.contains("Merge Join"), "{name}:\n{plan}");
                }
            }
        }
    }
}

#[tokio::test]
async fn figures_listing_and_pruning_read_no_history() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    // A long history (done jobs of three queues) beside a few live jobs.
    for q in ["q0", "q1", "q2"] {
        db.insert_terminal_jobs(
            q,
            runlease_protocol::JobState::Done,
            10_000,
            std::time::Duration::from_secs(3600),
        )
        .await;
    }
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts)
             SELECT gen_random_uuid(), 'q' || (g % 3), to_jsonb(g), 4 FROM generate_series(1, 30) g",
        )
        .await
        .unwrap();
    // Without statistics (a new table) and with them, no statement of a
    // scrape, a listing page, a bulk chunk or a prune may read the table or
    // the whole history.
    for set_up in ["SELECT 1", "ANALYZE jobs"] {
        client.batch_execute(set_up).await.unwrap();
        let cases = [
            (
                "queue_live_counts",
                sql::QUEUE_LIVE_COUNTS,
                "",
                vec!["jobs_claim_idx", "jobs_running_idx"],
            ),
            (
                "job_list",
                sql::JOB_LIST,
                "'q1', '{done,failed}', NULL, 51, NULL",
                vec!["Index Scan Backward using jobs_list_idx"],
            ),
            (
                "job_list running",
                sql::JOB_LIST,
                "'q1', '{running}', NULL, 51, NULL",
                vec!["Index Scan Backward using jobs_running_idx"],
            ),
            (
                "lease_reap",
                sql::LEASE_REAP.sql(),
                "500, 300000",
                vec!["jobs_running_idx"],
            ),
            (
                "queue_running_count",
                sql::QUEUE_RUNNING_COUNT,
                "'q1'",
                vec!["jobs_running_idx"],
            ),
            (
                "queue_held_back",
                sql::QUEUE_HELD_BACK,
                "'q1'",
                vec!["jobs_running_idx"],
            ),
            (
                "job_prune",
                sql::JOB_PRUNE.sql(),
                "'q1', 'done', 60000, 1000",
                vec!["jobs_prune_idx"],
            ),
            (
                "job_prune_queues",
                sql::JOB_PRUNE_QUEUES,
                "",
                vec!["jobs_prune_idx"],
            ),
            (
                "job_match",
                sql::JOB_MATCH,
                "'{}'::uuid[], 'q1', '{failed}', NULL",
                vec!["jobs_pkey"],
            ),
            (
                "job_retry",
                sql::JOB_RETRY.sql(),
                "'{}'::uuid[], NULL",
                vec!["jobs_pkey"],
            ),
            (
                "job_cancel",
                sql::JOB_CANCEL.sql(),
                "'{}'::uuid[], NULL",
                vec!["jobs_pkey"],
            ),
            (
                "job_delete",
                sql::JOB_DELETE.sql(),
                "'{}'::uuid[], NULL",
                vec!["jobs_pkey"],
            ),
        ];
        for (name, statement, args, indexes) in cases {
            let plan = if args.is_empty() {
                let rows = client
                    .query(&format!("EXPLAIN (COSTS OFF) {statement}"), &[])
                    .await
                    .unwrap();
                rows.iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect::<Vec<_>>()
                    .join("\n")
            } else {
                generic_plan(&client, statement, args).await
            };
            assert!(
                !plan.contains("Seq Scan on jobs"),
                "{name} after {set_up}:\n{plan}"
            );
            for index in indexes {
                assert!(
                    plan.contains(index),
                    "{name} after {set_up} uses {index}:\n{plan}"
                );
            }
        }
        // The cursor is the start of the listing's range scan, not a filter
        // over the newer rows.
        let page = generic_plan(
            &client,
            sql::JOB_LIST,
            "'q1', '{done}', '00000000-0000-7000-8000-000000000000', 51, NULL",
        )
        .await;
        assert!(
            page.contains("Index Cond: ((ROW(queue, state, id) < ROW($1, (s.state)::job_state, COALESCE($3"),
            "{page}"
        );
    }
}

#[tokio::test]
async fn the_operations_migration_applies_to_a_version_2_database_without_losing_a_row() {
    use runlease_coordinator::store::migrate::migrate;

    let db = runlease_tests::UpgradeDb::at("runlease_v2", 2).await;
    let url = db.url.clone();
    let client = db.client().await;
    // Rows as a version 2 coordinator leaves them: every state, attempts
    // ended every way, one job claimed twice.
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, state, payload, max_attempts, attempt, run_lease, claimed_at,
                               owned_by, lease_expires_at, result, error, finished_at, cancel_requested_at)
             SELECT gen_random_uuid(), q, s::job_state, jsonb_build_object('i', i), 3,
                    CASE WHEN s IN ('queued', 'enqueue_failed') THEN 0 ELSE 1 END,
                    CASE WHEN s IN ('queued', 'enqueue_failed') THEN 0 ELSE 2 END,
                    CASE WHEN s IN ('queued', 'enqueue_failed') THEN NULL ELSE now() END,
                    CASE WHEN s IN ('queued', 'enqueue_failed') THEN NULL ELSE 'w' END,
                    CASE WHEN s = 'running' THEN now() + interval '1 minute' END,
                    CASE WHEN s = 'done' THEN '\"r\"'::jsonb END,
                    CASE WHEN s IN ('failed', 'cancelled') THEN 'boom' END,
                    CASE WHEN s IN ('done', 'failed', 'cancelled') THEN now() END,
                    CASE WHEN s = 'running' AND i % 2 = 0 THEN now() END
             FROM unnest(ARRAY['a', 'b']) AS q,
                  unnest(ARRAY['queued', 'running', 'done', 'failed', 'cancelled', 'enqueue_failed']) AS s,
                  generate_series(1, 4) AS i;
             INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
             SELECT id, 1, 'w', now(), now(), 'lease_expired', 'lease expired', 'queued'
             FROM jobs WHERE run_lease = 2;
             INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
             SELECT id, 2, 'w', now(), now(),
                    CASE state WHEN 'done' THEN 'completed' WHEN 'failed' THEN 'failed' ELSE 'cancelled' END::attempt_outcome,
                    error, state
             FROM jobs WHERE state IN ('done', 'failed', 'cancelled');",
        )
        .await
        .unwrap();
    // The version 2 columns of every row (later migrations add columns).
    let snapshot = "SELECT md5(string_agg((to_jsonb(j) - 'concurrency_key' - 'traceparent' - 'final_outcome'
                                             - 'dependencies' - 'dependencies_pending' - 'dependents'
                                             - 'on_dependency_failure'
                                             - 'backoff_base_ms' - 'backoff_max_ms' - 'backoff_factor'
                                             - 'backoff_jitter' - 'retry_window_ms' - 'first_claimed_at'
                                             - 'retry_reason')::text,
                                            ',' ORDER BY j.id)) FROM jobs j";
    let attempts = "SELECT md5(string_agg((to_jsonb(a) - 'retry_at' - 'retry_reason')::text, ',' ORDER BY a.job_id, a.run_lease))
                    FROM job_attempts a";
    let before: (String, String) = (
        client.query_one(snapshot, &[]).await.unwrap().get(0),
        client.query_one(attempts, &[]).await.unwrap().get(0),
    );

    let later: Vec<i32> = runlease_coordinator::store::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| *v > 2)
        .collect();
    assert_eq!(migrate(&db.pool).await.unwrap(), later);
    let after: (String, String) = (
        client.query_one(snapshot, &[]).await.unwrap().get(0),
        client.query_one(attempts, &[]).await.unwrap().get(0),
    );
    assert_eq!(before, after, "every job and attempt row is unchanged");

    // The figures of the old rows come from the tallies the migration
    // counted, the live ones from the indexes.
    let mut config = test_config(&url);
    config.database.pool_size = 2;
    let c = TestCoordinator::start_config(config).await;
    let (_, queues) = c.api.get("/v1/queues").await;
    let queues = queues["queues"].as_array().unwrap().clone();
    assert_eq!(queues.len(), 2);
    for q in &queues {
        for state in [
            "queued",
            "running",
            "done",
            "failed",
            "cancelled",
            "enqueue_failed",
        ] {
            assert_eq!(
                q["counts"][state],
                serde_json::json!(4),
                "{state} of {}",
                q["queue"]
            );
        }
        // Every job but the queued ones was claimed twice: its first attempt
        // expired and was retried.
        assert_eq!(q["lease_expiries"], serde_json::json!(16));
        assert_eq!(q["retries"], serde_json::json!(16));
    }
    // Listing and bulk actions work on the old rows.
    let (status, page) = c.api.get("/v1/jobs?queue=a&state=failed").await;
    assert_eq!(status, 200);
    assert_eq!(page["jobs"].as_array().unwrap().len(), 4);
    let (_, retried) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &serde_json::json!({"action": "retry", "queue": "a", "states": ["failed"]}),
        )
        .await;
    assert_eq!(retried, serde_json::json!({"matched": 4, "changed": 4}));
    let (_, a) = c.api.get("/v1/queues/a").await;
    assert_eq!(a["counts"]["failed"], serde_json::json!(0));
    assert_eq!(a["counts"]["queued"], serde_json::json!(8));
    c.stop().await.unwrap();
    drop(client);
    db.drop().await;
}

#[tokio::test]
async fn a_percent_encoded_url_with_awkward_password_and_database_name_migrates() {
    use runlease_coordinator::store::connect::{DatabaseTarget, quote_ident};
    use tokio_postgres::config::Host;

    fn encode(text: &str) -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect()
    }

    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let role = format!("runlease_pw_{suffix}");
    let password = "p@ss&w?rd%/x";
    let name = format!("rl @&?%/ {suffix}");
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {} LOGIN CREATEDB PASSWORD '{password}'",
            quote_ident(&role)
        ))
        .await
        .unwrap();
    // The test server's host and port, from the harness's URL.
    let server = DatabaseTarget::parse(&runlease_tests::admin_url()).unwrap().pg;
    let host = match &server.get_hosts()[0] {
        Host::Tcp(h) if h.contains(':') => format!("[{h}]"),
        Host::Tcp(h) => encode(h),
        Host::Unix(path) => encode(path.to_str().unwrap()),
    };
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let url = format!(
        "postgres://{}:{}@{host}:{port}/{}?application_name=ignored%26x",
        encode(&role),
        encode(password),
        encode(&name)
    );

    let migrated = runlease_coordinator::migrate(&test_config(&url)).await;
    let mut check = server.clone();
    check.dbname(&name);
    let (client, conn) = check.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let table = client
        .query_one("SELECT to_regclass('runlease_migrations')::text", &[])
        .await
        .unwrap()
        .get::<_, Option<String>>(0);
    let owner: String = admin
        .query_one(
            "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    drop(client);
    for drop in [
        format!("DROP DATABASE {} WITH (FORCE)", quote_ident(&name)),
        format!("DROP ROLE {}", quote_ident(&role)),
    ] {
        admin.batch_execute(&drop).await.unwrap();
    }

    migrated.unwrap();
    assert_eq!(table.as_deref(), Some("runlease_migrations"));
    assert_eq!(owner, role, "the database was created as the URL's user");
}

#[tokio::test]
async fn a_finish_and_the_claims_riding_its_transaction_commit_together_or_not_at_all() {
    use runlease_coordinator::store::leases::{ClaimGroup, Ending, LeaseRef, Outcome};
    use runlease_protocol::{JobState, QueueName, WorkerId};

    let (_db, store, client) = migrated().await;
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts, priority)
             VALUES (gen_random_uuid(), 'q', '\"a\"', 4, 0), (gen_random_uuid(), 'q', '\"b\"', 4, 1)",
        )
        .await
        .unwrap();
    let queues = [QueueName::new("q").unwrap()];
    let (a, b, c) = (
        WorkerId::new("a").unwrap(),
        WorkerId::new("b").unwrap(),
        WorkerId::new("c").unwrap(),
    );
    let first = store.claim(&queues, &[&a], None, &[]).await.unwrap().rows;
    assert_eq!(first.len(), 1);
    let job_a = &first[0].1;

    // Worker a releases its job; worker b's claim rides the same transaction,
    // after the finish: it sees the release and takes both jobs.
    let release = [(
        LeaseRef {
            job_id: job_a.id,
            run_lease: job_a.run_lease,
            worker_id: a.clone(),
        },
        Outcome::Release {
            progress: None,
            delay_ms: None,
        },
    )];
    let items: Vec<_> = release.iter().collect();
    let claims = [ClaimGroup {
        queues: &queues,
        slots: vec![&b, &b, &b],
        time_left_ms: None,
    }];
    let (endings, claimed) = store.finish_then_claim(&items, &claims).await.unwrap();
    assert!(
        matches!(&endings[..], [Ending::Applied(f)] if f.state == JobState::Queued),
        "{endings:?}"
    );
    assert_eq!(claimed.len(), 1);
    let got: Vec<_> = claimed[0]
        .iter()
        .map(|(slot, row)| (*slot, row.id, row.run_lease.0))
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.contains(&(0, job_a.id, 2)),
        "the released job, under a new lease: {got:?}"
    );

    // A finish that fails (PostgreSQL refuses a NUL in text) takes the
    // claims of its transaction with it: the new job stays queued, the
    // running ones keep their leases.
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts) VALUES (gen_random_uuid(), 'q', '\"c\"', 4)",
        )
        .await
        .unwrap();
    let (slot, held) = &claimed[0][0];
    assert_eq!(*slot, 0);
    let failing = [(
        LeaseRef {
            job_id: held.id,
            run_lease: held.run_lease,
            worker_id: b.clone(),
        },
        Outcome::Fail {
            error: "nul \0 byte".into(),
            retryable: false,
            retry_after_ms: None,
        },
    )];
    let items: Vec<_> = failing.iter().collect();
    let claims = [ClaimGroup {
        queues: &queues,
        slots: vec![&c],
        time_left_ms: None,
    }];
    assert!(store.finish_then_claim(&items, &claims).await.is_err());
    let states: Vec<(String, String)> = client
        .query(
            "SELECT payload #>> '{}', state::text FROM jobs ORDER BY payload #>> '{}'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected = [("a", "running"), ("b", "running"), ("c", "queued")];
    assert_eq!(
        states,
        expected.map(|(p, s)| (p.to_owned(), s.to_owned())).to_vec()
    );
}

#[tokio::test]
async fn a_limited_claim_riding_a_finish_takes_only_what_the_limits_allow() {
    use runlease_coordinator::store::leases::{ClaimGroup, Ending, LeaseRef, LimitKind, Outcome};
    use runlease_protocol::{QueueName, WorkerId};

    let (_db, store, client) = migrated().await;
    client
        .batch_execute(
            "INSERT INTO queue_settings (queue, max_running) VALUES ('lim', 2);
             INSERT INTO jobs (id, queue, payload, max_attempts)
             SELECT gen_random_uuid(), 'lim', to_jsonb(i), 4 FROM generate_series(1, 5) AS i",
        )
        .await
        .unwrap();
    let queues = [QueueName::new("lim").unwrap()];
    let (a, b) = (WorkerId::new("a").unwrap(), WorkerId::new("b").unwrap());
    // A claim of the limited queue alone (no shared statement): two of three.
    let first = store.claim(&queues, &[&a, &a, &a], None, &queues).await.unwrap();
    assert_eq!(first.rows.len(), 2, "{:?}", first.rows);
    assert!(
        first
            .held_back
            .iter()
            .any(|(_, kind, _)| *kind == LimitKind::MaxRunning)
    );
    let running = |rows: &[(usize, runlease_coordinator::store::rows::ClaimedJob)], i: usize| LeaseRef {
        job_id: rows[i].1.id,
        run_lease: rows[i].1.run_lease,
        worker_id: a.clone(),
    };
    let complete = |lease| {
        (
            lease,
            Outcome::Complete {
                result: serde_json::json!(1),
            },
        )
    };

    // Riding a finish without the limited path, the claim takes nothing:
    // the shared statement skips a limited queue.
    let done = [complete(running(&first.rows, 0))];
    let items: Vec<_> = done.iter().collect();
    let claims = [ClaimGroup {
        queues: &queues,
        slots: vec![&b, &b, &b],
        time_left_ms: None,
    }];
    let (endings, claimed) = store.finish_then_claim(&items, &claims).await.unwrap();
    assert!(matches!(&endings[..], [Ending::Applied(_)]), "{endings:?}");
    assert!(claimed[0].is_empty(), "{claimed:?}");

    // With it, the slots the two finishes freed and no more: two of three.
    let done = [complete(running(&first.rows, 1))];
    let items: Vec<_> = done.iter().collect();
    let (endings, claimed, held_back) = store
        .finish_then_claim_limited(&items, &claims, &[queues.to_vec()])
        .await
        .unwrap();
    assert!(matches!(&endings[..], [Ending::Applied(_)]), "{endings:?}");
    assert_eq!(claimed[0].len(), 2, "{claimed:?}");
    assert!(
        held_back
            .iter()
            .any(|(q, kind, _)| *q == queues[0] && *kind == LimitKind::MaxRunning)
    );
    let (_, more, _) = store
        .finish_then_claim_limited(&[], &claims, &[queues.to_vec()])
        .await
        .unwrap();
    assert!(more[0].is_empty(), "past max_running: {more:?}");
    let running: i64 = client
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = 'lim' AND state = 'running'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(running, 2);
}

/// Enqueues of a few jobs run their insert under the generic plan their
/// connection made at its first: left to choose, PostgreSQL plans a batch
/// of a few jobs again at every execution (its generic plan's guess of ten
/// rows from each array costs more than the few a small batch holds). The
/// plan reaches the queue's settings through their primary key, made as
/// it is here on an empty table.
#[tokio::test]
async fn enqueues_insert_under_one_generic_plan() {
    use runlease_coordinator::store::jobs::NewJob;

    let db = TestDb::new().await;
    let mut config = test_config(&db.url);
    config.database.pool_size = 1;
    let store = runlease_coordinator::connect_and_migrate(&config).await.unwrap();
    let job = || new_job(serde_json::json!({"n": 1}));
    for size in [1, 3, 2, 1, 4, 1, 2, 3] {
        let jobs: Vec<NewJob> = (0..size).map(|_| job()).collect();
        assert_eq!(store.enqueue(&jobs).await.unwrap().len(), size);
    }
    // The pool's one connection, the one every enqueue above ran on.
    let conn = store.pool().get().await.unwrap();
    let row = conn
        .query_one(
            "SELECT count(*), coalesce(sum(generic_plans), 0)::bigint, coalesce(sum(custom_plans), 0)::bigint
             FROM pg_prepared_statements WHERE statement = $1",
            &[&sql::JOB_ENQUEUE.sql()],
        )
        .await
        .unwrap();
    let (statements, generic, custom): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(statements, 1, "one insert statement prepared");
    assert_eq!(custom, 0, "no execution planned for its own parameters");
    assert_eq!(generic, 8, "every execution ran the generic plan");
    let plan = generic_plan(&conn, sql::JOB_ENQUEUE.sql(), &["NULL"; 23].join(", ")).await;
    assert!(plan.contains("queue_settings_pkey"), "{plan}");
}

/// A store over a fresh database whose job "held" (queue `q`) runs under
/// worker `a`, with what completes it, and worker `b` to claim after it.
struct Held {
    db: TestDb,
    store: runlease_coordinator::store::Store,
    client: tokio_postgres::Client,
    queues: [runlease_protocol::QueueName; 1],
    b: runlease_protocol::WorkerId,
    complete: [(
        runlease_coordinator::store::leases::LeaseRef,
        runlease_coordinator::store::leases::Outcome,
    ); 1],
    run_lease: i64,
}

impl Held {
    /// Completes the held job and, in the same transaction, claims one job
    /// of `q` for worker `b`.
    async fn complete_then_claim(
        &self,
    ) -> Result<
        (
            Vec<runlease_coordinator::store::leases::Ending>,
            Vec<Vec<(usize, runlease_coordinator::store::rows::ClaimedJob)>>,
        ),
        runlease_coordinator::store::StoreError,
    > {
        let items: Vec<_> = self.complete.iter().collect();
        let claims = [runlease_coordinator::store::leases::ClaimGroup {
            queues: &self.queues,
            slots: vec![&self.b],
            time_left_ms: None,
        }];
        self.store.finish_then_claim(&items, &claims).await
    }

    async fn new() -> Self {
        use runlease_coordinator::store::leases::{LeaseRef, Outcome};
        use runlease_protocol::{QueueName, WorkerId};

        let (db, store, client) = migrated().await;
        client
            .batch_execute(
                "INSERT INTO jobs (id, queue, payload, max_attempts) VALUES (gen_random_uuid(), 'q', '\"held\"', 4)",
            )
            .await
            .unwrap();
        let queues = [QueueName::new("q").unwrap()];
        let a = WorkerId::new("a").unwrap();
        let held = store.claim(&queues, &[&a], None, &[]).await.unwrap().rows;
        let held = &held[0].1;
        let complete = [(
            LeaseRef {
                job_id: held.id,
                run_lease: held.run_lease,
                worker_id: a,
            },
            Outcome::Complete {
                result: serde_json::json!(1),
            },
        )];
        let run_lease = held.run_lease.0;
        Self {
            db,
            store,
            client,
            queues,
            b: WorkerId::new("b").unwrap(),
            complete,
            run_lease,
        }
    }
}

/// A trigger that refuses to start the job whose payload is `"refused"`,
/// so that a claim PostgreSQL refuses can be made on purpose.
const REFUSE_TO_START: &str = "
    CREATE FUNCTION refuse_to_start() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.state = 'running' AND NEW.payload = '\"refused\"' THEN
            RAISE EXCEPTION 'this job may not start';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER refuse_to_start BEFORE UPDATE ON jobs
        FOR EACH ROW EXECUTE FUNCTION refuse_to_start();";

#[tokio::test]
async fn a_claim_refused_in_the_round_trip_of_the_commit_takes_its_transaction_with_it() {
    let held = Held::new().await;
    let (db, client) = (&held.db, &held.client);
    client.batch_execute(REFUSE_TO_START).await.unwrap();
    client
        .batch_execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts) VALUES (gen_random_uuid(), 'q', '\"refused\"', 4)",
        )
        .await
        .unwrap();

    // The complete, its tally and the claim go in one transaction whose
    // claim, sent with the COMMIT, is refused: nothing of it stands.
    let refused = held.complete_then_claim().await.unwrap_err();
    assert!(refused.to_string().contains("may not start"), "{refused}");
    let states: Vec<(String, String, i64)> = client
        .query(
            "SELECT payload #>> '{}', state::text, run_lease FROM jobs ORDER BY payload #>> '{}'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected = [("held", "running", held.run_lease), ("refused", "queued", 0)];
    assert_eq!(
        states,
        expected.map(|(p, s, l)| (p.to_owned(), s.to_owned(), l)).to_vec()
    );
    let tallied = db.scalar("SELECT count(*) FROM job_tallies", &[]).await;
    assert_eq!(tallied, 0, "no tally of the complete that was rolled back");

    // The same transaction without the refused job commits all of it,
    // its tally with it.
    client
        .batch_execute("DELETE FROM jobs WHERE payload = '\"refused\"'")
        .await
        .unwrap();
    let (endings, claimed) = held.complete_then_claim().await.unwrap();
    assert_eq!(endings.len(), 1);
    assert!(claimed[0].is_empty(), "{claimed:?}");
    let done = "SELECT coalesce(sum(n), 0)::bigint FROM job_tallies WHERE queue = 'q' AND tally = 'done'";
    assert_eq!(db.scalar(done, &[]).await, 1);
}

#[tokio::test]
async fn an_enqueue_whose_claim_is_refused_in_the_round_trip_of_the_commit_writes_nothing() {
    use runlease_coordinator::store::leases::ClaimGroup;
    use runlease_protocol::{QueueName, WorkerId};

    let (db, store, client) = migrated().await;
    client.batch_execute(REFUSE_TO_START).await.unwrap();
    let job = |payload: &str| new_job(serde_json::json!(payload));
    let queues = [QueueName::new("q").unwrap()];
    let worker = WorkerId::new("w").unwrap();
    let claims = [ClaimGroup {
        queues: &queues,
        slots: vec![&worker],
        time_left_ms: None,
    }];

    let refused = store
        .enqueue_then_claim(&[job("refused")], &claims)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("may not start"), "{refused}");
    let rows = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(rows, 0, "the enqueue rolled back with its claim");

    let (answers, claimed) = store.enqueue_then_claim(&[job("fine")], &claims).await.unwrap();
    assert_eq!(answers.len(), 1);
    let claimed = claimed.expect("the leases were answered");
    assert_eq!(claimed[0].len(), 1, "the parked claimer got the new job");
    assert_eq!(claimed[0][0].1.id, answers[0].job.id);
}

#[tokio::test]
async fn a_finishs_commit_is_on_its_way_with_its_claims() {
    let held = Held::new().await;
    let client = &held.client;
    // Starting the job "slow" takes 3 s.
    client
        .batch_execute(
            "CREATE FUNCTION slow_start() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.state = 'running' AND NEW.payload = '\"slow\"' THEN PERFORM pg_sleep(3); END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER slow_start BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION slow_start();
             INSERT INTO jobs (id, queue, payload, max_attempts) VALUES (gen_random_uuid(), 'q', '\"slow\"', 4);",
        )
        .await
        .unwrap();

    // The caller stops waiting while the claim runs: its COMMIT was sent
    // with it, so the transaction commits all the same once the claim ends.
    let call = held.complete_then_claim();
    let gave_up = tokio::time::timeout(std::time::Duration::from_secs(1), call).await;
    assert!(gave_up.is_err(), "the claim takes 3 s");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let states: Vec<String> = client
            .query("SELECT state::text FROM jobs ORDER BY payload #>> '{}'", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if states == ["done", "running"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never committed: {states:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_last_statements_of_a_transaction_may_not_change_tallies_fail_to_send_or_come_late() {
    use runlease_coordinator::store::tally::{Changes, Open, Tallied};

    const DELETE: Changes = Changes::new("DELETE FROM jobs RETURNING queue, state", tally::deleted);
    let Held {
        db: _db,
        store,
        client,
        ..
    } = Held::new().await;
    let conn = store.pool().get().await.unwrap();
    let text = conn.prepare("SELECT $1::text").await.unwrap();

    // A statement that changes tallies is not sent: everything rolls back.
    let tx = Tallied::new(&conn);
    raise_priority_in(&tx, Open::Deletes).await;
    let delete = tx.prepare(&DELETE).await.unwrap();
    let refused = tx.commit_behind(tx.run(&delete, &[])).await.unwrap_err();
    assert!(refused.to_string().contains("changes tallies"), "{refused}");
    assert_eq!(
        jobs_and_priority(&client).await,
        (1, 0),
        "neither the delete nor the update stands"
    );
    assert!(
        idle(&conn, &client).await,
        "the connection is left outside any transaction"
    );

    // A parameter that cannot be encoded fails before it is sent: the
    // transaction rolls back.
    let tx = Tallied::new(&conn);
    raise_priority_in(&tx, Open::States).await;
    let unsent = tx.commit_behind(tx.read(&text, &[&5_i32])).await.unwrap_err();
    assert!(!unsent.to_string().is_empty());
    assert_eq!(
        jobs_and_priority(&client).await,
        (1, 0),
        "the update was rolled back"
    );
    assert!(idle(&conn, &client).await);

    // A statement sent after the first poll would run after the COMMIT,
    // outside the transaction: it is refused; what came before commits.
    let tx = Tallied::new(&conn);
    raise_priority_in(&tx, Open::States).await;
    let late = tx
        .commit_behind(async {
            tokio::task::yield_now().await;
            tx.read(&text, &[&"late"]).await
        })
        .await
        .unwrap_err();
    assert!(
        late.to_string().contains("after its transaction's COMMIT"),
        "{late}"
    );
    assert_eq!(jobs_and_priority(&client).await, (1, 5));
    assert!(idle(&conn, &client).await);

    // Statements that change no tally go with the COMMIT and answer.
    let tx = Tallied::new(&conn);
    tx.begin(Open::States).await.unwrap();
    let rows = tx.commit_behind(tx.read(&text, &[&"sent"])).await.unwrap();
    assert_eq!(rows[0].get::<_, String>(0), "sent");
    assert!(idle(&conn, &client).await);
}

/// Opens `tx` as `open` and raises every job's priority to 5 in it.
async fn raise_priority_in(tx: &tally::Tallied<'_>, open: tally::Open) {
    tx.begin(open).await.unwrap();
    tx.client()
        .batch_execute("UPDATE jobs SET priority = 5")
        .await
        .unwrap();
}

/// The jobs and their highest priority.
async fn jobs_and_priority(client: &tokio_postgres::Client) -> (i64, i32) {
    let row = client
        .query_one("SELECT count(*), max(priority) FROM jobs", &[])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Whether `conn` is idle outside any transaction, as `client` sees it.
async fn idle(conn: &tokio_postgres::Client, client: &tokio_postgres::Client) -> bool {
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let state: String = client
        .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0);
    state == "idle"
}

/// A job of queue `q` with `payload` and every other field left to its
/// default.
/// A fresh database, a store that migrated it, and a client of it: the
/// opening of the store tests that drive the store itself.
async fn migrated() -> (TestDb, runlease_coordinator::store::Store, tokio_postgres::Client) {
    let db = TestDb::new().await;
    let store = runlease_coordinator::connect_and_migrate(&test_config(&db.url))
        .await
        .unwrap();
    let client = db.client().await;
    (db, store, client)
}

fn new_job(payload: serde_json::Value) -> runlease_coordinator::store::jobs::NewJob {
    runlease_coordinator::store::jobs::NewJob {
        id: runlease_protocol::JobId::new(),
        queue: runlease_protocol::QueueName::new("q").unwrap(),
        payload,
        priority: 0,
        run_at: None,
        delay_ms: None,
        max_attempts: None,
        backoff: Default::default(),
        retry_window_ms: None,
        timeout_ms: None,
        idempotency_key: None,
        concurrency_key: None,
        traceparent: None,
        dependencies: None,
    }
}
