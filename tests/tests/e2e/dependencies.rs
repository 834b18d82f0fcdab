//! Job dependencies over HTTP: a job waits `blocked` until its dependencies
//! end, is queued by the statement that ends the last one, and is cancelled
//! (or, with `run`, queued anyway) when one fails, is cancelled or deleted.

use runlease_protocol::worker::Lease;
use runlease_protocol::{JobState, OnDependencyFailure};
use runlease_tests::api::Api;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use uuid::Uuid;

/// Enqueues `jobs` in one batch; answers the batch's jobs (201 asserted).
pub async fn batch(api: &Api, jobs: Value) -> Vec<Value> {
    let (status, body) = api.post("/v1/jobs/batch", &json!({ "jobs": jobs })).await;
    assert_eq!(status, 201, "{body}");
    body["jobs"].as_array().unwrap().clone()
}

/// The ids of a batch's answer.
pub fn ids_of(jobs: &[Value]) -> Vec<Uuid> {
    jobs.iter()
        .map(|j| j["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// Claims every lease `queue` has now (a claim without waiting).
async fn claim_all(api: &Api, queue: &str) -> Vec<Lease> {
    api.claim(queue, "w", 1000).await
}

/// Every dependency a lease carries has ended `done`: nothing was handed
/// out before its dependencies had ended.
fn assert_dependencies_done(lease: &Lease) {
    for d in &lease.dependencies {
        assert_eq!(
            d.state,
            Some(JobState::Done),
            "lease of {} carries {d:?}",
            lease.job_id
        );
    }
}

#[tokio::test]
async fn a_chain_runs_one_job_after_the_other_each_lease_carrying_its_dependency() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "chain", "payload": 0, "ref": "a"},
            {"queue": "chain", "payload": 1, "ref": "b", "depends_on": ["a"]},
            {"queue": "chain", "payload": 2, "ref": "c", "depends_on": ["b"], "on_dependency_failure": "run"},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let states: Vec<&str> = jobs.iter().map(|j| j["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["queued", "blocked", "blocked"]);
    let refs: Vec<&str> = jobs.iter().map(|j| j["ref"].as_str().unwrap()).collect();
    assert_eq!(refs, ["a", "b", "c"]);

    // The view links both ways.
    let b = c.api.job(ids[1]).await;
    assert_eq!(b.dependencies.len(), 1);
    assert_eq!(
        (b.dependencies[0].id.0, b.dependencies[0].state),
        (ids[0], Some(JobState::Queued))
    );
    assert_eq!(b.dependents.iter().map(|l| l.id.0).collect::<Vec<_>>(), [ids[2]]);
    assert_eq!(b.on_dependency_failure, Some(OnDependencyFailure::Cancel));
    assert_eq!(
        c.api.job(ids[2]).await.on_dependency_failure,
        Some(OnDependencyFailure::Run)
    );
    let (_, q) = c.api.get("/v1/queues/chain").await;
    assert_eq!(
        (q["counts"]["blocked"].as_i64(), q["counts"]["queued"].as_i64()),
        (Some(2), Some(1)),
        "{q}"
    );

    for (step, id) in ids.iter().enumerate() {
        // Only the job whose dependencies ended is claimable.
        let leases = claim_all(&c.api, "chain").await;
        assert_eq!(leases.iter().map(|l| l.job_id.0).collect::<Vec<_>>(), [*id]);
        let lease = &leases[0];
        if step == 0 {
            assert!(lease.dependencies.is_empty());
        } else {
            let dep = &lease.dependencies[0];
            assert_eq!(lease.dependencies.len(), 1);
            assert_eq!((dep.id.0, dep.state), (ids[step - 1], Some(JobState::Done)));
            assert_eq!(dep.result, Some(json!({"step": step - 1})));
            // Queued by the transaction that ended its dependency: due
            // from the instant that dependency ended.
            let before = c.api.job(ids[step - 1]).await;
            assert_eq!(Some(c.api.job(id).await.run_at), before.finished_at);
        }
        assert_eq!(c.api.complete(lease, json!({"step": step})).await.0, 200);
    }
    assert_eq!(
        c.api
            .metric("runlease_jobs_unblocked_total{queue=\"chain\"}")
            .await,
        2.0
    );
}

#[tokio::test]
async fn a_fan_out_and_fan_in_of_one_batch_run_in_dependency_order() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // One batch of 1,000: a root, 988 leaves on it, ten joins of about 99
    // leaves each (a job has at most 100 dependencies), a sink on the joins.
    let mut jobs = vec![json!({"queue": "fan", "payload": "root", "ref": "root"})];
    let leaves = 988;
    for i in 0..leaves {
        jobs.push(json!({"queue": "fan", "payload": i, "ref": format!("l{i}"), "depends_on": ["root"]}));
    }
    for m in 0..10 {
        let on: Vec<String> = (0..leaves)
            .filter(|i| i % 10 == m)
            .map(|i| format!("l{i}"))
            .collect();
        jobs.push(json!({"queue": "fan", "payload": m, "ref": format!("m{m}"), "depends_on": on}));
    }
    let joins: Vec<String> = (0..10).map(|m| format!("m{m}")).collect();
    jobs.push(json!({"queue": "fan", "payload": "sink", "ref": "sink", "depends_on": joins}));
    assert_eq!(jobs.len(), 1000);
    let answered = batch(&c.api, json!(jobs)).await;
    let blocked = answered.iter().filter(|j| j["state"] == "blocked").count();
    assert_eq!(blocked, 999);

    // Drain: each claim hands out only jobs whose dependencies are done.
    let mut done = 0;
    let mut rounds = Vec::new();
    while done < 1000 {
        let leases = claim_all(&c.api, "fan").await;
        assert!(!leases.is_empty(), "nothing claimable after {done} jobs");
        rounds.push(leases.len());
        for lease in &leases {
            assert_dependencies_done(lease);
            assert_eq!(c.api.complete(lease, json!("ok")).await.0, 200);
        }
        done += leases.len();
    }
    // The root, then the leaves, then the joins, then the sink.
    assert_eq!(rounds, [1, leaves, 10, 1]);

    // Each job became due the instant its last dependency ended (the same
    // transaction), and was claimed no earlier.
    let wrong = db
        .scalar(
            "SELECT count(*) FROM (
                 SELECT j.id, j.run_at, j.claimed_at, max(d.finished_at) AS last_end
                 FROM jobs j
                 JOIN job_dependencies e ON e.job_id = j.id
                 JOIN jobs d ON d.id = e.depends_on_id
                 GROUP BY j.id, j.run_at, j.claimed_at) x
             WHERE run_at <> last_end OR claimed_at < last_end",
            &[],
        )
        .await;
    assert_eq!(wrong, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
            .await,
        1000
    );
    assert_eq!(
        c.api.metric("runlease_jobs_unblocked_total{queue=\"fan\"}").await,
        999.0
    );
}

#[tokio::test]
async fn a_failed_dependency_cancels_everything_below_it_and_run_runs_anyway() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "f", "payload": 0, "ref": "a", "max_attempts": 1},
            {"queue": "f", "payload": 1, "ref": "b", "depends_on": ["a"]},
            {"queue": "f", "payload": 2, "ref": "c", "depends_on": ["b"]},
            {"queue": "f", "payload": 3, "ref": "d", "depends_on": ["c", "b"]},
            {"queue": "f", "payload": 4, "ref": "r", "depends_on": ["c"], "on_dependency_failure": "run"},
            {"queue": "f", "payload": 5, "ref": "x", "depends_on": ["r"]},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let lease = c.api.claim_one("f", "w").await;
    assert_eq!(lease.job_id.0, ids[0]);
    assert_eq!(c.api.fail(&lease, "boom", false, None).await.0, 200);

    let b = c.api.job(ids[1]).await;
    assert_eq!(b.state, JobState::Cancelled);
    assert_eq!(
        b.error.as_deref(),
        Some(format!("dependency {} failed", ids[0]).as_str())
    );
    let c_job = c.api.job(ids[2]).await;
    assert_eq!(c_job.state, JobState::Cancelled);
    assert_eq!(
        c_job.error.as_deref(),
        Some(format!("dependency {} was cancelled", ids[1]).as_str())
    );
    assert_eq!(c.api.job(ids[3]).await.state, JobState::Cancelled);
    // `run`: the cancelled dependency counts as met; its dependent waits on it.
    assert_eq!(c.api.job(ids[4]).await.state, JobState::Queued);
    assert_eq!(c.api.job(ids[5]).await.state, JobState::Blocked);
    let lease = c.api.claim_one("f", "w").await;
    assert_eq!(lease.job_id.0, ids[4]);
    assert_eq!(lease.dependencies[0].state, Some(JobState::Cancelled));
    assert_eq!(c.api.complete(&lease, json!(1)).await.0, 200);
    assert_eq!(c.api.job(ids[5]).await.state, JobState::Queued);

    // Tallies and metrics count the cascade as cancels.
    let (_, q) = c.api.get("/v1/queues/f").await;
    assert_eq!(q["counts"]["cancelled"], 3, "{q}");
    assert_eq!(
        c.api
            .metric("runlease_jobs_dependency_cancelled_total{queue=\"f\"}")
            .await,
        3.0
    );
}

