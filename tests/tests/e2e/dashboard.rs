//! The web dashboard (`GET /ui`) in a real browser: headless Chromium
//! (`/usr/bin/chromium`, or `CHROMIUM`) driven by `tests/browser/dashboard.mjs`
//! through playwright-core, against a coordinator process on its own
//! database. Each test prepares jobs through the API, lets the page show
//! and act on them, then checks the API: the queues page shows the counts
//! the API answers; a failed job shows its attempts; a retry from the page
//! leaves the job queued; a bulk retry of a filtered set of 200 is
//! confirmed with that count and retries exactly those; a queue paused from
//! the page hands out no claim, one resumed from it hands out work again; a
//! producer key sees everything and can retry nothing; without keys the
//! page just works; queues served by endpoints show each endpoint's
//! health, requests in flight and last error. The script fails on any console error of the page or
//! any request to anything but the coordinator.
//!
//! Screenshots go to a temporary directory, or to `RUNLEASE_SCREENSHOTS`
//! (relative to the repository, e.g. `docs/images`) when it is set.
//! Node.js 20+, npm and Chromium must be installed (scripts/test installs
//! Chromium and the npm packages): without them these tests fail, never skip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use runlease_tests::{Api, CoordinatorProcess, TestDb};
use serde_json::{Value, json};

use crate::cli_endpoints::HeldEndpoint;

const ADMIN_KEY: &str = "dashboard-admin-key-0123";
const PRODUCER_KEY: &str = "dashboard-producer-key-0123";
const WRONG_KEY: &str = "not-a-key-of-this-coordinator";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn browser_dir() -> PathBuf {
    repo().join("tests/browser")
}

/// `npm ci` in tests/browser unless its `node_modules` was installed from
/// this very `package-lock.json` (the copy there is the stamp scripts/test
/// writes too); once per test process, one process at a time.
fn install() -> PathBuf {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    DONE.get_or_init(|| {
        let dir = browser_dir();
        let exe = std::env::current_exe().unwrap();
        let lock = std::fs::File::create(exe.parent().unwrap().join("dashboard-browser.install.lock")).unwrap();
        lock.lock().unwrap();
        let lockfile = std::fs::read(dir.join("package-lock.json")).expect("tests/browser/package-lock.json is committed");
        let stamp = dir.join("node_modules/.runlease-package-lock.json");
        if std::fs::read(&stamp).ok().as_deref() != Some(lockfile.as_slice()) {
            let out = std::process::Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&dir)
                .stdin(Stdio::null())
                .output()
                .expect("npm must be on PATH (Node.js 20 or later) for the dashboard's browser tests");
            assert!(
                out.status.success(),
                "npm ci in tests/browser failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(&stamp, &lockfile).unwrap();
        }
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            Path::new(&chromium).exists(),
            "{chromium} is missing: install Debian's chromium (scripts/test does: apt-get install -y chromium)"
        );
        dir.join("dashboard.mjs")
    })
    .clone()
}

/// Where this test's screenshots go.
pub(crate) fn screenshots(db: &TestDb) -> PathBuf {
    match std::env::var("RUNLEASE_SCREENSHOTS") {
        Ok(dir) if !dir.is_empty() => repo().join(dir),
        _ => std::env::temp_dir().join(format!("runlease-dashboard-{}", db.name)),
    }
}

/// Runs the browser script with `plan`; answers what it measured.
pub(crate) async fn drive(plan: Value) -> Value {
    let script = install();
    let started = Instant::now();
    let child = tokio::process::Command::new("node")
        .arg(&script)
        .arg(plan.to_string())
        .current_dir(browser_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node must be on PATH (Node.js 20 or later)");
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("the browser script finishes within 180 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser script failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no report from the browser script:\n{stdout}\n{stderr}"));
    assert_eq!(report["ok"], true, "{report}");
    eprintln!("browser scenario took {:?}: {report}", started.elapsed());
    report
}

pub(crate) async fn coordinator(db: &TestDb, keys: bool) -> CoordinatorProcess {
    let mut env = vec![
        // Leases held by the test's "workers" must not expire meanwhile.
        ("RUNLEASE_LEASE_TTL_MS", "600000".to_owned()),
        ("RUNLEASE_HEARTBEAT_INTERVAL_MS", "200000".to_owned()),
    ];
    if keys {
        env.push((
            "RUNLEASE_API_KEYS",
            format!("admin:{ADMIN_KEY},producer:{PRODUCER_KEY}"),
        ));
    }
    CoordinatorProcess::start(db, &env).await
}

/// What the tests prepare, and what the page must then show.
struct Prepared {
    failed_job: Value,
    queues: Value,
}

