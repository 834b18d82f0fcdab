//! What the verbs print: a job, tables of jobs, queues and schedules, and
//! the coordinator's answers as JSON.

use chrono::{DateTime, Utc};
use runlease_client::protocol::admin::{EndpointFigures, ListedJob, RateLimit};
use runlease_client::protocol::producer::QueueSummary;
use runlease_client::protocol::schedules::Schedule;
use runlease_client::protocol::{Backoff, Job, JobLink, JobState};

use crate::failure::Failure;

/// `value` as pretty JSON on standard output.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub fn when(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

pub fn print_job(job: &Job) {
    let rows: Vec<(&str, String)> = vec![
        ("id", job.id.to_string()),
        ("queue", job.queue.to_string()),
        ("state", job.state.to_string()),
        ("attempt", format!("{}/{}", job.attempt, job.max_attempts)),
        ("run_lease", job.run_lease.to_string()),
        ("priority", job.priority.to_string()),
        ("created_at", when(Some(job.created_at))),
        ("run_at", when(Some(job.run_at))),
        ("finished_at", when(job.finished_at)),
        ("cancel_requested", job.cancel_requested.to_string()),
        (
            "concurrency_key",
            job.concurrency_key.clone().unwrap_or_else(|| "-".into()),
        ),
        ("payload", job.payload.to_string()),
        (
            "progress",
            job.progress.as_ref().map_or("-".into(), ToString::to_string),
        ),
        (
            "result",
            job.result.as_ref().map_or("-".into(), ToString::to_string),
        ),
        ("error", job.error.clone().unwrap_or_else(|| "-".into())),
    ];
    for (k, v) in rows {
        println!("{k:<17} {v}");
    }
    if let Some(policy) = job.on_dependency_failure {
        println!("{:<17} {}", "on_dep_failure", policy.as_str());
    }
    print_links("dependencies", &job.dependencies);
    print_links("dependents", &job.dependents);
    if !job.attempts.is_empty() {
        println!(
            "\n{:<10} {:<24} {:<14} {:<26} error",
            "run_lease", "worker", "outcome", "finished_at"
        );
        for a in &job.attempts {
            let outcome = a.outcome.map_or("running", |o| o.as_str());
            println!(
                "{:<10} {:<24} {:<14} {:<26} {}",
                a.run_lease,
                a.worker_id,
                outcome,
                when(a.finished_at),
                a.error.as_deref().unwrap_or("-")
            );
            if let Some(reason) = &a.retry_reason {
                let at = a.retry_at.map(|t| format!(", retry at {}", when(Some(t))));
                println!("{:<10} {reason}{}", "", at.unwrap_or_default());
            }
        }
    }
}

/// A job's dependencies or dependents, one per line with its state now.
fn print_links(title: &str, links: &[JobLink]) {
    if links.is_empty() {
        return;
    }
    println!("\n{:<38} state", title);
    for l in links {
        println!("{:<38} {}", l.id, l.state.map_or("deleted", |s| s.as_str()));
    }
}