#[tokio::test]
async fn a_dependency_deleted_midway_cancels_what_waits_on_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "del", "payload": 0, "ref": "a"},
            {"queue": "del", "payload": 1, "ref": "b", "depends_on": ["a"]},
            {"queue": "del", "payload": 2, "ref": "c", "depends_on": ["b"]},
            {"queue": "del", "payload": 3, "ref": "r", "depends_on": ["b"], "on_dependency_failure": "run"},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "del", "states": ["blocked"], "ids": [ids[1]]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], 1, "{body}");
    let waiting = c.api.job(ids[2]).await;
    assert_eq!(waiting.state, JobState::Cancelled);
    assert_eq!(
        waiting.error.as_deref(),
        Some(format!("dependency {} was deleted", ids[1]).as_str())
    );
    assert_eq!(
        waiting.dependencies[0].state, None,
        "a deleted dependency shows no state"
    );
    assert_eq!(c.api.job(ids[3]).await.state, JobState::Queued);
    // A job enqueued on the deleted id is cancelled at once.
    let late = batch(
        &c.api,
        json!([{"queue": "del", "payload": 9, "depends_on": [ids[1].to_string()]}]),
    )
    .await;
    assert_eq!(late[0]["state"], "cancelled");
    assert_eq!(late[0]["error"], format!("dependency {} was deleted", ids[1]));
}

