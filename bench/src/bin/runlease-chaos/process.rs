//! The soak's coordinator processes: started over the database proxies with
//! the soak's settings, killed, restarted on the same port, stopped; and
//! signals to any process.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use runlease_tests::{Proxy, TEST_SECRET, TestRedis};
use tokio::process::{Child, Command};

use crate::soak::{DATABASE, SoakArgs};

/// A coordinator process; its port stays the same across restarts.
pub struct Coordinator {
    /// Its number (0-based).
    pub index: usize,
    /// Its HTTP port, the same across restarts.
    pub port: u16,
    /// Between it and each PostgreSQL server (the first primary, then the
    /// first standby): its database URL names both proxies.
    pub db_proxies: Vec<Proxy>,
    /// The running process, if any.
    pub child: Option<Child>,
    /// Its stdout and stderr, appended across restarts.
    pub log: PathBuf,
    /// Times started.
    pub starts: usize,
}

impl Coordinator {
    /// Starts (or restarts) the process and waits until `/readyz` answers 200.
    pub async fn start(&mut self, args: &SoakArgs, redis: &TestRedis) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        // Both servers, through their proxies: libpq-style failover, the
        // coordinator keeps to the one that takes writes.
        let hosts: Vec<String> = self.db_proxies.iter().map(|p| p.addr.to_string()).collect();
        let database_url = format!(
            "postgres://postgres@{}/{DATABASE}?sslmode=disable&target_session_attrs=read-write",
            hosts.join(",")
        );
        let child = Command::new(&args.coordinator_binary)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUNLEASE_DATABASE_URL", database_url)
            .env("RUNLEASE_REDIS_URL", redis.url())
            .env("RUNLEASE_REDIS_PREFIX", "chaos")
            .env("RUNLEASE_LISTEN", format!("127.0.0.1:{}", self.port))
            .env("RUNLEASE_SECRET", TEST_SECRET)
            .env("RUNLEASE_LEASE_TTL_MS", args.ttl_ms.to_string())
            .env("RUNLEASE_HEARTBEAT_INTERVAL_MS", (args.ttl_ms / 5).to_string())
            .env("RUNLEASE_REAPER_INTERVAL_MS", "500")
            .env("RUNLEASE_DATABASE_POOL_SIZE", "10")
            .env("RUNLEASE_SHUTDOWN_GRACE_MS", "5000")
            // The soak's endpoint listens on 127.0.0.1 over plain http.
            .env("RUNLEASE_ENDPOINT_ALLOW_HOSTS", "127.0.0.1")
            .env("RUNLEASE_ENDPOINT_BACKOFF_MAX_MS", "2000")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", args.coordinator_binary.display()))?;
        self.child = Some(child);
        self.starts += 1;
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "coordinator {} exited during start ({status}); see {}",
                    self.index,
                    self.log.display()
                );
            }
            let ready = http
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 200);
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "coordinator {} was not ready within 60 s (start {}); see {}",
                    self.index,
                    self.starts,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within 15 s.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = signal("TERM", pid);
        }
        if tokio::time::timeout(Duration::from_secs(15), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// Sends signal `name` (`KILL`, `STOP`, `CONT`, `TERM`) to process `pid`.
pub fn signal(name: &str, pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -{name} {pid} failed");
    }
    Ok(())
}
