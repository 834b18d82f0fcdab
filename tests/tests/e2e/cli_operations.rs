//! The `runlease` CLI's operating verbs against a real coordinator: `jobs
//! list` pages a queue's jobs, `jobs retry|cancel|delete` refuses without
//! `--yes` (saying how many jobs match) and acts with it, `queues
//! pause|show|resume` gate claims.

use std::collections::HashSet;
use std::time::Duration;

use runlease_protocol::admin::{BulkJobsResponse, ListJobsResponse};
use runlease_protocol::producer::QueueSummary;
use runlease_protocol::{JobId, JobState};
use runlease_tests::cli::{ok, refused, runlease, stderr};
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::{Value, json};

const HOUR: Duration = Duration::from_secs(3600);

/// `n` jobs on `queue` failed by their worker as not retryable, with a
/// two-line error; answers their ids, oldest first.
async fn failed_via_api(api: &Api, queue: &str, n: u32) -> Vec<JobId> {
    for i in 0..n {
        api.enqueue(queue, json!({ "n": i })).await;
    }
    let leases = api.claim(queue, "w", n).await;
    assert_eq!(leases.len(), n as usize);
    for lease in &leases {
        let (status, body) = api
            .fail(lease, "boom: smtp refused\nstack line two", false, None)
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let mut ids: Vec<JobId> = leases.iter().map(|l| l.job_id).collect();
    ids.sort_unstable_by_key(|id| id.0);
    ids
}

async fn state_of(api: &Api, id: impl std::fmt::Display) -> JobState {
    api.job(id).await.state
}

#[tokio::test]
async fn cli_jobs_list_shows_a_queues_failed_jobs_a_page_at_a_time() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let failed = failed_via_api(&c.api, "emails", 3).await;
    let queued = c.api.enqueue("emails", json!("still queued")).await;
    let elsewhere = failed_via_api(&c.api, "other", 1).await;

    // The table: every failed job of the queue, none other, the error's first line.
    let table = ok(&runlease(
        &url,
        &["jobs", "list", "--queue", "emails", "--state", "failed"],
        None,
    )
    .await);
    let header = table.lines().next().unwrap();
    for column in ["id", "state", "attempt", "created", "finished", "error"] {
        assert!(header.contains(column), "{header}");
    }
    assert_eq!(table.lines().count(), 4, "a header and three jobs:\n{table}");
    for id in &failed {
        let row = table
            .lines()
            .find(|l| l.starts_with(&id.to_string()))
            .unwrap_or_else(|| panic!("{id} missing:\n{table}"));
        assert!(
            row.contains("failed") && row.contains("boom: smtp refused"),
            "{row}"
        );
        assert!(
            !row.contains("stack line two"),
            "only the error's first line: {row}"
        );
    }
    assert!(!table.contains(&queued.id.to_string()), "{table}");
    assert!(!table.contains(&elsewhere[0].to_string()), "{table}");

    // --json: the coordinator's answer, as a listing, newest first.
    let out = ok(&runlease(
        &url,
        &["--json", "jobs", "list", "--queue", "emails", "--state", "failed"],
        None,
    )
    .await);
    let listing: ListJobsResponse = serde_json::from_str(&out).unwrap();
    let listed: Vec<JobId> = listing.jobs.iter().map(|j| j.0.id).collect();
    let newest_first: Vec<JobId> = failed.iter().rev().copied().collect();
    assert_eq!(listed, newest_first);
    assert!(listing.jobs.iter().all(|j| j.0.state == JobState::Failed));
    assert_eq!(listing.next_cursor, None);
    let (status, from_api) = c.api.get("/v1/jobs?queue=emails&state=failed").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), from_api);

    // Several states; pages of two with the next page's command on stderr.
    let out = runlease(
        &url,
        &[
            "jobs",
            "list",
            "--queue",
            "emails",
            "--state",
            "queued,failed",
            "--limit",
            "2",
        ],
        None,
    )
    .await;
    let first = ok(&out);
    assert_eq!(first.lines().count(), 3, "{first}");
    let hint = stderr(&out);
    assert!(hint.contains("--cursor "), "{hint}");
    let cursor = hint
        .split_whitespace()
        .skip_while(|w| *w != "--cursor")
        .nth(1)
        .unwrap()
        .to_owned();
    let out = runlease(
        &url,
        &[
            "jobs",
            "list",
            "--queue",
            "emails",
            "--state",
            "queued,failed",
            "--limit",
            "2",
            "--cursor",
            &cursor,
        ],
        None,
    )
    .await;
    let second = ok(&out);
    assert_eq!(second.lines().count(), 3, "{second}");
    assert!(
        !stderr(&out).contains("--cursor"),
        "the last page: {}",
        stderr(&out)
    );
    let mut seen: Vec<String> = first
        .lines()
        .chain(second.lines())
        .filter(|l| !l.starts_with("id "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    seen.sort();
    let mut expected: Vec<String> = failed.iter().map(ToString::to_string).collect();
    expected.push(queued.id.to_string());
    expected.sort();
    assert_eq!(seen, expected, "two pages, no job twice or missing");

    // --all follows the pages: one listing of every job, no cursor left.
    let out = ok(&runlease(
        &url,
        &[
            "--json", "jobs", "list", "--queue", "emails", "--limit", "1", "--all",
        ],
        None,
    )
    .await);
    let all: ListJobsResponse = serde_json::from_str(&out).unwrap();
    assert_eq!(all.jobs.len(), 4);
    assert_eq!(all.next_cursor, None);
    let unique: HashSet<JobId> = all.jobs.iter().map(|j| j.0.id).collect();
    assert_eq!(unique.len(), 4);

    // A state that does not exist is refused before any request.
    let err = refused(
        &runlease(
            &url,
            &["jobs", "list", "--queue", "emails", "--state", "broken"],
            None,
        )
        .await,
    );
    assert!(err.contains("not a job state"), "{err}");
}

#[tokio::test]
async fn cli_bulk_retry_refuses_without_yes_and_retries_the_failed_jobs_with_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let failed = db.insert_terminal_jobs("emails", JobState::Failed, 4, HOUR).await;
    let done = db.insert_terminal_jobs("emails", JobState::Done, 2, HOUR).await;
    let other = db.insert_terminal_jobs("other", JobState::Failed, 1, HOUR).await;

    // Without --yes: says what it would do and how many match, changes nothing.
    let err = refused(
        &runlease(
            &url,
            &["jobs", "retry", "--queue", "emails", "--state", "failed"],
            None,
        )
        .await,
    );
    for part in ["would retry", "queue emails", "state failed", "4 match", "--yes"] {
        assert!(err.contains(part), "{part:?} missing: {err}");
    }
    // With --json: the count on stdout, the refusal as JSON on stderr.
    let out = runlease(
        &url,
        &[
            "--json", "jobs", "retry", "--queue", "emails", "--state", "failed",
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let counted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counted, json!({"matched": 4, "exact": true, "changed": 0}));
    let err: Value = serde_json::from_str(stderr(&out).trim()).unwrap();
    assert_eq!(err["error"]["code"], "not_confirmed");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("4 match"),
        "{err}"
    );
    // Narrowed by ids and by creation time, counted from the listing.
    let one = failed[0].to_string();
    let err = refused(
        &runlease(
            &url,
            &[
                "jobs", "retry", "--queue", "emails", "--state", "failed", "--id", &one,
            ],
            None,
        )
        .await,
    );
    assert!(
        err.contains("1 match") && err.contains("among the 1 ids given"),
        "{err}"
    );
    let err = refused(
        &runlease(
            &url,
            &[
                "jobs",
                "retry",
                "--queue",
                "emails",
                "--state",
                "failed",
                "--created-before",
                "2000-01-01T00:00:00Z",
            ],
            None,
        )
        .await,
    );
    assert!(
        err.contains("0 match") && err.contains("created before 2000-01-01"),
        "{err}"
    );
    // States the action never changes are called out.
    let err = refused(
        &runlease(
            &url,
            &["jobs", "retry", "--queue", "emails", "--state", "done"],
            None,
        )
        .await,
    );
    assert!(
        err.contains("2 match") && err.contains("retry changes only failed and cancelled"),
        "{err}"
    );
    for id in &failed {
        assert_eq!(
            state_of(&c.api, id).await,
            JobState::Failed,
            "nothing changed without --yes"
        );
    }

    // With --yes: every failed job of the queue is queued again; nothing else moved.
    let out = ok(&runlease(
        &url,
        &["jobs", "retry", "--queue", "emails", "--state", "failed", "--yes"],
        None,
    )
    .await);
    assert_eq!(out.trim(), "matched 4, changed 4");
    for id in &failed {
        assert_eq!(state_of(&c.api, id).await, JobState::Queued);
    }
    for id in &done {
        assert_eq!(state_of(&c.api, id).await, JobState::Done);
    }
    assert_eq!(
        state_of(&c.api, other[0]).await,
        JobState::Failed,
        "another queue is untouched"
    );
    let (_, q) = c.api.get("/v1/queues/emails").await;
    assert_eq!(
        (q["counts"]["failed"].clone(), q["counts"]["queued"].clone()),
        (json!(0), json!(4))
    );

    // --json prints the coordinator's answer; a repeat matches nothing.
    let out = ok(&runlease(
        &url,
        &[
            "--json", "jobs", "retry", "--queue", "emails", "--state", "failed", "--yes",
        ],
        None,
    )
    .await);
    let answer: BulkJobsResponse = serde_json::from_str(&out).unwrap();
    assert_eq!((answer.matched, answer.changed), (0, 0));

    // A delete of done jobs with --yes, matched against a refusal first.
    let err = refused(
        &runlease(
            &url,
            &["jobs", "delete", "--queue", "emails", "--state", "done"],
            None,
        )
        .await,
    );
    assert!(err.contains("would delete") && err.contains("2 match"), "{err}");
    let out = ok(&runlease(
        &url,
        &["jobs", "delete", "--queue", "emails", "--state", "done", "--yes"],
        None,
    )
    .await);
    assert_eq!(out.trim(), "matched 2, changed 2");
    let (status, _) = c.api.get(&format!("/v1/jobs/{}", done[0])).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn cli_queues_pause_stops_claims_show_says_paused_and_resume_hands_the_job_out() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let job = c.api.enqueue("emails", json!("hello")).await;

    let out = ok(&runlease(&url, &["queues", "pause", "emails"], None).await);
    assert!(out.contains("emails paused"), "{out}");
    assert!(
        c.api.claim("emails", "w", 5).await.is_empty(),
        "a paused queue hands out nothing"
    );

    let show = ok(&runlease(&url, &["queues", "show", "emails"], None).await);
    let row = |name: &str| -> Vec<String> {
        show.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{show}"))
            .split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(row("paused"), ["true"]);
    assert_eq!(row("queued"), ["1"]);
    assert_eq!(row("running"), ["0"]);
    assert_eq!(row("max_running"), ["none"]);
    assert_eq!(row("retention_done"), ["default"]);
    assert_eq!(row("retention_failed"), ["default"]);
    for name in [
        "oldest_queued_age",
        "lease_expiries",
        "retries",
        "rate_limit",
        "max_running_per_key",
    ] {
        row(name);
    }
    let out = ok(&runlease(&url, &["--json", "queues", "show", "emails"], None).await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    assert!(summary.settings.paused);
    assert_eq!(summary.counts["queued"], 1);

    let out = ok(&runlease(&url, &["--json", "queues", "resume", "emails"], None).await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    assert!(!summary.settings.paused);
    let leases = c.api.claim_wait("emails", "w", 1, 10_000).await;
    assert_eq!(leases.len(), 1, "a resumed queue hands out its job");
    assert_eq!(leases[0].job_id, job.id);
    let show = ok(&runlease(&url, &["queues", "show", "emails"], None).await);
    assert!(
        show.lines().any(|l| l.split_whitespace().eq(["paused", "false"])),
        "{show}"
    );

    // `queues` with no sub-verb still lists every queue.
    let list = ok(&runlease(&url, &["queues"], None).await);
    assert!(list.lines().any(|l| l.starts_with("emails")), "{list}");
    let err = refused(&runlease(&url, &["queues", "show", "bad queue"], None).await);
    assert!(err.contains("queue"), "{err}");
}
