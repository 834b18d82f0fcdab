//! A private PostgreSQL primary with a streaming standby, made by one test
//! (`initdb`, `pg_basebackup -R`) on free ports under a directory of its
//! own, for failover tests: stop the primary at once, promote the standby.
//! PostgreSQL refuses to run as root, so every server command runs as the
//! `postgres` user (`runuser`). Both servers are stopped and their files
//! removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::free_port;

/// How the standby follows the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit is acknowledged once the standby has it
    /// (`synchronous_standby_names`): a failover loses nothing acknowledged.
    Synchronous,
    /// The primary acknowledges without waiting: a failover loses the last
    /// commits the standby had not received.
    Asynchronous,
}

/// One server of the pair.
#[derive(Debug)]
pub struct Server {
    /// Its data directory.
    pub dir: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// A primary and its standby.
pub struct PgCluster {
    root: PathBuf,
    /// The server that accepts writes at first.
    pub primary: Server,
    /// The streaming standby, promoted by [`PgCluster::promote_standby`].
    pub standby: Server,
    /// How the standby follows.
    pub replication: Replication,
}

/// The directory of PostgreSQL's server programs (`pg_config --bindir`).
fn bindir() -> PathBuf {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .expect("pg_config is missing: the failover tests need PostgreSQL's server programs");
    assert!(out.status.success(), "pg_config --bindir failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Runs a PostgreSQL program as the `postgres` user, failing loudly.
fn as_postgres(program: &str, args: &[&str]) {
    let bin = bindir().join(program);
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} as postgres: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

impl Server {
    fn pg_ctl(&self, args: &[&str]) {
        let dir = self.dir.to_str().unwrap();
        let log = self.dir.join("server.log");
        let mut all = vec!["-D", dir, "-l", log.to_str().unwrap()];
        all.extend_from_slice(args);
        as_postgres("pg_ctl", &all);
    }

    /// A libpq URL of this server alone.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Its log so far, for a failing assertion's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl PgCluster {
    /// Makes and starts a primary and a standby streaming from it, and waits
    /// until the primary sees the standby in the wanted replication mode.
    pub async fn start(replication: Replication) -> Self {
        let root = std::env::temp_dir().join(format!("runlease-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        let chown = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&root)
            .status()
            .unwrap();
        assert!(
            chown.success(),
            "cannot give {} to the postgres user",
            root.display()
        );
        let primary = Server {
            dir: root.join("primary"),
            port: free_port(),
        };
        let standby = Server {
            dir: root.join("standby"),
            port: free_port(),
        };
        let cluster = Self {
            root,
            primary,
            standby,
            replication,
        };
        cluster.init_primary();
        cluster.init_standby();
        cluster.until_streaming().await;
        cluster
    }

    fn init_primary(&self) {
        let dir = self.primary.dir.to_str().unwrap();
        as_postgres(
            "initdb",
            &["-D", dir, "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        let sync_names = match self.replication {
            Replication::Synchronous => "standby1",
            Replication::Asynchronous => "",
        };
        append(
            &self.primary.dir.join("postgresql.conf"),
            &format!(
                "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n\
                 synchronous_standby_names = '{sync_names}'\nfsync = off\nmax_connections = 100\n\
                 shared_buffers = 32MB\nwal_level = replica\nmax_wal_senders = 4\n",
                self.primary.port
            ),
        );
        self.primary.pg_ctl(&["-w", "start"]);
    }

    fn init_standby(&self) {
        let dir = self.standby.dir.to_str().unwrap();
        let port = self.primary.port.to_string();
        as_postgres(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                dir,
                "-R",
                "-X",
                "stream",
            ],
        );
        // postgresql.auto.conf wins over postgresql.conf: the standby's own
        // port and socket, its name for synchronous_standby_names, and none
        // of its own standbys to wait for once promoted.
        append(
            &self.standby.dir.join("postgresql.auto.conf"),
            &format!(
                "\nprimary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name=standby1'\n\
                 port = {}\nunix_socket_directories = ''\nsynchronous_standby_names = ''\n",
                self.standby.port
            ),
        );
        self.standby.pg_ctl(&["-w", "start"]);
    }

    /// Waits until the primary streams to the standby in the wanted mode.
    async fn until_streaming(&self) {
        let want = match self.replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let (client, conn) = tokio_postgres::connect(&self.primary.url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("the private primary does not answer");
        tokio::spawn(conn);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let rows = client
                .query(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
                    &[],
                )
                .await
                .unwrap();
            if rows.iter().any(|r| r.get::<_, String>(0) == want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby is not streaming ({want}) after 30 s:\n{}",
                self.standby.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A URL naming both servers, primary first, that only takes a server
    /// accepting writes (libpq's `target_session_attrs=read-write`).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// Stops the primary at once, as a crash would (`pg_ctl -m immediate`):
    /// its connections break, nothing is flushed to the standby afterwards.
    pub fn crash_primary(&self) {
        self.primary.pg_ctl(&["-m", "immediate", "stop"]);
    }

    /// Promotes the standby and waits until it takes writes.
    pub fn promote_standby(&self) {
        self.standby.pg_ctl(&["-w", "promote"]);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for server in [&self.standby, &self.primary] {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bindir().join("pg_ctl"))
                .args(["-D", server.dir.to_str().unwrap(), "-m", "immediate", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
