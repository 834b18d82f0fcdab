//! The store's set-up: statements, migrations, database creation, TLS.

use runlease_coordinator::store::sql;
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
        client
            .prepare(text)
            .await
            .unwrap_or_else(|e| panic!("{name}.sql does not prepare: {e}"));
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
    let c = TestCoordinator::start_with(&db, |cfg| cfg.database_url = url).await;
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
