//! Test harness for runlease's end-to-end tests: a fresh PostgreSQL database
//! per test, cloned from a migrated template, and a real coordinator on port 0.
//!
//! - [`TestDb`]: one database per test, dropped (forcibly) when the test ends.
//! - [`UpgradeDb`]: a database of a test's own at an older schema version,
//!   for tests of an upgrade.
//! - [`TestCoordinator`]: the coordinator library serving on a loopback port.
//! - [`Api`]: a small JSON-over-HTTP caller that returns status and body.
//! - [`cli`]: the `runlease` CLI binary as a child process, and checks of
//!   what it printed and how it exited.
//! - [`CoordinatorProcess`]: the coordinator binary as a child process.
//! - [`Proxy`]: a TCP proxy a test can cut, heal, or make lose an answer.
//! - [`TestSqs`]: moto's SQS server of the test's own.
//! - [`TestRedis`]: a redis-server of the test's own, to stop and restart.
//! - [`LambdaEmulator`]: the example Lambda function under cargo-lambda's
//!   Runtime API emulator; the events Lambda hands a function.
//! - [`model`]: a model of the lease protocol, checked exhaustively for
//!   small bounds (`tests/tests/model.rs`, `docs/model.md`).
//!
//! PostgreSQL must be running (`RUNLEASE_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`); a test fails loudly, never
//! skips, when it is not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod api;
pub mod cli;
pub mod lambda;
pub mod model;
pub mod pg_cluster;
pub mod process;
pub mod proxy;
pub mod raw;
pub mod redis;
pub mod sqs;
pub mod webhooks;

use std::net::SocketAddr;
use std::time::Duration;

use runlease_coordinator::config::Config;
use runlease_coordinator::store::Store;
use runlease_coordinator::store::connect::quote_ident;
use runlease_coordinator::store::migrate::MIGRATIONS;
use runlease_coordinator::store::tally::Open;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

pub use api::Api;
pub use lambda::LambdaEmulator;
pub use pg_cluster::{PgCluster, Replication};
pub use process::CoordinatorProcess;
pub use proxy::Proxy;
pub use redis::TestRedis;
pub use sqs::TestSqs;

/// The shared secret test coordinators sign lease tokens with (at least
/// 32 bytes, as the coordinator requires).
pub const TEST_SECRET: &str = "runlease-test-secret-0123456789abcdef";

/// A claim re-check interval far longer than any wake-up test runs (the
/// most `RUNLEASE_CLAIM_RECHECK_MS` accepts; jittered, it never fires before
/// 45 s): a parked claim or read answered within [`WOKEN_WITHIN`] was woken,
/// not found by its timer, so such a test fails when wake-ups break.
pub const SLOW_RECHECK_MS: u64 = 60_000;

/// How soon a woken long-poll must answer in a wake-up test: generous for a
/// loaded machine, and well before the [`SLOW_RECHECK_MS`] timer could fire.
pub const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// URL of the maintenance database the harness creates test databases from.
pub fn admin_url() -> String {
    std::env::var("RUNLEASE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// URL of database `db` on the test server.
pub fn url_for(db: &str) -> String {
    let admin = admin_url();
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("?{q}")),
        None => (admin.clone(), String::new()),
    };
    let server = base.rsplit_once('/').map_or(base.as_str(), |(s, _)| s);
    format!("{server}/{db}{query}")
}

/// Connects to the maintenance database, or fails the test with what to do.
pub async fn admin() -> tokio_postgres::Client {
    let url = admin_url();
    let (client, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL is not reachable at {url}: {e}. Start it (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) or set RUNLEASE_TEST_DATABASE_URL"
        )
    });
    tokio::spawn(conn);
    client
}

/// Name of the template for the current migrations: a new migration makes a new template.
fn template_name() -> String {
    let mut hash = Sha256::new();
    for m in MIGRATIONS {
        hash.update(m.sql.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("runlease_tpl_{hex}")
}

/// Creates the migrated template once per machine (under an advisory lock, so
/// parallel test processes agree), built under a temporary name and renamed
/// when complete, so a crash never leaves a half-made template.
async fn ensure_template(admin: &tokio_postgres::Client) -> String {
    let name = template_name();
    admin
        .execute("SELECT pg_advisory_lock(7406321)", &[])
        .await
        .unwrap();
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .unwrap()
        .is_some();
    if !exists {
        let building = format!("{name}_building");
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(&building)
            ))
            .await
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&building)))
            .await
            .unwrap();
        let mut config = test_config(&url_for(&building));
        config.database.pool_size = 1;
        let store = runlease_coordinator::connect_and_migrate(&config).await.unwrap();
        store.pool().close();
        drop(store);
        // Wait for the pooled connection to go away before renaming.
        for _ in 0..100 {
            let busy: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&building],
                )
                .await
                .unwrap()
                .get(0);
            if busy == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} RENAME TO {}",
                quote_ident(&building),
                quote_ident(&name)
            ))
            .await
            .unwrap();
    }
    admin
        .execute("SELECT pg_advisory_unlock(7406321)", &[])
        .await
        .unwrap();
    name
}

