//! The short chaos soak: `runlease-chaos soak --short` (bench/) builds its own PostgreSQL
//! cluster, Redis and coordinator processes, runs a few thousand jobs through
//! worker processes while it kills, stops, partitions and restarts parts of
//! the system (its PostgreSQL primary among them: crashed, its synchronous
//! standby promoted), then checks every job against the database and the
//! workers' logs. It exits 0 only when no job was lost, no stale outcome was
//! accepted and at least 95% of jobs were terminal within 25 s.

use std::process::Stdio;
use std::time::{Duration, Instant};

use runlease_tests::process::{coordinator_binary, workspace_binary};

#[tokio::test]
async fn the_short_chaos_soak_loses_nothing_and_accepts_no_stale_outcome() {
    let coordinator = coordinator_binary();
    let chaos = workspace_binary(
        "runlease-chaos",
        &["-p", "runlease-bench", "--bin", "runlease-chaos"],
    );
    let started = Instant::now();
    let out = tokio::process::Command::new(&chaos)
        .args(["soak", "--short", "--coordinator-binary"])
        .arg(&coordinator)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(420), out)
        .await
        .expect("the short soak did not end within 7 minutes")
        .expect("cannot run runlease-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    eprintln!("the short soak took {:?}", started.elapsed());
    assert!(
        out.status.success(),
        "runlease-chaos soak --short exited {}: see its report above",
        out.status
    );
    // The exit status is the verdict; the report's own figures say the same.
    assert_eq!(figure(&stdout, "jobs lost"), 0);
    assert_eq!(figure(&stdout, "stale outcomes accepted"), 0);
    assert!(stdout.contains("verdict: PASS"), "no PASS verdict in the report");
    // The soak's PostgreSQL failed over once (primary crashed, standby
    // promoted) and nothing acknowledged was lost (the figures above).
    assert!(
        stdout.contains("PostgreSQL failover: primary"),
        "no failover in the report's faults"
    );
}

/// The number after `label` on its line of the report.
fn figure(report: &str, label: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the report has no figure for {label:?}"))
}