/// `s` cut to `max` characters (on one line), with an ellipsis when cut.
pub fn snippet(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    let mut out: String = line.chars().take(max).collect();
    if out.len() < line.len() || s.trim().lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

pub fn table_time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

pub fn print_job_header() {
    println!(
        "{:<36} {:<14} {:<8} {:<20} {:<20} error",
        "id", "state", "attempt", "created", "finished"
    );
}

pub fn print_job_rows(jobs: &[ListedJob]) {
    for ListedJob(job) in jobs {
        println!(
            "{:<36} {:<14} {:<8} {:<20} {:<20} {}",
            job.id.to_string(),
            job.state.as_str(),
            format!("{}/{}", job.attempt, job.max_attempts),
            table_time(Some(job.created_at)),
            table_time(job.finished_at),
            job.error
                .as_deref()
                .map_or_else(|| "-".to_owned(), |e| snippet(e, 60))
        );
    }
}

pub fn print_queue(q: &QueueSummary) {
    let mut rows: Vec<(String, String)> = vec![("queue".into(), q.queue.to_string())];
    for s in JobState::ALL {
        let n = q.counts.get(s.as_str()).copied().unwrap_or(0);
        rows.push((s.as_str().into(), n.to_string()));
    }
    let set = &q.settings;
    rows.extend([
        (
            "oldest_queued_age".into(),
            q.oldest_queued_age_ms.map_or("-".into(), |a| format!("{a} ms")),
        ),
        ("lease_expiries".into(), q.lease_expiries.to_string()),
        ("retries".into(), q.retries.to_string()),
        ("paused".into(), set.paused.to_string()),
        ("max_running".into(), limit_text(set.max_running)),
        ("max_running_per_key".into(), limit_text(set.max_running_per_key)),
        ("rate_limit".into(), rate_text(set.rate_limit)),
        ("retention_done".into(), retention_text(set.retention_done_ms)),
        ("retention_failed".into(), retention_text(set.retention_failed_ms)),
        (
            "max_attempts".into(),
            set.max_attempts.map_or("default".into(), |n| n.to_string()),
        ),
        ("backoff".into(), backoff_text(set.backoff.as_ref())),
        (
            "retry_window".into(),
            set.retry_window_ms.map_or("none".into(), |ms| format!("{ms} ms")),
        ),
        (
            "dead_letter_queue".into(),
            set.dead_letter_queue
                .as_ref()
                .map_or("none".into(), |q| q.to_string()),
        ),
        ("endpoint".into(), endpoint_text(q.endpoint.as_ref())),
    ]);
    if let Some(e) = &q.endpoint {
        rows.extend([
            ("endpoint_timeout".into(), format!("{} ms", e.timeout_ms)),
            ("endpoint_concurrency".into(), e.concurrency.to_string()),
            ("endpoint_health".into(), health_text(e)),
            ("endpoint_in_flight".into(), e.in_flight.to_string()),
            (
                "endpoint_last_error".into(),
                e.last_error.as_ref().map_or_else(
                    || "-".to_owned(),
                    |err| format!("{} ({})", err, when(e.last_error_at)),
                ),
            ),
        ]);
    }
    for (k, v) in rows {
        println!("{k:<20} {v}");
    }
}

/// A backoff in words: the fields set, each unset one `default`.
pub fn backoff_text(b: Option<&Backoff>) -> String {
    let b = b.copied().unwrap_or_default();
    let field = |v: Option<String>| v.unwrap_or_else(|| "default".to_owned());
    format!(
        "base {}, max {}, factor {}, jitter {}",
        field(b.base_ms.map(|v| format!("{v} ms"))),
        field(b.max_ms.map(|v| format!("{v} ms"))),
        field(b.factor.map(|v| v.to_string())),
        field(b.jitter.map(|v| v.to_string()))
    )
}

/// A queue's endpoint in words: its URL, or that it has none.
pub fn endpoint_text(e: Option<&EndpointFigures>) -> String {
    e.map_or_else(|| "none (pull workers only)".to_owned(), |e| e.url.clone())
}

/// `healthy`, or `unhealthy` with the connection failures in a row.
pub fn health_text(e: &EndpointFigures) -> String {
    match (e.healthy, e.consecutive_failures) {
        (true, 0) => "healthy".to_owned(),
        (true, n) => format!("healthy ({n} connection failures in a row)"),
        (false, n) => format!("unhealthy ({n} connection failures in a row)"),
    }
}

/// A queue's retention setting in words: `default` (the coordinator's).
pub fn retention_text(v: Option<i64>) -> String {
    match v {
        None => "default".to_owned(),
        Some(0) => "0 (forever)".to_owned(),
        Some(ms) => format!("{ms} ms"),
    }
}

pub fn limit_text(v: Option<i32>) -> String {
    v.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

pub fn rate_text(r: Option<RateLimit>) -> String {
    r.map_or_else(
        || "none".to_owned(),
        |r| format!("{}/s, burst {}", r.per_s, r.burst),
    )
}

pub fn print_schedule(s: &Schedule) {
    let default = |v: Option<String>| v.unwrap_or_else(|| "default".to_owned());
    let rows: Vec<(&str, String)> = vec![
        ("name", s.name.clone()),
        ("queue", s.queue.to_string()),
        ("cron", s.cron.clone()),
        ("timezone", s.timezone.clone()),
        ("paused", s.paused.to_string()),
        ("next_fire_at", when(s.next_fire_at)),
        ("last_fired_at", when(s.last_fired_at)),
        ("payload", s.payload.to_string()),
        ("priority", s.priority.to_string()),
        ("max_attempts", default(s.max_attempts.map(|n| n.to_string()))),
        ("timeout_ms", default(s.timeout_ms.map(|n| n.to_string()))),
        ("created_at", when(Some(s.created_at))),
        ("updated_at", when(Some(s.updated_at))),
    ];
    for (k, v) in rows {
        println!("{k:<14} {v}");
    }
}

/// A table of schedules, each column as wide as its widest cell.
pub fn print_schedules(schedules: &[Schedule]) {
    let header = [
        "name",
        "queue",
        "cron",
        "timezone",
        "paused",
        "next_fire",
        "last_fire",
    ];
    let rows: Vec<[String; 7]> = schedules
        .iter()
        .map(|s| {
            [
                s.name.clone(),
                s.queue.to_string(),
                s.cron.clone(),
                s.timezone.clone(),
                s.paused.to_string(),
                table_time(s.next_fire_at),
                table_time(s.last_fired_at),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$} "));
            }
        }
        println!("{out}");
    };
    line(&header.map(str::to_owned));
    for row in &rows {
        line(row);
    }
}

pub fn print_queues(queues: &[QueueSummary]) {
    let states = JobState::ALL;
    print!("{:<24}", "queue");
    for s in states {
        print!(" {:>14}", s.as_str());
    }
    println!(
        " {:>16} {:>9} {:>8}  {:<9} {:>9}  endpoint",
        "oldest_queued_ms", "expiries", "retries", "health", "in_flight"
    );
    for q in queues {
        print!("{:<24}", q.queue.as_str());
        for s in states {
            print!(" {:>14}", q.counts.get(s.as_str()).copied().unwrap_or(0));
        }
        let age = q.oldest_queued_age_ms.map_or("-".into(), |a| a.to_string());
        print!(" {:>16} {:>9} {:>8}", age, q.lease_expiries, q.retries);
        match &q.endpoint {
            None => println!("  {:<9} {:>9}  -", "-", "-"),
            Some(e) => {
                let health = if e.healthy { "healthy" } else { "unhealthy" };
                let in_flight = format!("{}/{}", e.in_flight, e.concurrency);
                let error = e
                    .last_error
                    .as_deref()
                    .map_or_else(String::new, |err| format!("  last error: {}", snippet(err, 60)));
                println!("  {health:<9} {in_flight:>9}  {}{error}", e.url);
            }
        }
    }
}
