//! Connecting to PostgreSQL: URL and `sslmode` handling, TLS, the pool, and
//! creating the database when it does not exist yet.

use std::time::Duration;

use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, RecyclingMethod, Runtime};
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
    /// bounded so an overloaded coordinator answers 503 instead of hanging;
    /// every connection has TCP keepalives and the server-side timeouts of
    /// `deadlines`, and one that sat idle is checked before it is reused.
    pub fn pool(&self, size: usize, deadlines: Deadlines) -> Result<Pool, StoreError> {
        let mut pg = self.pg.clone();
        // A peer that vanished (a failover, a dropped NAT entry) is noticed
        // by the kernel within about 10 + 3 × 5 s, and unacknowledged writes
        // fail after the user timeout, instead of waiting for hours.
        pg.keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(deadlines.call.max(Duration::from_secs(1)) * 2);
        let mut options = pg.get_options().map(str::to_owned).unwrap_or_default();
        if !deadlines.statement.is_zero() {
            // PostgreSQL ends a statement that runs longer; a transaction
            // left idle by a client that stopped answering is ended too,
            // so its row locks do not hold up the retry on another connection.
            options.push_str(&format!(
                " -c statement_timeout={} -c idle_in_transaction_session_timeout={}",
                deadlines.statement.as_millis(),
                (deadlines.call * 2).as_millis()
            ));
        }
        pg.options(options.trim());
        let manager = CheckedManager {
            inner: Manager::from_config(
                pg,
                self.tls_connector()?,
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            ),
            idle_check_after: IDLE_CHECK_AFTER,
            check_timeout: deadlines.check(),
        };
        Pool::builder(manager)
            .max_size(size)
            // The connection returned last is handed out first: a busy
            // coordinator keeps reusing the few connections whose backends
            // already planned and cached its statements, instead of spreading
            // the work (and the planning) over the whole pool.
            .queue_mode(deadpool::managed::QueueMode::Lifo)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(deadlines.call))
            .recycle_timeout(Some(deadlines.check() + Duration::from_millis(100)))
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

/// A connection idle (not handed out) for this long is checked with an
/// empty query before it is handed out again.
pub const IDLE_CHECK_AFTER: Duration = Duration::from_secs(2);

/// The time limits of database work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// PostgreSQL's `statement_timeout` (zero: none).
    pub statement: Duration,
    /// The coordinator's own limit on one store operation (a checkout and
    /// its statements); the connection of an operation that overran it is
    /// thrown away.
    pub call: Duration,
}

impl Deadlines {
    /// How long the check of an idle connection may take.
    fn check(self) -> Duration {
        (self.call / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

/// The pool of PostgreSQL connections.
pub type Pool = deadpool::managed::Pool<CheckedManager>;
/// A connection taken from the [`Pool`].
pub type Object = deadpool::managed::Object<CheckedManager>;

/// deadpool-postgres's manager, plus a check of connections that sat idle:
/// a connection frozen by the network (bytes held, nothing closed) answers
/// nothing, so it fails its check in bounded time and is replaced, instead
/// of hanging the request that would have used it.
#[derive(Debug)]
pub struct CheckedManager {
    inner: Manager,
    idle_check_after: Duration,
    check_timeout: Duration,
}

impl deadpool::managed::Manager for CheckedManager {
    type Type = ClientWrapper;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<ClientWrapper, tokio_postgres::Error> {
        self.inner.create().await
    }

    async fn recycle(
        &self,
        client: &mut ClientWrapper,
        metrics: &Metrics,
    ) -> RecycleResult<tokio_postgres::Error> {
        self.inner.recycle(client, metrics).await?;
        if metrics.last_used() < self.idle_check_after {
            return Ok(());
        }
        match tokio::time::timeout(self.check_timeout, client.simple_query("")).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(RecycleError::Backend(e)),
            Err(_) => {
                tracing::warn!("an idle PostgreSQL connection did not answer its check in time: replaced");
                Err(RecycleError::message("idle connection did not answer its check"))
            }
        }
    }

    fn detach(&self, client: &mut ClientWrapper) {
        self.inner.detach(client);
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
