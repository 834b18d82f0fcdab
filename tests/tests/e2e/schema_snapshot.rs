//! `migrations/schema.sql` is the schema every migration leads to, as
//! `pg_dump --schema-only` prints it: the one place to read the `jobs`
//! table without replaying ten migrations. This test migrates a database
//! and compares; after a new migration, write the file again with
//! `RUNLEASE_WRITE_SCHEMA=1 cargo nextest run -p runlease-tests --test e2e schema_snapshot`.

use std::process::Command;

use runlease_tests::TestDb;

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/schema.sql");

/// The header of the committed file: what it is and how it is made.
const HEADER: &str = "\
-- runlease: the schema after every migration in this directory, as
-- `pg_dump --schema-only --no-owner --no-privileges` prints it (version
-- lines and session settings left out). Generated: do not edit. The
-- migrations are the source; a test (tests/tests/e2e/schema_snapshot.rs)
-- fails when this file and a freshly migrated database disagree, and
-- RUNLEASE_WRITE_SCHEMA=1 with that test writes it again.
";

/// `pg_dump`'s text without what varies between servers and runs: version
/// comments, `SET` and `SELECT pg_catalog.set_config` lines, and runs of
/// blank lines.
fn normalized(dump: &str) -> String {
    let mut out = String::from(HEADER);
    let mut blank = true;
    for line in dump.lines() {
        let skip = line.starts_with("-- Dumped ")
            || line.starts_with("SET ")
            || line.starts_with("SELECT pg_catalog.set_config")
            || line.starts_with("\\restrict")
            || line.starts_with("\\unrestrict")
            || line == "--"
            || line.starts_with("-- PostgreSQL database dump");
        if skip {
            continue;
        }
        if line.trim().is_empty() {
            if !blank {
                out.push('\n');
            }
            blank = true;
            continue;
        }
        blank = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[tokio::test]
async fn the_schema_snapshot_is_what_the_migrations_make() {
    let db = TestDb::new().await;
    let output = Command::new("pg_dump")
        .args([
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--dbname",
            &db.url,
        ])
        .output()
        .expect("pg_dump (PostgreSQL's client tools) must be installed");
    assert!(
        output.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let current = normalized(&String::from_utf8(output.stdout).unwrap());
    if std::env::var_os("RUNLEASE_WRITE_SCHEMA").is_some() {
        std::fs::write(SNAPSHOT, &current).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(SNAPSHOT).unwrap_or_default();
    if committed != current {
        let first = committed
            .lines()
            .zip(current.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(current.lines().count()));
        panic!(
            "migrations/schema.sql differs from a freshly migrated database from line {}: committed {:?}, migrated {:?}. After a new migration, run RUNLEASE_WRITE_SCHEMA=1 cargo nextest run -p runlease-tests --test e2e schema_snapshot",
            first + 1,
            committed.lines().nth(first),
            current.lines().nth(first)
        );
    }
}
