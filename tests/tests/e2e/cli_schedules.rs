//! The `runlease` CLI's schedule and flow-control verbs against a real
//! coordinator: `schedules set|list|show|delete` (a bad cron refused with
//! one line), `enqueue --concurrency-key`, and `queues limit` setting and
//! clearing a queue's limits, as `queues show` then says.

use std::time::{Duration, Instant};

use runlease_protocol::producer::QueueSummary;
use runlease_protocol::schedules::{ListSchedulesResponse, Schedule};
use runlease_protocol::{Job, JobState};
use runlease_tests::cli::{ok, refused, runlease, stderr};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

/// The values after `name` on the line of a `key value` listing that starts with it.
fn row(listing: &str, name: &str) -> String {
    listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row:\n{listing}"))
        .trim_start()[name.len()..]
        .trim()
        .to_owned()
}

#[tokio::test]
async fn cli_schedules_set_list_show_and_delete_a_schedule_and_refuse_a_bad_cron() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();

    // No schedule yet: the header alone, and a note on stderr.
    let out = runlease(&url, &["schedules", "list"], None).await;
    let table = ok(&out);
    assert_eq!(table.lines().count(), 1, "{table}");
    assert!(stderr(&out).contains("no schedules"), "{}", stderr(&out));

    // set, every option given: the schedule as stored, in rows.
    let shown = ok(&runlease(
        &url,
        &[
            "schedules",
            "set",
            "nightly",
            "--queue",
            "reports",
            "--cron",
            "30 2 * * *",
            "--timezone",
            "Europe/Paris",
            "--payload",
            r#"{"kind":"daily"}"#,
            "--priority=-2",
            "--max-attempts",
            "4",
            "--timeout-ms",
            "60000",
        ],
        None,
    )
    .await);
    assert_eq!(row(&shown, "name"), "nightly");
    assert_eq!(row(&shown, "cron"), "30 2 * * *");
    assert_eq!(row(&shown, "timezone"), "Europe/Paris");
    assert_eq!(row(&shown, "paused"), "false");
    assert_eq!(row(&shown, "payload"), r#"{"kind":"daily"}"#);
    assert_eq!(row(&shown, "max_attempts"), "4");
    assert_ne!(row(&shown, "next_fire_at"), "-", "{shown}");
    let (status, stored) = c.api.get("/v1/schedules/nightly").await;
    assert_eq!(status, 200, "{stored}");
    let stored: Schedule = serde_json::from_value(stored).unwrap();
    assert_eq!(stored.queue.as_str(), "reports");
    assert_eq!(stored.payload, json!({"kind": "daily"}));
    assert_eq!(
        (stored.priority, stored.max_attempts, stored.timeout_ms),
        (-2, Some(4), Some(60_000))
    );
    assert!(!stored.paused);

    // set with the payload on stdin, paused; --json prints the schedule.
    let out = ok(&runlease(
        &url,
        &[
            "--json",
            "schedules",
            "set",
            "held",
            "--queue",
            "pings",
            "--cron",
            "*/5 * * * *",
            "--paused",
        ],
        Some(r#"{"ping": true}"#),
    )
    .await);
    let held: Schedule = serde_json::from_str(&out).unwrap();
    assert_eq!(held.name, "held");
    assert_eq!(held.payload, json!({"ping": true}));
    assert_eq!(held.timezone, "UTC");
    assert!(held.paused);
    assert_eq!(held.next_fire_at, None, "a paused schedule has no next fire");

    // list: a row per schedule, by name.
    let table = ok(&runlease(&url, &["schedules", "list"], None).await);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "name",
            "queue",
            "cron",
            "timezone",
            "paused",
            "next_fire",
            "last_fire"
        ]
    );
    let lines: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("held ") && lines[1].starts_with("nightly "),
        "{table}"
    );
    let nightly: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(nightly[1], "reports");
    assert_eq!(nightly[2..7].join(" "), "30 2 * * *");
    assert_eq!(nightly[7..9], ["Europe/Paris", "false"]);
    assert_eq!(
        nightly[9],
        stored
            .next_fire_at
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    assert_eq!(nightly[10], "-", "never fired: {table}");
    let held_row: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(held_row[7..], ["UTC", "true", "-", "-"], "{table}");
    // With no sub-verb, `schedules` lists too.
    assert_eq!(ok(&runlease(&url, &["schedules"], None).await), table);

    // --json list and show: exactly what the coordinator answers.
    let out = ok(&runlease(&url, &["--json", "schedules", "list"], None).await);
    let listing: ListSchedulesResponse = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listing.schedules.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["held", "nightly"]);
    let (_, from_api) = c.api.get("/v1/schedules").await;
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), from_api);
    let out = ok(&runlease(&url, &["--json", "schedules", "show", "nightly"], None).await);
    assert_eq!(serde_json::from_str::<Schedule>(&out).unwrap(), stored);
    let (_, from_api) = c.api.get("/v1/schedules/nightly").await;
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), from_api);
    let shown = ok(&runlease(&url, &["schedules", "show", "held"], None).await);
    assert_eq!(row(&shown, "paused"), "true");
    assert_eq!(row(&shown, "next_fire_at"), "-");
    assert_eq!(row(&shown, "max_attempts"), "default");

    // A bad cron, a bad time zone and a missing payload: one line, exit 1, nothing stored.
    let err = refused(
        &runlease(
            &url,
            &[
                "schedules",
                "set",
                "broken",
                "--queue",
                "reports",
                "--cron",
                "61 * * * *",
                "--payload",
                "1",
            ],
            None,
        )
        .await,
    );
    assert!(err.contains("invalid") && err.contains("cron"), "{err}");
    let err = refused(
        &runlease(
            &url,
            &[
                "schedules",
                "set",
                "broken",
                "--queue",
                "reports",
                "--cron",
                "* * * * *",
                "--timezone",
                "Mars/Olympus",
                "--payload",
                "1",
            ],
            None,
        )
        .await,
    );
    assert!(err.contains("IANA"), "{err}");
    let err = refused(
        &runlease(
            &url,
            &[
                "schedules",
                "set",
                "broken",
                "--queue",
                "reports",
                "--cron",
                "* * * * *",
            ],
            None,
        )
        .await,
    );
    assert!(err.contains("no payload"), "{err}");
    let err = refused(
        &runlease(
            &url,
            &[
                "schedules",
                "set",
                "broken",
                "--queue",
                "reports",
                "--cron",
                "* * * * *",
                "--payload",
                "{nope",
            ],
            None,
        )
        .await,
    );
    assert!(err.contains("payload is not valid JSON"), "{err}");
    assert_eq!(c.api.get("/v1/schedules/broken").await.0, 404);
    let err = refused(&runlease(&url, &["schedules", "show", "broken"], None).await);
    assert!(err.contains("not found"), "{err}");

    // delete: gone from show, list and the API; the answer is the schedule as it was.
    let out = ok(&runlease(&url, &["schedules", "delete", "nightly"], None).await);
    assert!(out.contains("schedule nightly deleted"), "{out}");
    assert_eq!(c.api.get("/v1/schedules/nightly").await.0, 404);
    let err = refused(&runlease(&url, &["schedules", "show", "nightly"], None).await);
    assert!(err.contains("not found"), "{err}");
    let err = refused(&runlease(&url, &["schedules", "delete", "nightly"], None).await);
    assert!(err.contains("not found"), "{err}");
    let out = ok(&runlease(&url, &["--json", "schedules", "delete", "held"], None).await);
    assert_eq!(serde_json::from_str::<Schedule>(&out).unwrap(), held);
    let out = ok(&runlease(&url, &["--json", "schedules", "list"], None).await);
    let listing: ListSchedulesResponse = serde_json::from_str(&out).unwrap();
    assert!(listing.schedules.is_empty(), "{out}");
}