#[tokio::test]
async fn a_dependent_enqueued_after_its_dependency_ended_starts_as_that_end_says() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let ok = c.api.enqueue("late", json!("ok")).await;
    let lease = c.api.claim_one("late", "w").await;
    assert_eq!(c.api.complete(&lease, json!({"made": 1})).await.0, 200);
    let bad = c.api.enqueue_attempts("late", json!("bad"), 1).await;
    let lease = c.api.claim_one("late", "w").await;
    assert_eq!(c.api.fail(&lease, "no", false, None).await.0, 200);

    let jobs = batch(
        &c.api,
        json!([
            {"queue": "late", "payload": 1, "depends_on": [ok.id.to_string()]},
            {"queue": "late", "payload": 2, "depends_on": [bad.id.to_string()]},
            {"queue": "late", "payload": 3, "depends_on": [bad.id.to_string()], "on_dependency_failure": "run"},
        ]),
    )
    .await;
    let states: Vec<&str> = jobs.iter().map(|j| j["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["queued", "cancelled", "queued"]);
    assert_eq!(jobs[1]["error"], format!("dependency {} failed", bad.id));
    let mut leases = claim_all(&c.api, "late").await;
    leases.sort_by_key(|l| l.job_id.0);
    assert_eq!(leases.len(), 2);
    assert_eq!(leases[0].dependencies[0].result, Some(json!({"made": 1})));
    assert_eq!(leases[1].dependencies[0].state, Some(JobState::Failed));
    // The single enqueue takes job ids too.
    let (status, one) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "late", "payload": 4, "depends_on": [ok.id.to_string()]}),
        )
        .await;
    assert_eq!((status, one["state"].as_str()), (201, Some("queued")), "{one}");
    let (_, q) = c.api.get("/v1/queues/late").await;
    assert_eq!(q["counts"]["cancelled"], 1, "{q}");
    // The job cancelled as it was enqueued is counted like any cancel by a
    // failed dependency.
    for sample in [
        "runlease_jobs_cancelled_total{queue=\"late\"}",
        "runlease_jobs_dependency_cancelled_total{queue=\"late\"}",
    ] {
        assert_eq!(c.api.metric(sample).await, 1.0, "{sample}");
    }
}