/// Settings for a test coordinator: quiet timers, a fixed secret, no keys.
pub fn test_config(database_url: &str) -> Config {
    let mut config = Config::from_env().expect("RUNLEASE_* variables in the environment must be valid");
    config.database.url = database_url.to_owned();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.keys.secret = Some(TEST_SECRET.to_owned());
    // The machine's Redis, with channels of this test's own.
    let db = database_url
        .rsplit('/')
        .next()
        .unwrap_or("x")
        .split('?')
        .next()
        .unwrap_or("x");
    config.redis.prefix = format!("runlease-test:{db}");
    config.keys.api_keys = None;
    config.leases.ttl = std::time::Duration::from_millis(15_000);
    config.leases.heartbeat_interval = std::time::Duration::from_millis(5_000);
    // Tests drive the reaper with `run_once` unless they ask for the loop.
    config.leases.reaper_interval = std::time::Duration::from_millis(3_600_000);
    config.database.pool_size = 8;
    config.server.shutdown_grace = std::time::Duration::from_millis(10_000);
    config
}

/// A database of a test's own migrated to an older schema version, for a
/// test of the upgrade from it (not from the template: that one holds
/// every migration). [`UpgradeDb::drop`] drops it.
pub struct UpgradeDb {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// A pool over it, for the migrator.
    pub pool: runlease_coordinator::store::connect::Pool,
}

impl UpgradeDb {
    /// A new database, named after `prefix`, with migrations 1 to `version` applied.
    pub async fn at(prefix: &str, version: i32) -> Self {
        use runlease_coordinator::store::connect::DatabaseTarget;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let url = url_for(&name);
        let target = DatabaseTarget::parse(&url).unwrap();
        target.create_database_if_missing().await.unwrap();
        let pool = target.pool(2, test_config(&url).database.deadlines()).unwrap();
        let applied = runlease_coordinator::store::migrate::migrate_to(&pool, version)
            .await
            .unwrap();
        assert_eq!(applied, (1..=version).collect::<Vec<_>>());
        Self { name, url, pool }
    }

    /// A plain connection to it.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// Drops it (closing what is still connected).
    pub async fn drop(self) {
        drop(self.pool);
        admin()
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", quote_ident(&self.name)))
            .await
            .unwrap();
    }
}

/// A database of its own for one test, cloned from the migrated template.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// URL to reach it.
    pub url: String,
}

impl TestDb {
    /// Clones the template into a fresh database.
    pub async fn new() -> Self {
        let admin = admin().await;
        let template = ensure_template(&admin).await;
        let name = format!("runlease_t_{}", uuid::Uuid::new_v4().simple());
        let sql = format!(
            "CREATE DATABASE {} TEMPLATE {}",
            quote_ident(&name),
            quote_ident(&template)
        );
        let mut tries = 0;
        loop {
            match admin.batch_execute(&sql).await {
                Ok(()) => break,
                // Another process may still be connected to the template for a moment.
                Err(e) if tries < 50 && e.to_string().contains("being accessed by other users") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot create test database from {template}: {e}"),
            }
        }
        Self {
            url: url_for(&name),
            name,
        }
    }

