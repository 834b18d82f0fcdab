//! A private PostgreSQL primary with a streaming standby, made by one test
//! (`initdb`, `pg_basebackup -R`) on free ports under a directory of its
//! own, for failover tests: stop the primary at once, promote the standby,
//! and (for a second failover) make a new standby from the new primary on
//! the old primary's port. The chaos soak (bench/) runs its PostgreSQL on
//! one too. PostgreSQL refuses to run as root, so as root every server
//! command runs as the `postgres` user (`runuser`). Both servers are stopped
//! on drop, and their files removed unless the caller chose the directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Its server log (outside the data directory, so it outlives a rebuild).
    pub log_file: PathBuf,
}

/// A primary and its standby.
pub struct PgCluster {
    root: PathBuf,
    /// The server that accepts writes at first (after
    /// [`PgCluster::rebuild_standby`], the promoted one).
    pub primary: Server,
    /// The streaming standby, promoted by [`PgCluster::promote_standby`]
    /// (after [`PgCluster::rebuild_standby`], the new one).
    pub standby: Server,
    /// How the standby follows.
    pub replication: Replication,
    /// Lines appended to the first primary's `postgresql.conf` (the
    /// standbys copy them).
    conf: String,
    /// The standby has been promoted and no new standby made yet.
    promoted: AtomicBool,
    /// Remove `root` on drop.
    remove_root: bool,
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

/// Runs a PostgreSQL program, as the `postgres` user when run as root,
/// failing loudly.
fn as_postgres(program: &str, args: &[&str]) {
    let bin = bindir().join(program);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let out = cmd
        .args(args)
        // A server started by pg_ctl must not hold the caller's pipes open.
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} as postgres: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

impl Server {
    fn pg_ctl(&self, args: &[&str]) {
        let dir = self.dir.to_str().unwrap();
        let mut all = vec!["-D", dir, "-l", self.log_file.to_str().unwrap()];
        all.extend_from_slice(args);
        as_postgres("pg_ctl", &all);
    }

