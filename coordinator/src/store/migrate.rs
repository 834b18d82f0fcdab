//! Forward-only migrations from `migrations/NNNN_name.sql`, compiled into the
//! binary. All pending ones apply in one transaction under an advisory lock,
//! so replicas that start together neither race nor half-apply.

use crate::store::connect::Pool;

use crate::store::StoreError;

/// One migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number, from the file name.
    pub version: i32,
    /// Its name, from the file name.
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

/// The [`Migration`] in `migrations/<number>_<name>.sql`.
macro_rules! migration {
    ($version:literal, $number:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/", $number, "_", $name, ".sql")),
        }
    };
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001", "jobs"),
    migration!(2, "0002", "dispatch"),
    migration!(3, "0003", "operations"),
    migration!(4, "0004", "flow_control"),
    migration!(5, "0005", "trace_context"),
    migration!(6, "0006", "lean_writes"),
    migration!(7, "0007", "explicit_tallies"),
    migration!(8, "0008", "tally_recount"),
    migration!(9, "0009", "attempts_without_foreign_key"),
    migration!(10, "0010", "attempt_tallies_explicit"),
    migration!(11, "0011", "endpoints"),
    migration!(12, "0012", "dependencies"),
    migration!(13, "0013", "retry_policy"),
    migration!(14, "0014", "dependents_in_place"),
    migration!(15, "0015", "column_domains"),
];

/// Advisory lock key of the migrator ("runlease" in ASCII, as an i64).
const MIGRATION_LOCK_KEY: i64 = 0x72756e6c65617365;

const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS runlease_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// A stable checksum of a migration's text (FNV-1a, 64 bits), to notice a file
/// edited after it was applied.
fn checksum(sql: &str) -> String {
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in sql.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016x}")
}

/// The latest migration version this binary knows.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Applies every pending migration; returns the versions applied.
pub async fn migrate(pool: &Pool) -> Result<Vec<i32>, StoreError> {
    migrate_to(pool, latest_version()).await
}

/// Applies the pending migrations up to version `target` (tests of an
/// upgrade start from an older schema this way); returns the versions applied.
pub async fn migrate_to(pool: &Pool, target: i32) -> Result<Vec<i32>, StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // A migration may build an index over a large table: no statement
    // timeout for it (the pool's connections carry one).
    tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0")
        .await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    tx.batch_execute(CREATE_HISTORY).await?;
    let rows = tx
        .query("SELECT version, checksum FROM runlease_migrations", &[])
        .await?;
    let applied: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut done = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| m.version <= target) {
        let sum = checksum(migration.sql);
        match applied.iter().find(|(v, _)| *v == migration.version) {
            Some((_, existing)) if *existing == sum => continue,
            Some(_) => {
                return Err(StoreError::Migration(format!(
                    "migration {:04}_{} was changed after it was applied; migrations are forward-only, add a new one",
                    migration.version, migration.name
                )));
            }
            None => {}
        }
        tx.batch_execute(migration.sql).await.map_err(|e| {
            StoreError::Migration(format!(
                "migration {:04}_{} failed: {}",
                migration.version,
                migration.name,
                crate::store::db_error_text(&e)
            ))
        })?;
        tx.execute(
            "INSERT INTO runlease_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&migration.version, &migration.name, &sum],
        )
        .await?;
        done.push(migration.version);
    }
    tx.commit().await?;
    Ok(done)
}

/// Whether every migration this binary knows has been applied.
pub async fn is_current(pool: &Pool) -> Result<bool, StoreError> {
    let client = pool.get().await?;
    let row = client
        .query_opt(
            "SELECT max(version) FROM runlease_migrations WHERE to_regclass('runlease_migrations') IS NOT NULL",
            &[],
        )
        .await;
    match row {
        Ok(Some(row)) => Ok(row.get::<_, Option<i32>>(0).unwrap_or(0) >= latest_version()),
        Ok(None) => Ok(false),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        // Strictly increasing: the migrator applies each version it has not
        // recorded, so branches may number theirs ahead of a merge.
        for pair in MIGRATIONS.windows(2) {
            assert!(pair[0].version < pair[1].version);
        }
        assert_eq!(MIGRATIONS[0].version, 1);
        assert_ne!(checksum("a"), checksum("b"));
    }
}