#[tokio::test]
async fn cli_schedules_list_shows_the_last_fire_of_a_schedule_that_fired() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    ok(&runlease(
        &url,
        &[
            "schedules",
            "set",
            "every-second",
            "--queue",
            "ticks",
            "--cron",
            "* * * * * *",
            "--payload",
            r#"{"tick": true}"#,
        ],
        None,
    )
    .await);
    let started = Instant::now();
    let fired = loop {
        let out = ok(&runlease(&url, &["--json", "schedules", "show", "every-second"], None).await);
        let schedule: Schedule = serde_json::from_str(&out).unwrap();
        if let Some(t) = schedule.last_fired_at {
            break t;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the schedule never fired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let table = ok(&runlease(&url, &["schedules", "list"], None).await);
    let line = table.lines().nth(1).unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[0], "every-second");
    let last = cells.last().unwrap();
    assert_ne!(*last, "-", "{table}");
    // It may have fired again between the two reads; never earlier.
    let last = chrono::DateTime::parse_from_rfc3339(last).unwrap();
    assert!(last >= fired - chrono::Duration::seconds(1), "{table}");
    let (_, q) = c.api.get("/v1/queues/ticks").await;
    assert!(q["counts"]["queued"].as_i64().unwrap() >= 1, "{q}");
    ok(&runlease(&url, &["schedules", "delete", "every-second"], None).await);
}

