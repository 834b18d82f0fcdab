//! A `redis-server` of a test's own, on a free port, that the test can stop
//! and start again (the machine's Redis must keep running for everyone else).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A Redis server owned by one test; killed when dropped.
pub struct TestRedis {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl TestRedis {
    /// Starts a server on a free port and waits until it answers.
    pub async fn start() -> Self {
        let mut redis = Self {
            port: crate::process::free_port(),
            child: None,
        };
        redis.resume().await;
        redis
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would); connections drop.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server (is it installed?): {e}"));
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not start on port {}", self.port);
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
