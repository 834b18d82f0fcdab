//! The `runlease-coordinator` binary as a child process, for tests that need
//! separate processes (signals, several coordinators).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::{Api, TEST_SECRET, TestDb};

/// A loopback port nothing listens on right now, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The binary next to the test executable (`target/<profile>/`).
pub fn coordinator_binary() -> PathBuf {
    workspace_binary(
        "runlease-coordinator",
        &["-p", "runlease-coordinator", "--bin", "runlease-coordinator"],
    )
}

/// A binary of this workspace beside the running executable (tests run from
/// `target/<profile>/deps/`, the bench from `target/<profile>/`). `cargo
/// nextest run --workspace` builds test targets but not other packages'
/// binaries, so a missing one is built here with `cargo build <args>` in the
/// same profile (cargo's own lock serialises parallel tests asking at once).
pub fn workspace_binary(name: &str, build_args: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir = if dir.ends_with("deps") {
        dir.parent().unwrap()
    } else {
        dir
    };
    let bin = dir.join(name);
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut cmd = std::process::Command::new(cargo);
        cmd.arg("build").args(build_args);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo to build {name}: {e}"));
        assert!(status.success(), "cargo build {build_args:?} failed");
    }
    assert!(bin.exists(), "{} is missing after building it", bin.display());
    bin
}

/// A coordinator process over a test database; killed when dropped.
pub struct CoordinatorProcess {
    /// A caller bound to it.
    pub api: Api,
    /// The child process.
    pub child: Child,
}

impl CoordinatorProcess {
    /// Starts the binary over `db` with the test secret, a free port, the
    /// given extra `RUNLEASE_*` variables, and waits until it is ready.
    pub async fn start(db: &TestDb, env: &[(&str, String)]) -> Self {
        Self::start_binary(&coordinator_binary(), db, env).await
    }

    /// [`CoordinatorProcess::start`] with another build of the coordinator
    /// (a benchmark comparing releases).
    pub async fn start_binary(binary: &std::path::Path, db: &TestDb, env: &[(&str, String)]) -> Self {
        Self::start_url(binary, &db.url, &db.name, env).await
    }

    /// Starts `binary` over the database at `url` (a test's own cluster,
    /// say), with Redis channels named after `name`.
    pub async fn start_url(binary: &std::path::Path, url: &str, name: &str, env: &[(&str, String)]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(binary);
        cmd.env("RUNLEASE_DATABASE_URL", url)
            .env("RUNLEASE_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUNLEASE_SECRET", TEST_SECRET)
            .env("RUNLEASE_REDIS_PREFIX", format!("runlease-test:{name}"))
            .env_remove("RUNLEASE_API_KEYS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        // Creating the database and migrating it can take a while on a
        // fresh cluster of a busy machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok((200, _)) = api.try_get("/readyz").await {
                return Self { api, child };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the coordinator binary did not become ready on port {port} within 30 s");
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("still running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Runs `program args` in `dir` to completion, failing the test with its
/// output if it fails; `needed_for` says what the program is needed for
/// when it cannot be started at all.
pub fn run_tool(dir: &std::path::Path, program: &str, args: &[&str], needed_for: &str) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} must be on PATH {needed_for}: {e}"));
    assert!(
        out.status.success(),
        "`{program} {}` in {} failed ({}):\n{}\n{}",
        args.join(" "),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