    /// A new database with nothing in it (not even the schema): for a
    /// coordinator that migrates it itself, such as another release's.
    pub async fn empty() -> Self {
        let admin = admin().await;
        let name = format!("runlease_t_{}", uuid::Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&name)))
            .await
            .unwrap_or_else(|e| panic!("cannot create database {name}: {e}"));
        Self {
            url: url_for(&name),
            name,
        }
    }

    /// A plain connection to this database, for inspecting and arranging rows.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// The `bigint` a one-value query answers (a count, usually).
    pub async fn scalar(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> i64 {
        self.client().await.query_one(sql, params).await.unwrap().get(0)
    }

    /// Inserts `n` jobs on `queue` that reached terminal `state` `finished_ago`
    /// ago, each with one ended attempt, as a coordinator would have left
    /// them (inserted queued, then moved to the state by a statement that
    /// adds them to the tallies itself, in a transaction marked as the
    /// coordinator marks its own; a done or failed job's attempt on its row,
    /// a cancelled one's in `job_attempt_log`). Answers their ids (UUIDv7,
    /// oldest first).
    pub async fn insert_terminal_jobs(
        &self,
        queue: &str,
        state: runlease_protocol::JobState,
        n: usize,
        finished_ago: Duration,
    ) -> Vec<uuid::Uuid> {
        assert!(
            state.is_terminal(),
            "insert_terminal_jobs takes done, failed or cancelled"
        );
        let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::now_v7()).collect();
        let ago = finished_ago.as_millis() as i64;
        let client = self.client().await;
        client
            .execute(
                "INSERT INTO jobs (id, queue, payload, max_attempts, created_at, run_at)
                 SELECT id, $2, '{}'::jsonb, 1, now() - ($3::bigint + 1000) * interval '1 millisecond',
                        now() - ($3::bigint + 1000) * interval '1 millisecond'
                 FROM unnest($1::uuid[]) AS id",
                &[&ids, &queue, &ago],
            )
            .await
            .unwrap();
        // Marked as the coordinator's own transactions are: the statement
        // writes its own tally deltas below.
        client.batch_execute(Open::States.sql()).await.unwrap();
        client.execute(
                "WITH ended AS (
                     UPDATE jobs SET state = $2::text::job_state, attempt = 1, run_lease = 1,
                         owned_by = 'w', claimed_at = now() - ($3::bigint + 500) * interval '1 millisecond',
                         finished_at = now() - $3::bigint * interval '1 millisecond',
                         result = CASE WHEN $2 = 'done' THEN to_jsonb('ok'::text) END,
                         error = CASE WHEN $2 <> 'done' THEN 'boom' END,
                         final_outcome = CASE WHEN $2 = 'done' THEN 'completed'
                                              WHEN $2 = 'failed' THEN 'failed' END::attempt_outcome
                     WHERE id = ANY($1::uuid[])
                     RETURNING id, queue, claimed_at, finished_at, state),
                 tallied AS (
                     INSERT INTO job_tallies (queue, tally, n)
                     SELECT queue, state::text, count(*) FROM ended GROUP BY queue, state)
                 INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
                 SELECT id, 1, 'w', claimed_at, finished_at, 'cancelled', NULL, state
                 FROM ended WHERE state = 'cancelled'",
                &[&ids, &state.as_str(), &ago],
            )
            .await
            .unwrap();
        client.batch_execute("COMMIT").await.unwrap();
        ids
    }

    /// Runs `sql` in a transaction marked as the coordinator marks its own
    /// deletes (`tally::Open::Deletes`: the terminal and attempt tallies,
    /// and deletes of jobs), so it asks for no recount of the tallies and
    /// no sweep of the attempt log, and the attempts it writes are not
    /// counted: for arranging rows in ways that change no tally. (A delete
    /// of jobs through it must delete their attempts too.) Answers the
    /// rows it changed.
    pub async fn execute_marked(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> u64 {
        let client = self.client().await;
        client.batch_execute(Open::Deletes.sql()).await.unwrap();
        let n = client.execute(sql, params).await;
        // A failed statement aborted the transaction: COMMIT rolls it back.
        client.batch_execute("COMMIT").await.unwrap();
        n.unwrap()
    }

    /// A store over this database (as a second coordinator would have).
    pub async fn store(&self) -> Store {
        runlease_coordinator::connect_and_migrate(&test_config(&self.url))
            .await
            .unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(&self.name));
        // Drop runs outside async context; a throwaway runtime on its own thread does the I/O.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&admin_url(), NoTls).await.ok()?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await.ok()
            })
        })
        .join();
    }
}

/// A coordinator serving on a loopback port, stopped by [`TestCoordinator::stop`].
pub struct TestCoordinator {
    /// Where it listens.
    pub addr: SocketAddr,
    /// A caller bound to it.
    pub api: Api,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), runlease_coordinator::Error>>>,
}

impl TestCoordinator {
    /// Starts a coordinator over `db` with the test settings.
    pub async fn start(db: &TestDb) -> Self {
        Self::start_with(db, |_| {}).await
    }

    /// Starts a coordinator over `db` after `tweak` adjusts the settings.
    pub async fn start_with(db: &TestDb, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = test_config(&db.url);
        tweak(&mut config);
        Self::start_config(config).await
    }

    /// Starts a coordinator with exactly `config` (its `listen` port is ignored: 0).
    pub async fn start_config(config: Config) -> Self {
        let listener = TcpListener::bind((config.server.listen.ip(), 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(runlease_coordinator::serve(config, listener, shutdown.clone()));
        let api = Api::new(format!("http://{addr}"));
        // Ready once /readyz answers 200 (migrations are applied before serving).
        for _ in 0..200 {
            if task.is_finished() {
                let result = task.await.unwrap();
                panic!("coordinator exited during start: {result:?}");
            }
            if let Ok((200, _)) = api.try_get("/readyz").await {
                return Self {
                    addr,
                    api,
                    shutdown,
                    task: Some(task),
                };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("coordinator did not become ready at {addr}");
    }

    /// Graceful shutdown; returns how `serve` ended.
    pub async fn stop(mut self) -> Result<(), runlease_coordinator::Error> {
        self.shutdown.cancel();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("coordinator did not stop within 30 s")
            .unwrap()
    }
}

impl Drop for TestCoordinator {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