#[tokio::test]
async fn cli_enqueue_puts_the_concurrency_key_on_the_job_and_the_per_key_limit_holds() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();

    let out = ok(&runlease(
        &url,
        &["--json", "enqueue", "tenants", "1", "--concurrency-key", "acme"],
        None,
    )
    .await);
    let first: Job = serde_json::from_str(&out).unwrap();
    assert_eq!(first.concurrency_key.as_deref(), Some("acme"));
    assert_eq!(
        c.api.job(first.id).await.concurrency_key.as_deref(),
        Some("acme"),
        "the coordinator stored the key"
    );
    // The table shows it; a job enqueued without it has none.
    let table = ok(&runlease(
        &url,
        &["enqueue", "tenants", "2", "--concurrency-key", "acme"],
        None,
    )
    .await);
    assert_eq!(row(&table, "concurrency_key"), "acme");
    let other = ok(&runlease(
        &url,
        &["--json", "enqueue", "tenants", "3", "--concurrency-key", "globex"],
        None,
    )
    .await);
    let other: Job = serde_json::from_str(&other).unwrap();
    let plain: Job = serde_json::from_str(&ok(
        &runlease(&url, &["--json", "enqueue", "tenants", "4"], None).await
    ))
    .unwrap();
    assert_eq!(c.api.job(plain.id).await.concurrency_key, None);

    // One running job per key: of the two acme jobs only one starts.
    let out = ok(&runlease(
        &url,
        &["queues", "limit", "tenants", "--max-running-per-key", "1"],
        None,
    )
    .await);
    assert!(out.contains("max_running_per_key 1"), "{out}");
    let leases = c.api.claim("tenants", "w", 10).await;
    let mut payloads: Vec<Value> = leases.iter().map(|l| l.payload.clone()).collect();
    payloads.sort_by_key(|p| p.as_i64());
    assert_eq!(
        payloads,
        [json!(1), json!(3), json!(4)],
        "acme's second job waits"
    );
    assert_eq!(c.api.job(other.id).await.state, JobState::Running);
}

#[tokio::test]
async fn cli_queues_limit_sets_and_clears_limits_as_queues_show_says() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let show = async |url: &str| ok(&runlease(url, &["queues", "show", "emails"], None).await);

    let out = ok(&runlease(&url, &["queues", "limit", "emails", "--max-running", "2"], None).await);
    assert_eq!(
        out.trim(),
        "queue emails: max_running 2, max_running_per_key none, rate_limit none"
    );
    let shown = show(&url).await;
    assert_eq!(row(&shown, "max_running"), "2");
    assert_eq!(row(&shown, "max_running_per_key"), "none");
    assert_eq!(row(&shown, "rate_limit"), "none");
    assert_eq!(row(&shown, "paused"), "false");
    let (_, q) = c.api.get("/v1/queues/emails").await;
    assert_eq!(q["settings"]["max_running"], json!(2));

    // Limits not named stay as they were.
    let out = ok(&runlease(
        &url,
        &[
            "--json",
            "queues",
            "limit",
            "emails",
            "--max-running-per-key",
            "1",
            "--rate",
            "2.5/5",
        ],
        None,
    )
    .await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    assert_eq!(summary.settings.max_running, Some(2));
    assert_eq!(summary.settings.max_running_per_key, Some(1));
    let rate = summary.settings.rate_limit.unwrap();
    assert_eq!((rate.per_s, rate.burst), (2.5, 5));
    let shown = show(&url).await;
    assert_eq!(row(&shown, "max_running"), "2");
    assert_eq!(row(&shown, "max_running_per_key"), "1");
    assert_eq!(row(&shown, "rate_limit"), "2.5/s, burst 5");

    // none clears one limit, and only that one.
    ok(&runlease(
        &url,
        &["queues", "limit", "emails", "--max-running", "none"],
        None,
    )
    .await);
    let shown = show(&url).await;
    assert_eq!(row(&shown, "max_running"), "none");
    assert_eq!(row(&shown, "max_running_per_key"), "1");
    assert_eq!(row(&shown, "rate_limit"), "2.5/s, burst 5");
    let (_, q) = c.api.get("/v1/queues/emails").await;
    assert_eq!(q["settings"]["max_running"], Value::Null);
    ok(&runlease(
        &url,
        &[
            "queues",
            "limit",
            "emails",
            "--max-running-per-key",
            "none",
            "--rate",
            "none",
        ],
        None,
    )
    .await);
    let (_, q) = c.api.get("/v1/queues/emails").await;
    assert_eq!(
        (
            q["settings"]["max_running"].clone(),
            q["settings"]["max_running_per_key"].clone(),
            q["settings"]["rate_limit"].clone()
        ),
        (Value::Null, Value::Null, Value::Null)
    );

    // Refused before any request: nothing to change, values out of range.
    for (args, needle) in [
        (&["queues", "limit", "emails"][..], "nothing to change"),
        (
            &["queues", "limit", "emails", "--max-running", "0"][..],
            "not a limit",
        ),
        (
            &["queues", "limit", "emails", "--max-running-per-key", "lots"][..],
            "not a limit",
        ),
        (&["queues", "limit", "emails", "--rate", "5"][..], "not a rate"),
        (&["queues", "limit", "emails", "--rate", "0/5"][..], "not a rate"),
        (
            &["queues", "limit", "emails", "--rate", "NaN/5"][..],
            "not a rate",
        ),
    ] {
        let err = refused(&runlease(&url, args, None).await);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let shown = show(&url).await;
    assert_eq!(row(&shown, "max_running"), "none");
    assert_eq!(row(&shown, "rate_limit"), "none");
}