#[tokio::test]
async fn dependency_mistakes_are_refused_naming_the_job() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let too_many: Vec<String> = (0..101).map(|_| Uuid::now_v7().to_string()).collect();
    let cases = [
        (
            json!([{"queue": "v", "payload": 0, "depends_on": ["nope"]}]),
            "jobs[0]: depends_on names \"nope\"",
        ),
        (
            json!([{"queue": "v", "payload": 0, "depends_on": ["b"]}, {"queue": "v", "payload": 1, "ref": "b"}]),
            "the ref of a later job (jobs[1])",
        ),
        (
            json!([{"queue": "v", "payload": 0, "ref": "a"}, {"queue": "v", "payload": 1, "ref": "a"}]),
            "jobs[1]: ref \"a\" is already the ref of jobs[0]",
        ),
        (
            json!([{"queue": "v", "payload": 0, "depends_on": too_many}]),
            "jobs[0]: depends_on names 101 jobs; at most 100",
        ),
        (
            json!([{"queue": "v", "payload": 0, "on_dependency_failure": "run"}]),
            "only for a job with depends_on",
        ),
    ];
    for (jobs, expected) in cases {
        let (status, body) = c.api.post("/v1/jobs/batch", &json!({ "jobs": jobs })).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "invalid", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message:?} should say {expected:?}");
    }
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [{"queue": "v", "payload": 0, "on_dependency_failure": "later"}]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs", &[]).await,
        0,
        "nothing enqueued"
    );
}

#[tokio::test]
async fn a_bulk_cancel_of_blocked_jobs_cascades_and_listing_filters_them() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "bulk", "payload": 0, "ref": "a"},
            {"queue": "bulk", "payload": 1, "ref": "b", "depends_on": ["a"]},
            {"queue": "deeper", "payload": 2, "ref": "c", "depends_on": ["b"]},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let (status, listed) = c.api.get("/v1/jobs?queue=bulk&state=blocked").await;
    assert_eq!(status, 200, "{listed}");
    let listed: Vec<&str> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[1].to_string()]);
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "cancel", "queue": "bulk", "states": ["blocked"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"matched": 1, "changed": 1}));
    assert_eq!(c.api.job(ids[1]).await.state, JobState::Cancelled);
    let below = c.api.job(ids[2]).await;
    assert_eq!(below.state, JobState::Cancelled);
    assert_eq!(
        below.error.as_deref(),
        Some(format!("dependency {} was cancelled", ids[1]).as_str())
    );
    // The root runs on; a cancel of a single blocked job answers it cancelled.
    assert_eq!(c.api.job(ids[0]).await.state, JobState::Queued);
    let more = batch(
        &c.api,
        json!([{"queue": "bulk", "payload": 3, "depends_on": [ids[0].to_string()]}]),
    )
    .await;
    let (status, cancelled) = c
        .api
        .post(
            &format!("/v1/jobs/{}/cancel", more[0]["id"].as_str().unwrap()),
            &json!({}),
        )
        .await;
    assert_eq!(
        (status, cancelled["state"].as_str()),
        (200, Some("cancelled")),
        "{cancelled}"
    );
}