async fn post_ok(api: &Api, path: &str, body: &Value) -> Value {
    let (status, answer) = api.post(path, body).await;
    assert!(
        (200..300).contains(&status),
        "POST {path} answered {status}: {answer}"
    );
    answer
}

/// Jobs in every state over four queues, a job failed after three
/// attempts, 200 failed jobs on `reports`, limits and a schedule.
async fn prepare(api: &Api) -> Prepared {
    // emails: 3 queued (the queue the page pauses).
    for i in 0..3 {
        api.enqueue("emails", json!({"to": format!("user{i}@example.com")}))
            .await;
    }

    // billing: one job released by worker-a, failed by worker-b (retried),
    // failed for good by worker-c.
    let job = api
        .enqueue_attempts("billing", json!({"invoice": "INV-2041", "amount_cents": 1299}), 2)
        .await;
    let lease = api.claim_one("billing", "worker-a").await;
    assert_eq!(api.release(&lease, Some(json!({"step": 1}))).await.0, 200);
    let lease = api.claim_one("billing", "worker-b").await;
    assert_eq!(
        api.fail(&lease, "card processor timeout", true, Some(0)).await.0,
        200
    );
    let lease = api.claim_one("billing", "worker-c").await;
    let (status, failed) = api
        .fail(&lease, "card declined: insufficient funds", true, Some(0))
        .await;
    assert_eq!(status, 200);
    assert_eq!(failed["state"], "failed", "{failed}");

    // reports: 200 failed, 25 done, 5 queued.
    let batch: Vec<Value> = (0..225)
        .map(|i| json!({"queue": "reports", "payload": {"report": i}, "max_attempts": 1}))
        .collect();
    post_ok(api, "/v1/jobs/batch", &json!({"jobs": batch})).await;
    let leases = api.claim("reports", "report-worker", 225).await;
    assert_eq!(leases.len(), 225);
    let items: Vec<Value> = leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i < 200 {
                json!({"lease_token": l.lease_token, "action": "fail", "error": format!("renderer crashed on page {i}"), "retryable": false})
            } else {
                json!({"lease_token": l.lease_token, "action": "complete", "result": {"pages": i}})
            }
        })
        .collect();
    let answer = post_ok(api, "/v1/finish", &json!({"items": items})).await;
    assert!(
        answer["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"] == "ok"),
        "{answer}"
    );
    for i in 0..5 {
        api.enqueue("reports", json!({"report": 1000 + i})).await;
    }

    // thumbnails: 2 running, 4 queued, limits.
    for i in 0..6 {
        api.enqueue("thumbnails", json!({"image": i})).await;
    }
    assert_eq!(api.claim("thumbnails", "thumb-worker", 2).await.len(), 2);
    let (status, body) = api
        .patch(
            "/v1/queues/thumbnails",
            &json!({"max_running": 8, "max_running_per_key": 2, "rate_limit": {"per_s": 50, "burst": 10}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let (status, body) = api
        .put(
            "/v1/schedules/nightly-reports",
            &json!({"queue": "reports", "cron": "0 3 * * *", "payload": {"kind": "nightly"}}),
        )
        .await;
    assert!(status == 201 || status == 200, "{body}");

    // What the page must show: the API's own figures, checked here against
    // what was prepared.
    let (status, figures) = api.get("/v1/queues").await;
    assert_eq!(status, 200, "{figures}");
    let mut queues = serde_json::Map::new();
    for q in figures["queues"].as_array().unwrap() {
        queues.insert(q["queue"].as_str().unwrap().to_owned(), q["counts"].clone());
    }
    let expect = |q: &str, state: &str, n: i64| {
        assert_eq!(queues[q][state], n, "{q} {state}: {figures}");
    };
    expect("emails", "queued", 3);
    expect("billing", "failed", 1);
    expect("reports", "failed", 200);
    expect("reports", "done", 25);
    expect("reports", "queued", 5);
    expect("thumbnails", "running", 2);
    expect("thumbnails", "queued", 4);
    let reports = figures["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "reports")
        .unwrap();
    assert_eq!(reports["throughput"]["done"], 25, "{reports}");
    assert_eq!(reports["throughput"]["failed"], 200, "{reports}");

    let job = api.job(job.id).await;
    let attempts: Vec<Value> = job
        .attempts
        .iter()
        .map(|a| {
            json!({
                "worker_id": a.worker_id.to_string(),
                "outcome": a.outcome.map(|o| o.as_str()),
                "error": a.error,
            })
        })
        .collect();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    Prepared {
        failed_job: json!({
            "id": job.id.to_string(),
            "attempts": attempts,
            "error": "card declined: insufficient funds",
            "payload_text": "INV-2041",
        }),
        queues: Value::Object(queues),
    }
}

async fn counts(api: &Api, queue: &str) -> Value {
    let (status, body) = api.get(&format!("/v1/queues/{queue}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn dashboard_shows_and_acts_on_queues_jobs_and_schedules_in_a_browser() {
    let db = TestDb::new().await;
    let c = coordinator(&db, true).await;
    let api = c.api.with_key(ADMIN_KEY);
    let prepared = prepare(&api).await;
    let job_id = prepared.failed_job["id"].as_str().unwrap().to_owned();

    let report = drive(json!({
        "scenario": "admin",
        "base": api.base(),
        "admin_key": ADMIN_KEY,
        "wrong_key": WRONG_KEY,
        "screenshots": screenshots(&db),
        "queues": prepared.queues,
        "failed_job": prepared.failed_job,
        "bulk": {"queue": "reports", "count": 200},
        "pause_queue": "emails",
        "resume_queue": "thumbnails",
        "schedule": "nightly-reports",
    }))
    .await;
    assert!(
        report["wrong_key_message"]
            .as_str()
            .unwrap()
            .contains("unknown API key"),
        "{report}"
    );
    assert_page_loads_fast(&report);

    // The retry from the page: the API reports the job queued, its budget fresh.
    let job = api.job(&job_id).await;
    assert_eq!(job.state.as_str(), "queued");
    assert_eq!(job.attempt, 0);

    // The bulk retry from the page: the 200 failed jobs, and only they.
    let reports = counts(&api, "reports").await;
    assert_eq!(reports["counts"]["failed"], 0, "{reports}");
    assert_eq!(reports["counts"]["queued"], 205, "{reports}");
    assert_eq!(reports["counts"]["done"], 25, "{reports}");

    // The pause from the page: the queue holds its jobs and a claim gets nothing.
    let emails = counts(&api, "emails").await;
    assert_eq!(emails["settings"]["paused"], true, "{emails}");
    assert_eq!(emails["counts"]["queued"], 3, "{emails}");
    assert!(api.claim("emails", "after-pause", 10).await.is_empty());
    // The queue paused and resumed from its own page is running again,
    // its limits untouched.
    let thumbnails = counts(&api, "thumbnails").await;
    assert_eq!(thumbnails["settings"]["paused"], false, "{thumbnails}");
    assert_eq!(thumbnails["settings"]["max_running"], 8, "{thumbnails}");
    assert_eq!(api.claim("thumbnails", "after-resume", 1).await.len(), 1);
}

#[tokio::test]
async fn dashboard_with_a_producer_key_shows_everything_and_cannot_retry() {
    let db = TestDb::new().await;
    let c = coordinator(&db, true).await;
    let admin = c.api.with_key(ADMIN_KEY);
    let prepared = prepare(&admin).await;
    let job_id = prepared.failed_job["id"].as_str().unwrap().to_owned();

    drive(json!({
        "scenario": "producer",
        "base": admin.base(),
        "producer_key": PRODUCER_KEY,
        "screenshots": screenshots(&db),
        "queues": prepared.queues,
        "failed_job": prepared.failed_job,
        "bulk": {"queue": "reports", "count": 200},
    }))
    .await;

    // The buttons were disabled, and the API refuses the key anyway.
    let producer = c.api.with_key(PRODUCER_KEY);
    let (status, body) = producer
        .post(&format!("/v1/jobs/{job_id}/retry"), &json!({}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let (status, body) = producer
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "retry", "queue": "reports", "states": ["failed"]}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = producer
        .patch("/v1/queues/emails", &json!({"paused": true}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(admin.job(&job_id).await.state.as_str(), "failed");
    assert_eq!(counts(&admin, "reports").await["counts"]["failed"], 200);
    assert_eq!(counts(&admin, "emails").await["settings"]["paused"], false);
}

#[tokio::test]
async fn dashboard_without_keys_on_loopback_needs_no_key() {
    let db = TestDb::new().await;
    let c = coordinator(&db, false).await;
    let prepared = prepare(&c.api).await;
    let report = drive(json!({
        "scenario": "open",
        "base": c.api.base(),
        "screenshots": screenshots(&db),
        "queues": prepared.queues,
    }))
    .await;
    assert_page_loads_fast(&report);
}

/// The page stays small (its files, all of them from the coordinator, in a
/// handful of requests) and loads fast. On an idle machine its own load
/// (HTML, style sheet, modules, parsed and run) takes a few hundred ms
/// from a debug coordinator; the bound here is loose because tests share
/// the machine's cores with builds and other browsers, and a fixed timing
/// budget would fail for the machine's load, not the page's.
fn assert_page_loads_fast(report: &Value) {
    let nav = &report["navigation"];
    let files = nav["files"].as_u64().unwrap();
    let bytes = nav["transferred_bytes"].as_u64().unwrap();
    assert!(files <= 10, "the page loads {files} files: {report}");
    assert!(bytes < 100_000, "the page weighs {bytes} bytes: {report}");
    let loaded = nav["dom_content_loaded_ms"].as_u64().unwrap();
    assert!(loaded < 5000, "the page took {loaded} ms to load: {report}");
}

#[tokio::test]
async fn dashboard_files_are_served_with_a_strict_policy_and_revalidated() {
    let db = TestDb::new().await;
    let c = coordinator(&db, true).await;
    let http = reqwest::Client::new();
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        // No key needed for the files themselves.
        let r = http.get(format!("{}{path}", c.api.base())).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            header("content-type").starts_with(kind),
            "{path}: {}",
            header("content-type")
        );
        let csp = header("content-security-policy");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(header("cache-control"), "no-cache");
        let etag = header("etag");
        assert!(!etag.is_empty(), "{path} has an ETag");
        let again = http
            .get(format!("{}{path}", c.api.base()))
            .header("If-None-Match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status().as_u16(), 304, "{path} revalidates");
    }
    let (status, body) = c.api.get("/ui/nope.js").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_found");

    // What the page asks first: without a key, whether one is needed; with
    // a wrong one, 401; with a good one, its role.
    let (status, body) = c.api.get("/v1/whoami").await;
    assert_eq!(
        (status, body.clone()),
        (
            200,
            json!({"role": null, "queues": null, "keys_configured": true})
        ),
        "{body}"
    );
    let (status, body) = c.api.with_key(WRONG_KEY).get("/v1/whoami").await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, body) = c.api.with_key(PRODUCER_KEY).get("/v1/whoami").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["role"], "producer");
}

/// GET /v1/queues/{queue} until `pred` holds of it (20 s at most).
async fn queue_until(api: &Api, queue: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let q = counts(api, queue).await;
        if pred(&q) {
            return q;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: not so after 20 s: {q}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn dashboard_shows_each_queues_endpoint_its_health_in_flight_and_last_error() {
    let db = TestDb::new().await;
    let held = HeldEndpoint::start().await;
    // A port nobody listens on: every push is refused.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let c = CoordinatorProcess::start(
        &db,
        &[
            ("RUNLEASE_ENDPOINT_ALLOW_HOSTS", "127.0.0.1".to_owned()),
            ("RUNLEASE_ENDPOINT_BACKOFF_MS", "10".to_owned()),
            ("RUNLEASE_ENDPOINT_BACKOFF_MAX_MS", "50".to_owned()),
        ],
    )
    .await;
    let api = &c.api;
    let set = |queue: &'static str, url: String, concurrency: i64| async move {
        let (status, body) = api
            .patch(
                &format!("/v1/queues/{queue}"),
                &json!({"endpoint": {"url": url, "concurrency": concurrency}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    };
    set("hooks", held.url(), 4).await;
    set("down", format!("http://127.0.0.1:{closed}/"), 2).await;
    api.enqueue("hooks", json!({"n": 1})).await;
    api.enqueue("down", json!({"n": 1})).await;
    api.enqueue("pulled", json!({"n": 1})).await;

    queue_until(api, "hooks", "the push held open", |q| {
        q["endpoint"]["in_flight"] == 1
    })
    .await;
    let down = queue_until(api, "down", "the refused endpoint unhealthy", |q| {
        q["endpoint"]["healthy"] == false && q["endpoint"]["last_error"].is_string()
    })
    .await;
    let down_error: String = down["endpoint"]["last_error"]
        .as_str()
        .unwrap()
        .chars()
        .take(24)
        .collect();
    assert_eq!(
        down["counts"]["failed"], 0,
        "a refused connection charges nothing: {down}"
    );

    let report = drive(json!({
        "scenario": "endpoint",
        "base": api.base(),
        "screenshots": screenshots(&db),
        "endpoints": {
            "hooks": {"url": held.url(), "healthy": true, "in_flight": 1, "concurrency": 4, "last_error": null},
            "down": {"url": format!("http://127.0.0.1:{closed}/"), "healthy": false, "in_flight": 0, "concurrency": 2, "last_error": down_error},
        },
        "pull_queue": "pulled",
    }))
    .await;
    assert_eq!(report["endpoints_checked"], 2, "{report}");
}