    /// A libpq URL of this server alone.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Its log so far, for a failing assertion's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// A plain connection to database `db` on this server.
    pub async fn connect(&self, db: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, conn) = tokio_postgres::connect(&self.url(db), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Waits until the server accepts connections.
    async fn until_accepting(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.connect("postgres").await.is_err() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL on port {} does not accept connections after {within:?}:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl PgCluster {
    /// Makes and starts a primary and a standby streaming from it, and waits
    /// until the primary sees the standby in the wanted replication mode.
    pub async fn start(replication: Replication) -> Self {
        let root = std::env::temp_dir().join(format!("runlease-pg-{}", uuid::Uuid::new_v4().simple()));
        let mut cluster = Self::start_in(&root, replication, "").await;
        cluster.remove_root = true;
        cluster
    }

    /// As [`PgCluster::start`], in `root` (created; left in place on drop,
    /// for the caller to keep or remove), with `conf` appended to the
    /// servers' `postgresql.conf` (e.g. `max_connections = 200`).
    pub async fn start_in(root: &Path, replication: Replication, conf: &str) -> Self {
        std::fs::create_dir_all(root).unwrap();
        if is_root() {
            let chown = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(root)
                .status()
                .unwrap();
            assert!(
                chown.success(),
                "cannot give {} to the postgres user",
                root.display()
            );
        }
        let server = |name: &str| {
            let port = free_port();
            Server {
                dir: root.join(name),
                port,
                log_file: root.join(format!("{name}-{port}.log")),
            }
        };
        let cluster = Self {
            root: root.to_owned(),
            primary: server("primary"),
            standby: server("standby"),
            replication,
            conf: conf.to_owned(),
            promoted: AtomicBool::new(false),
            remove_root: false,
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
                 shared_buffers = 32MB\nwal_level = replica\nmax_wal_senders = 4\n\
                 wal_retrieve_retry_interval = 200ms\n{}\n",
                self.primary.port, self.conf
            ),
        );
        self.primary.pg_ctl(&["-w", "start"]);
    }

    /// Makes the standby from the primary (`pg_basebackup -R`) and starts it.
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
                // An immediate checkpoint: just after a promotion the
                // server's own checkpoint is spread over minutes.
                "-c",
                "fast",
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
        self.until_streaming_as(self.replication).await;
    }

    async fn until_streaming_as(&self, replication: Replication) {
        let want = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let client = self
            .primary()
            .connect("postgres")
            .await
            .expect("the private primary does not answer");
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

    /// Cuts the standby off the primary's WAL (its `primary_conninfo`
    /// emptied and reloaded), as a network fault or a standby far behind
    /// would: with asynchronous replication the primary goes on
    /// acknowledging commits the standby will never have. Answers once the
    /// primary no longer streams to it.
    pub async fn cut_standby_off(&self) {
        let standby = self
            .standby
            .connect("postgres")
            .await
            .expect("the standby answers");
        // Two statements: ALTER SYSTEM may not share a transaction.
        for sql in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            standby.batch_execute(sql).await.unwrap();
        }
        let primary = self
            .primary
            .connect("postgres")
            .await
            .expect("the primary answers");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let streaming: i64 = primary
                .query_one("SELECT count(*) FROM pg_stat_replication", &[])
                .await
                .unwrap()
                .get(0);
            if streaming == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby still streams 10 s after it was cut off"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the primary at once, as a crash would (`pg_ctl -m immediate`):
    /// its connections break, nothing is flushed to the standby afterwards.
    pub fn crash_primary(&self) {
        self.primary.pg_ctl(&["-m", "immediate", "stop"]);
    }

    /// Promotes the standby and waits until it takes writes. From here on
    /// [`PgCluster::primary`] is the promoted server.
    pub fn promote_standby(&self) {
        self.standby.pg_ctl(&["-w", "promote"]);
        self.promoted.store(true, Ordering::SeqCst);
    }

    /// The server that takes writes now: the first primary, or the
    /// standby once promoted.
    pub fn primary(&self) -> &Server {
        if self.promoted.load(Ordering::SeqCst) {
            &self.standby
        } else {
            &self.primary
        }
    }

    /// `pg_ctl restart -m fast` of the current primary: every connection is
    /// closed, in-flight transactions roll back. Answers once it accepts
    /// connections and its standby streams again.
    pub async fn restart_primary(&self) -> Duration {
        assert!(
            !self.promoted.load(Ordering::SeqCst),
            "restart_primary after a promotion: make the new standby first (rebuild_standby)"
        );
        let started = Instant::now();
        self.primary.pg_ctl(&["-w", "-t", "60", "-m", "fast", "restart"]);
        self.primary.until_accepting(Duration::from_secs(60)).await;
        self.until_streaming().await;
        started.elapsed()
    }

    /// After [`PgCluster::promote_standby`]: the promoted server becomes
    /// [`PgCluster::primary`], and a new standby is made from it
    /// (`pg_basebackup -R`) in place of the old primary, on the old
    /// primary's port, so the same multi-host URL still names both and a
    /// later failover works the same way. With synchronous replication the
    /// new primary waits for the new standby from then on. Answers once it
    /// streams in the wanted mode.
    pub async fn rebuild_standby(&mut self) {
        assert!(
            self.promoted.load(Ordering::SeqCst),
            "rebuild_standby before a promotion"
        );
        // The old primary is stopped (crashed); stopping it again is harmless.
        let _ = self.stop_quietly(&self.primary);
        std::mem::swap(&mut self.primary, &mut self.standby);
        self.promoted.store(false, Ordering::SeqCst);
        std::fs::remove_dir_all(&self.standby.dir).unwrap();
        self.init_standby();
        self.until_streaming_as(Replication::Asynchronous).await;
        if self.replication == Replication::Synchronous {
            let client = self.primary.connect("postgres").await.unwrap();
            // Two statements: ALTER SYSTEM refuses a transaction block.
            for sql in [
                "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
                "SELECT pg_reload_conf()",
            ] {
                client.batch_execute(sql).await.unwrap();
            }
            self.until_streaming().await;
        }
    }

    fn stop_quietly(&self, server: &Server) -> std::io::Result<std::process::Output> {
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bindir().join("pg_ctl"));
            c
        } else {
            Command::new(bindir().join("pg_ctl"))
        };
        cmd.args(["-D", server.dir.to_str().unwrap(), "-m", "immediate", "stop"])
            .stdin(std::process::Stdio::null())
            .output()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for server in [&self.standby, &self.primary] {
            let _ = self.stop_quietly(server);
        }
        if self.remove_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
