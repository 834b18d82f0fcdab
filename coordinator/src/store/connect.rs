//! Connecting to PostgreSQL: URL and `sslmode` handling, TLS, the pool, and
//! creating the database when it does not exist yet.

use std::time::Duration;

use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, RecyclingMethod, Runtime};
use postgres_native_tls::MakeTlsConnector;
use tokio_postgres::config::SslMode;

use crate::store::StoreError;

mod params;

use params::{ConnParams, URL_SCHEMES, conninfo, keyword_params, url_params};

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
    /// Parses a `postgres://` / `postgresql://` URL or a libpq key=value
    /// string (`host=db user=app sslmode=require`). In a URL the user,
    /// password, hosts, database and query values are percent-decoded; in
    /// the key=value form a value may be quoted (`password='a b\'c'`).
    /// `sslmode` may be `disable`, `prefer` (default), `require`, `verify-ca`
    /// or `verify-full`; `sslrootcert` names a PEM file. Every other
    /// parameter goes to tokio-postgres as it is. Without a database the
    /// database is `runlease`, without a user `postgres`.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let invalid =
            |e: &dyn std::fmt::Display| StoreError::Config(format!("invalid RUNLEASE_DATABASE_URL: {e}"));
        let params = if URL_SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
            url_params(url)
        } else if url.split('=').next().is_some_and(|before| before.contains("://")) {
            Err("use a postgres:// or postgresql:// URL, or key=value settings".to_owned())
        } else {
            keyword_params(url).map(|pairs| ConnParams {
                pairs,
                url_password: None,
            })
        }
        .map_err(|e| invalid(&e))?;
        let mut kept = Vec::new();
        let mut sslmode = "prefer".to_owned();
        let mut root_path = None;
        for (key, value) in params.pairs {
            match key.as_str() {
                "sslmode" => sslmode = value,
                "sslrootcert" => root_path = Some(value),
                _ => kept.push((key, value)),
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
        let mut pg: tokio_postgres::Config = conninfo(&kept)
            .map_err(|e| invalid(&e))?
            .parse()
            // Its causes name the setting, never a value.
            .map_err(|e: tokio_postgres::Error| match std::error::Error::source(&e) {
                Some(cause) => invalid(&format!("{e}: {cause}")),
                None => invalid(&e),
            })?;
        // A `password` query parameter comes after the URL's and wins, as in libpq.
        if let Some(password) = params.url_password
            && pg.get_password().is_none()
        {
            pg.password(password);
        }
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
                // A bundle (a provider's CA file) holds many certificates:
                // every one is trusted, not only the first.
                let certs = pem_certificates(pem);
                if certs.is_empty() {
                    return Err(StoreError::Config(
                        "sslrootcert holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
                    ));
                }
                for block in certs {
                    let cert = native_tls::Certificate::from_pem(block.as_bytes()).map_err(|e| {
                        StoreError::Config(format!("sslrootcert is not a PEM certificate: {e}"))
                    })?;
                    builder.add_root_certificate(cert);
                }
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
        // A transaction left idle by a client that stopped answering is
        // ended, so its row locks (a limited queue's settings row, say) do
        // not hold up the retry on another connection; and PostgreSQL ends a
        // statement that runs longer than the statement timeout (0: none).
        options.push_str(&format!(
            " -c idle_in_transaction_session_timeout={}",
            (deadlines.call * 2).as_millis()
        ));
        if !deadlines.statement.is_zero() {
            options.push_str(&format!(
                " -c statement_timeout={}",
                deadlines.statement.as_millis()
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

/// The PEM certificate blocks of `pem`, each with its BEGIN and END lines.
fn pem_certificates(pem: &str) -> Vec<&str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else { break };
        let end = start + len + END.len();
        blocks.push(&rest[start..end]);
        rest = &rest[end..];
    }
    blocks
}

/// Quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_certificate_of_a_bundle_is_found() {
        let one = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
        let bundle = format!("# a provider bundle\n{one}\n\n{one}\ntrailing\n{one}\n");
        let blocks = super::pem_certificates(&bundle);
        assert_eq!(blocks.len(), 3);
        assert!(blocks.iter().all(|b| *b == one));
        assert!(super::pem_certificates("no certificate here").is_empty());
    }

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

    use tokio_postgres::config::Host;

    fn error(url: &str) -> String {
        DatabaseTarget::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn url_parts_are_percent_decoded() {
        // Password `p@ss&w?rd%/x`, database `run@lease&?%/x`, user `app user`.
        let t = DatabaseTarget::parse(
            "postgres://app%20user:p%40ss%26w%3Frd%25%2Fx@db.internal:6432/run%40lease%26%3F%25%2Fx",
        )
        .unwrap();
        assert_eq!(t.pg.get_user(), Some("app user"));
        assert_eq!(t.pg.get_password(), Some(&b"p@ss&w?rd%/x"[..]));
        assert_eq!(t.dbname(), "run@lease&?%/x");
        assert_eq!(t.pg.get_hosts(), &[Host::Tcp("db.internal".to_owned())]);
        assert_eq!(t.pg.get_ports(), &[6432]);
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: false });

        // A password that is not UTF-8 once decoded is kept as bytes.
        let t = DatabaseTarget::parse("postgresql://u:%FF%00@h/db").unwrap();
        assert_eq!(t.pg.get_password(), Some(&[0xff, 0][..]));

        // A Unix socket directory as the host; the default port.
        let t = DatabaseTarget::parse("postgres://u@%2Fvar%2Frun%2Fpostgresql/db").unwrap();
        assert_eq!(t.pg.get_hosts(), &[Host::Unix("/var/run/postgresql".into())]);
        assert_eq!(t.pg.get_ports(), &[5432]);
    }

    #[test]
    fn query_values_are_percent_decoded_and_passed_on() {
        let t = DatabaseTarget::parse(
            "postgres://u@h/db?options=-c%20search_path%3Da%26b&target_session_attrs=read-write&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(t.pg.get_options(), Some("-c search_path=a&b"));
        assert_eq!(
            t.pg.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(t.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        // libpq reads `+` as itself, not as a space; quotes and backslashes
        // survive the way to tokio-postgres.
        let t = DatabaseTarget::parse(r"postgres://u@h/db?options=a+b%27c%5Cd").unwrap();
        assert_eq!(t.pg.get_options(), Some(r"a+b'c\d"));
        // A password in the query wins over the URL's, as in libpq.
        let t = DatabaseTarget::parse("postgres://u:url@h/db?password=q%26p").unwrap();
        assert_eq!(t.pg.get_password(), Some(&b"q&p"[..]));
        // The query's user and database win too.
        let t = DatabaseTarget::parse("postgres://u@h/db?user=v&dbname=d%2Fb").unwrap();
        assert_eq!((t.pg.get_user(), t.dbname()), (Some("v"), "d/b"));

        let t = DatabaseTarget::parse("postgres://u@h/db?sslmode=verify%2Dfull").unwrap();
        assert_eq!(t.tls, TlsPolicy::VerifyFull { root_cert: None });
    }

    #[test]
    fn sslrootcert_path_is_percent_decoded() {
        let dir = std::env::temp_dir().join(format!("runlease connect {}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("root 100%.pem");
        std::fs::write(&path, "PEM").unwrap();
        let encoded = path.to_str().unwrap().replace('%', "%25").replace(' ', "%20");
        let t = DatabaseTarget::parse(&format!(
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert={encoded}"
        ))
        .unwrap();
        assert_eq!(
            t.tls,
            TlsPolicy::VerifyCa {
                root_cert: Some("PEM".to_owned())
            }
        );
        // In the key=value form too; without `sslmode` it is still `prefer`.
        let t = DatabaseTarget::parse(&format!("host=h sslrootcert='{}'", path.display())).unwrap();
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: false });
        // `require` with a root certificate verifies the chain, as in libpq.
        let t = DatabaseTarget::parse(&format!(
            "host=h sslmode=require sslrootcert='{}'",
            path.display()
        ))
        .unwrap();
        assert_eq!(
            t.tls,
            TlsPolicy::VerifyCa {
                root_cert: Some("PEM".to_owned())
            }
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sslmode_is_honoured_in_the_key_value_form() {
        let t =
            DatabaseTarget::parse("host=db.internal port=6432 user=app dbname=jobs sslmode=require").unwrap();
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: true });
        assert_eq!(t.pg.get_ssl_mode(), SslMode::Require);
        assert_eq!(t.pg.get_hosts(), &[Host::Tcp("db.internal".to_owned())]);
        assert_eq!(t.pg.get_ports(), &[6432]);
        assert_eq!((t.pg.get_user(), t.dbname()), (Some("app"), "jobs"));

        let t = DatabaseTarget::parse("host=h sslmode = verify-full").unwrap();
        assert_eq!(t.tls, TlsPolicy::VerifyFull { root_cert: None });
        let t = DatabaseTarget::parse("host=h sslmode='verify-ca'").unwrap();
        assert_eq!(t.tls, TlsPolicy::VerifyCa { root_cert: None });
        let t = DatabaseTarget::parse("host=h sslmode=disable").unwrap();
        assert_eq!(t.pg.get_ssl_mode(), SslMode::Disable);
        let t = DatabaseTarget::parse("host=h").unwrap();
        assert_eq!(t.tls, TlsPolicy::EncryptOnly { required: false });
        assert_eq!(t.pg.get_ssl_mode(), SslMode::Prefer);

        // Quoted values hold spaces, quotes and backslashes; other settings
        // are passed on.
        let t = DatabaseTarget::parse(r"host=h password='p@ss w\'rd\\' connect_timeout=3 dbname='my db'")
            .unwrap();
        assert_eq!(t.pg.get_password(), Some(&br"p@ss w'rd\"[..]));
        assert_eq!(t.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(t.dbname(), "my db");
        assert_eq!(t.pg.get_user(), Some("postgres"));
        assert_eq!(t.pg.get_application_name(), Some("runlease-coordinator"));
    }

    #[test]
    fn an_unknown_sslmode_is_refused_in_both_forms() {
        let expected = "unknown sslmode \"verify\"; use disable, prefer, require, verify-ca or verify-full";
        assert_eq!(error("postgres://u@h/db?sslmode=verify"), expected);
        assert_eq!(error("host=h sslmode=verify"), expected);
        assert_eq!(error("host=h sslmode=''"), expected.replace("\"verify\"", "\"\""));
    }

    #[test]
    fn a_url_without_a_database_uses_runlease() {
        for url in [
            "postgres://u@h",
            "postgres://u@h/",
            "postgresql://u@h:5433?sslmode=disable",
            "host=h",
        ] {
            let t = DatabaseTarget::parse(url).unwrap();
            assert_eq!(t.dbname(), "runlease", "{url}");
            assert_eq!(t.pg.get_dbname(), Some("runlease"), "{url}");
        }
        let t = DatabaseTarget::parse("postgres://h/db").unwrap();
        assert_eq!(t.pg.get_user(), Some("postgres"));
        assert_eq!(t.pg.get_connect_timeout(), Some(&Duration::from_secs(10)));
    }

    #[test]
    fn several_hosts_and_ipv6() {
        let t =
            DatabaseTarget::parse("postgres://u:p%2C@h1:5432,[::1]:5433,h3/db?host=h4&port=1,2,3,4").unwrap();
        assert_eq!(
            t.pg.get_hosts(),
            &[
                Host::Tcp("h1".to_owned()),
                Host::Tcp("::1".to_owned()),
                Host::Tcp("h3".to_owned()),
                Host::Tcp("h4".to_owned()),
            ]
        );
        assert_eq!(t.pg.get_ports(), &[5432, 5433, 5432, 1, 2, 3, 4]);
        assert_eq!(t.pg.get_password(), Some(&b"p,"[..]));
        assert!(error("postgres://u@h1,,h2/db").contains("empty entry in the host list"));
    }

    #[test]
    fn bad_settings_are_refused_without_showing_the_password() {
        for (url, message) in [
            ("postgres://u:secret@h:99999/db", "invalid port number"),
            ("postgres://u:secret@h/db?bogus=1", "unknown option"),
            (
                "postgres://u:secret@h/db?sslcert",
                "query parameter \"sslcert\" has no `=value`",
            ),
            ("postgres://u:secret@h/db?%20x=1", "unknown option \" x\""),
            ("postgres://u:secret@h/db?application_name=%FF", "not UTF-8"),
            ("mysql://u:secret@h/db", "use a postgres:// or postgresql:// URL"),
            ("host=h password='secret", "no closing quote"),
            ("host=h password", "password has no `=` after it"),
            ("host=h password=", "password has no value"),
            ("host=h =secret", "`=` without a keyword"),
            ("host=h passwd=secret", "unknown option"),
        ] {
            let e = error(url);
            assert!(e.starts_with("invalid RUNLEASE_DATABASE_URL: "), "{url}: {e}");
            assert!(e.contains(message), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("run\"lease"), "\"run\"\"lease\"");
    }
}
