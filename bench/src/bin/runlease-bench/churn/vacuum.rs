//! Autovacuum during a churn run: on, at PostgreSQL's defaults, as the
//! issue's figures are read, whatever the server's configuration (a CI
//! configuration may turn it off); and what it has done so far.

use runlease_tests::TestDb;

/// Autovacuum turned on for the run (`ALTER SYSTEM`, reloaded) when the
/// server had it off; set back when the run ends, or when this is dropped
/// on the way out of a failed one.
pub struct Autovacuum {
    turned_on: bool,
}

impl Autovacuum {
    /// Turns autovacuum on if it is off, and says so.
    pub async fn on() -> anyhow::Result<Self> {
        let admin = runlease_tests::admin().await;
        let setting: String = admin.query_one("SHOW autovacuum", &[]).await?.get(0);
        if setting == "on" {
            println!("autovacuum: on (the server's setting)");
            return Ok(Self { turned_on: false });
        }
        // Each its own statement: ALTER SYSTEM runs outside a transaction.
        admin.batch_execute("ALTER SYSTEM SET autovacuum = on").await?;
        admin.batch_execute("SELECT pg_reload_conf()").await?;
        // The reload reaches the backends at their next statement.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let now: String = admin.query_one("SHOW autovacuum", &[]).await?.get(0);
            if now == "on" {
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "autovacuum still off 10 s after the reload"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        println!(
            "autovacuum: off on this server, turned on at its defaults for the run (ALTER SYSTEM, set back at the end)"
        );
        Ok(Self { turned_on: true })
    }

    /// Sets the server's configuration back.
    pub fn restore(mut self) {
        self.set_back();
    }

    fn set_back(&mut self) {
        if !std::mem::take(&mut self.turned_on) {
            return;
        }
        // Synchronous, so that it also runs while a failed run unwinds.
        let status = std::process::Command::new("psql")
            .arg(runlease_tests::admin_url())
            .args([
                "-qAt",
                "-c",
                "ALTER SYSTEM RESET autovacuum",
                "-c",
                "SELECT pg_reload_conf()",
            ])
            .stdout(std::process::Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() => println!("autovacuum: set back to the server's setting"),
            other => eprintln!(
                "autovacuum: could not be set back ({other:?}); run `ALTER SYSTEM RESET autovacuum; SELECT pg_reload_conf()`"
            ),
        }
    }
}

impl Drop for Autovacuum {
    fn drop(&mut self) {
        self.set_back();
    }
}

/// Autovacuum's runs over the jobs table so far, and its dead rows now.
pub async fn vacuum_note(db: &TestDb) -> String {
    let row = db
        .client()
        .await
        .query_one(
            "SELECT autovacuum_count, n_dead_tup,
                    extract(epoch FROM now() - last_autovacuum)::float8
             FROM pg_stat_user_tables WHERE relname = 'jobs'",
            &[],
        )
        .await
        .unwrap();
    let (runs, dead, ago): (i64, i64, Option<f64>) = (row.get(0), row.get(1), row.get(2));
    format!(
        "autovacuum of jobs: {runs} runs{}, {dead} dead rows now",
        ago.map_or(String::new(), |a| format!(" (last {a:.0} s ago)"))
    )
}
