//! Connecting to PostgreSQL: URL and `sslmode` handling, TLS, the pool, and
//! creating the database when it does not exist yet.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use postgres_native_tls::MakeTlsConnector;
use tokio_postgres::config::SslMode;

use crate::store::StoreError;

/// How to treat TLS, following libpq's `sslmode` meanings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsPolicy {
    /// `disable`: plain TCP.
    Disable,
    /// `prefer` / `require` (libpq's default without a root certificate):
    /// encrypt, do not verify the server's certificate.
    EncryptOnly {
        /// Whether a server without TLS is refused.
        required: bool,
    },
    /// `verify-ca`: the certificate must chain to a trusted root; any host name.
    VerifyCa {
        /// PEM root certificate (`sslrootcert`); the system roots when absent.
        root_cert: Option<String>,
    },
    /// `verify-full`: trusted chain and matching host name.
    VerifyFull {
        /// PEM root certificate (`sslrootcert`); the system roots when absent.
        root_cert: Option<String>,
    },
}

/// A parsed database URL: what tokio-postgres understands plus our TLS policy.
#[derive(Debug, Clone)]
pub struct DatabaseTarget {
    /// Connection settings for tokio-postgres.
    pub pg: tokio_postgres::Config,
    /// TLS policy from `sslmode` / `sslrootcert`.
    pub tls: TlsPolicy,
}

impl DatabaseTarget {
    /// Parses a `postgres://` URL (or a key=value string). `sslmode` may be
    /// `disable`, `prefer` (default), `require`, `verify-ca` or `verify-full`;
    /// `sslrootcert` names a PEM file.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut kept = Vec::new();
        let mut sslmode = "prefer".to_owned();
        let mut root_path = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", v)) => sslmode = v.to_owned(),
                Some(("sslrootcert", v)) => root_path = Some(v.to_owned()),
                _ => kept.push(pair),
            }
        }
        let root_cert = match root_path {
            Some(path) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|e| StoreError::Config(format!("cannot read sslrootcert {path}: {e}")))?,
            ),
            None => None,
        };
        let (tls, pg_mode) = match sslmode.as_str() {
            "disable" => (TlsPolicy::Disable, SslMode::Disable),
            "allow" | "prefer" => (TlsPolicy::EncryptOnly { required: false }, SslMode::Prefer),
            "require" if root_cert.is_some() => (TlsPolicy::VerifyCa { root_cert }, SslMode::Require),
            "require" => (TlsPolicy::EncryptOnly { required: true }, SslMode::Require),
            "verify-ca" => (TlsPolicy::VerifyCa { root_cert }, SslMode::Require),
            "verify-full" => (TlsPolicy::VerifyFull { root_cert }, SslMode::Require),
            other => {
                return Err(StoreError::Config(format!(
                    "unknown sslmode {other:?}; use disable, prefer, require, verify-ca or verify-full"
                )));
            }
        };
        let rebuilt = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut pg: tokio_postgres::Config = rebuilt
            .parse()
            .map_err(|e| StoreError::Config(format!("invalid RUNLEASE_DATABASE_URL: {e}")))?;
        pg.ssl_mode(pg_mode);
        if pg.get_dbname().is_none() {
            pg.dbname("runlease");
        }
        if pg.get_user().is_none() {
            pg.user("postgres");
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(10));
        }
        pg.application_name("runlease-coordinator");
        Ok(Self { pg, tls })
    }

    /// The database name.
    pub fn dbname(&self) -> &str {
        self.pg.get_dbname().unwrap_or("runlease")
    }

    /// A TLS connector that enforces this target's policy.
    pub fn tls_connector(&self) -> Result<MakeTlsConnector, StoreError> {
        let mut builder = native_tls::TlsConnector::builder();
        let add_root = |builder: &mut native_tls::TlsConnectorBuilder, pem: &Option<String>| {
            if let Some(pem) = pem {
                let cert = native_tls::Certificate::from_pem(pem.as_bytes())
                    .map_err(|e| StoreError::Config(format!("sslrootcert is not a PEM certificate: {e}")))?;
                builder.add_root_certificate(cert);
            }
            Ok::<_, StoreError>(())
        };
        match &self.tls {
            TlsPolicy::Disable | TlsPolicy::EncryptOnly { .. } => {
                builder
                    .danger_accept_invalid_certs(true)
                    .danger_accept_invalid_hostnames(true);
            }
            TlsPolicy::VerifyCa { root_cert } => {
                add_root(&mut builder, root_cert)?;
                builder.danger_accept_invalid_hostnames(true);
            }
            TlsPolicy::VerifyFull { root_cert } => add_root(&mut builder, root_cert)?,
        }
        let connector = builder
            .build()
            .map_err(|e| StoreError::Config(format!("cannot set up TLS: {e}")))?;
        Ok(MakeTlsConnector::new(connector))
    }

    /// A pool of at most `size` connections. Waiting for a free connection is
    /// bounded so an overloaded coordinator answers 503 instead of hanging.
    pub fn pool(&self, size: usize) -> Result<Pool, StoreError> {
        let manager = Manager::from_config(
            self.pg.clone(),
            self.tls_connector()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            // The connection returned last is handed out first: a busy
            // coordinator keeps reusing the few connections whose backends
            // already planned and cached its statements, instead of spreading
            // the work (and the planning) over the whole pool.
            .queue_mode(deadpool::managed::QueueMode::Lifo)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(10)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("cannot build the connection pool: {e}")))
    }

    /// Creates the database when it does not exist, connecting to the
    /// `postgres` maintenance database. Safe when replicas race: "already
    /// exists" counts as success.
    pub async fn create_database_if_missing(&self) -> Result<bool, StoreError> {
        let mut admin = self.pg.clone();
        admin.dbname("postgres");
        let (client, connection) = admin.connect(self.tls_connector()?).await?;
        let driver = tokio::spawn(connection);
        let name = self.dbname().to_owned();
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .await?
            .is_some();
        let mut created = false;
        if !exists {
            let sql = format!("CREATE DATABASE {}", quote_ident(&name));
            match client.batch_execute(&sql).await {
                Ok(()) => created = true,
                // A replica starting at the same moment won the race: either
                // "already exists", or the catalog's unique index caught it.
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE)
                        || e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(client);
        let _ = driver.await;
        Ok(created)
    }
}

/// Quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_taken_out_of_the_url_and_mapped() {
        let t = DatabaseTarget::parse("postgres://u@h:5/db?sslmode=require&connect_timeout=3").unwrap();
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: true });
        assert_eq!(t.pg.get_ssl_mode(), SslMode::Require);
        assert_eq!(t.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(t.dbname(), "db");

        let t = DatabaseTarget::parse("postgres://u@h/db?sslmode=verify-full").unwrap();
        assert_eq!(t.tls, TlsPolicy::VerifyFull { root_cert: None });

        let t = DatabaseTarget::parse("postgres://u@h/db").unwrap();
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: false });

        let t = DatabaseTarget::parse("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(t.pg.get_ssl_mode(), SslMode::Disable);

        assert!(DatabaseTarget::parse("postgres://u@h/db?sslmode=bogus").is_err());
        assert!(DatabaseTarget::parse("postgres://u@h/db?sslrootcert=/nonexistent").is_err());
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("run\"lease"), "\"run\"\"lease\"");
    }
}
