//! The `runlease` CLI binary as a child process, and the checks the CLI tests
//! make of what it printed and how it exited.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The `runlease` binary beside the test executable, built first if missing.
pub fn cli_binary() -> PathBuf {
    crate::process::workspace_binary(
        "runlease",
        &["-p", "runlease-client", "--features", "cli", "--bin", "runlease"],
    )
}

/// Runs `runlease --url <url> <args>` with no key in its environment and
/// `stdin` (or nothing) on its standard input.
pub async fn runlease(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(cli_binary())
            .arg("--url")
            .arg(&url)
            .args(&args)
            .env_remove("RUNLEASE_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).unwrap();
        }
        drop(pipe);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

/// A run's standard output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A run's standard error, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The standard output of a run that must succeed.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "runlease failed ({:?}): {}",
        out.status.code(),
        stderr(out)
    );
    stdout(out)
}

/// The JSON a run that must succeed printed (a `--json` run).
pub fn json_out(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "runlease failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The single `runlease: ...` line of a run that must exit 1 and print nothing.
pub fn refused(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stdout: {}", stdout(out));
    assert_eq!(stdout(out), "", "nothing on stdout");
    let err = stderr(out).trim().to_owned();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("runlease: "), "{err}");
    err
}
