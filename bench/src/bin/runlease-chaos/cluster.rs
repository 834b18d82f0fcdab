//! A PostgreSQL cluster of the soak's own: `initdb` in a temporary directory,
//! served on a free port, so the soak can restart it without touching the
//! machine's server. As root (PostgreSQL refuses to run as root), every
//! command runs as the `postgres` user through `runuser`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_postgres::NoTls;

/// One PostgreSQL server over a data directory the soak made.
pub struct PgCluster {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    /// The port it listens on (loopback only).
    pub port: u16,
    as_postgres: bool,
}

/// The newest installed PostgreSQL's binaries (`/usr/lib/postgresql/<v>/bin`),
/// or `RUNLEASE_CHAOS_PG_BIN` when set.
fn pg_bin() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("RUNLEASE_CHAOS_PG_BIN") {
        return Ok(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: install PostgreSQL's server package, or set RUNLEASE_CHAOS_PG_BIN")?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no initdb under /usr/lib/postgresql/*/bin")
}

impl PgCluster {
    /// Runs `initdb` in `dir` (which it creates) and starts the server on a
    /// free port; answers once it accepts connections.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = pg_bin()?;
        let as_postgres = std::fs::metadata("/proc/self")?.uid() == 0;
        std::fs::create_dir_all(dir)?;
        if as_postgres {
            // The data directory and the log must belong to the server's user.
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir)
                .status()?;
            if !status.success() {
                bail!("cannot chown {} to postgres", dir.display());
            }
        }
        let cluster = Self {
            data: dir.join("data"),
            log: dir.join("postgresql.log"),
            port: runlease_tests::process::free_port(),
            bin,
            as_postgres,
        };
        cluster.run(
            "initdb",
            &[
                "-D",
                path_str(&cluster.data)?,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        // Loopback only, on the chosen port; no Unix socket in a shared
        // directory; fsync off (the soak tests the protocol, not the disk).
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = ''\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\nshared_buffers = 128MB\n",
            cluster.port
        );
        let conf_path = cluster.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text)?;
        cluster.ctl(&["start"])?;
        cluster.wait_ready(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// URL of database `db` on it, directly (not through a proxy).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable", self.port)
    }

    /// The server's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `pg_ctl restart -m fast`: every connection is closed, in-flight
    /// transactions roll back; answers once the server accepts connections again.
    pub async fn restart(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.ctl(&["restart", "-m", "fast"])?;
        self.wait_ready(Duration::from_secs(60)).await?;
        Ok(started.elapsed())
    }

    /// When the running server started (`pg_postmaster_start_time()`), as text.
    pub async fn started_at(&self) -> anyhow::Result<String> {
        let client = self.connect("postgres").await?;
        let row = client
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await?;
        Ok(row.get(0))
    }

    /// A plain connection to database `db`.
    pub async fn connect(&self, db: &str) -> anyhow::Result<tokio_postgres::Client> {
        let (client, conn) = tokio_postgres::connect(&self.url(db), NoTls)
            .await
            .with_context(|| format!("cannot connect to the soak's PostgreSQL on port {}", self.port))?;
        tokio::spawn(conn);
        Ok(client)
    }

    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            match self.connect("postgres").await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "PostgreSQL did not accept connections within {within:?}; see {}",
                        self.log.display()
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// `pg_ctl` with `-D` and `-l` (without `-l` the server would keep the
    /// caller's stdout open), waiting for the action to finish.
    fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec![
            "-D",
            path_str(&self.data)?,
            "-l",
            path_str(&self.log)?,
            "-w",
            "-t",
            "60",
        ];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{tool} {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.ctl(&["stop", "-m", "immediate"]);
    }
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}