#[tokio::test]
async fn the_cli_shows_a_jobs_dependencies_and_dependents_and_lists_blocked_jobs() {
    use runlease_tests::cli::{ok, runlease};
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let ids = ids_of(
        &batch(
            &c.api,
            json!([
                {"queue": "cli", "payload": 0, "ref": "a"},
                {"queue": "cli", "payload": 1, "ref": "b", "depends_on": ["a"]},
                {"queue": "cli", "payload": 2, "ref": "c", "depends_on": ["b"], "on_dependency_failure": "run"},
            ]),
        )
        .await,
    );
    let url = c.api.base().to_owned();
    let shown = ok(&runlease(&url, &["get", &ids[1].to_string()], None).await);
    let lines: Vec<&str> = shown.lines().collect();
    let at = |title: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(title))
            .unwrap_or_else(|| panic!("no {title} in\n{shown}"))
    };
    assert!(
        lines[at("dependencies") + 1].starts_with(&format!("{} ", ids[0])),
        "{shown}"
    );
    assert!(lines[at("dependencies") + 1].ends_with("queued"), "{shown}");
    assert!(
        lines[at("dependents") + 1].starts_with(&format!("{} ", ids[2])),
        "{shown}"
    );
    assert!(lines[at("dependents") + 1].ends_with("blocked"), "{shown}");
    assert!(lines[at("on_dep_failure")].ends_with("cancel"), "{shown}");
    let listed = ok(&runlease(
        &url,
        &["jobs", "list", "--queue", "cli", "--state", "blocked"],
        None,
    )
    .await);
    let rows: Vec<&str> = listed.lines().filter(|l| l.contains(" blocked ")).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    for id in &ids[1..] {
        assert!(listed.contains(&id.to_string()), "{listed}");
    }
    // `enqueue` names existing jobs to wait on, and the policy.
    let enqueued = ok(&runlease(
        &url,
        &[
            "--json",
            "enqueue",
            "cli",
            "3",
            "--depends-on",
            &ids[0].to_string(),
            "--depends-on",
            &ids[2].to_string(),
            "--on-dependency-failure",
            "run",
        ],
        None,
    )
    .await);
    let job: serde_json::Value = serde_json::from_str(&enqueued).unwrap();
    assert_eq!(job["state"], "blocked", "{job}");
    assert_eq!(job["on_dependency_failure"], "run", "{job}");
    let id = job["id"].as_str().unwrap();
    let shown = ok(&runlease(&url, &["--json", "get", id], None).await);
    let job: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let waits: Vec<&str> = job["dependencies"]
        .as_array()
        .unwrap_or_else(|| panic!("{job}"))
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(waits, [ids[0].to_string(), ids[2].to_string()], "{job}");
    let refused = runlease(&url, &["enqueue", "cli", "4", "--depends-on", "not-an-id"], None).await;
    assert!(!refused.status.success());
}

#[tokio::test]
async fn a_failed_dependency_retried_and_done_is_not_counted_twice() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // r waits on a and b under `run`: a failing counts as met once.
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "t", "payload": 0, "ref": "a", "max_attempts": 1},
            {"queue": "t2", "payload": 1, "ref": "b"},
            {"queue": "t", "payload": 2, "depends_on": ["a", "b"], "on_dependency_failure": "run"},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let lease = c.api.claim_one("t", "w").await;
    assert_eq!(lease.job_id.0, ids[0]);
    assert_eq!(c.api.fail(&lease, "boom", false, None).await.0, 200);
    assert_eq!(c.api.job(ids[2]).await.state, JobState::Blocked);

    // An admin retries a, and it is done this time: r still waits on b.
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/retry", ids[0]), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let lease = c.api.claim_one("t", "w").await;
    assert_eq!(lease.job_id.0, ids[0]);
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    assert_eq!(
        c.api.job(ids[2]).await.state,
        JobState::Blocked,
        "a dependency that ended twice counts once"
    );

    // b done: r queued.
    let lease = c.api.claim_one("t2", "w").await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    assert_eq!(c.api.job(ids[2]).await.state, JobState::Queued);
}

#[tokio::test]
async fn a_dependency_on_a_job_skipped_for_its_idempotency_key_is_refused_and_nothing_written() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let first = batch(
        &c.api,
        json!([{"queue": "k", "payload": 0, "idempotency_key": "once"}]),
    )
    .await;
    // The same key again with a job depending on it: the keyed job would be
    // skipped and the dependent would wait on a job that was never written.
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [
                {"queue": "k", "payload": 1, "ref": "a", "idempotency_key": "once"},
                {"queue": "k", "payload": 2, "depends_on": ["a"]},
            ]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("jobs[1] depends on jobs[0]"),
        "{body}"
    );
    let jobs: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1, "nothing of the refused batch is written");
    // Naming the original by id works.
    let ids = ids_of(&first);
    let jobs = batch(
        &c.api,
        json!([{"queue": "k", "payload": 2, "depends_on": [ids[0]]}]),
    )
    .await;
    assert_eq!(jobs[0]["state"], "blocked");
}
