//! What scripts and shells rely on from `runlease`: with `--json`, answers as
//! JSON on stdout and errors as the protocol's error body on stderr (with a
//! code of its own for errors found before or without an answer); completion
//! scripts a shell accepts; every duration a number of ms in a `--*-ms` flag.

use std::collections::BTreeSet;
use std::process::Output;
use std::time::{Duration, Instant};

use runlease_tests::cli::{json_out, refused, runlease, stderr, stdout};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

const PRODUCER: &str = "cli-producer-key-0123456789";
const WORKER: &str = "cli-worker-key-0123456789";
const ADMIN: &str = "cli-admin-key-0123456789";

/// The error body a failed `--json` run printed: exactly one line on stderr,
/// `{"error": {"code", "message"}}` and nothing else, with exit status `exit`.
fn json_error(out: &Output, exit: i32) -> Value {
    assert_eq!(
        out.status.code(),
        Some(exit),
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    assert_eq!(err.trim().lines().count(), 1, "one line on stderr: {err}");
    let body: Value =
        serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {err}"));
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["error"], "{body}");
    let mut fields: Vec<&String> = body["error"].as_object().unwrap().keys().collect();
    fields.sort();
    assert_eq!(fields, ["code", "message"], "{body}");
    assert!(
        body["error"]["code"].is_string() && body["error"]["message"].is_string(),
        "{body}"
    );
    body
}

/// The code of a failed `--json` run that printed nothing on stdout.
fn code_of(out: &Output) -> (String, String) {
    let body = json_error(out, 1);
    assert_eq!(stdout(out), "", "nothing on stdout");
    (
        body["error"]["code"].as_str().unwrap().to_owned(),
        body["error"]["message"].as_str().unwrap().to_owned(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn cli_json_errors_are_the_protocols_error_body_on_stderr() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some(format!("producer:{PRODUCER},worker:{WORKER},admin:{ADMIN}"));
    })
    .await;
    let url = c.api.base().to_owned();
    let producer = c.api.with_key(PRODUCER);

    // Errors the coordinator answered: the very body it sent, on stderr.
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, api_body) = producer.get(&format!("/v1/jobs/{unknown}")).await;
    assert_eq!(status, 404);
    let out = runlease(&url, &["--json", "--key", PRODUCER, "get", &unknown], None).await;
    assert_eq!(json_error(&out, 1), api_body);
    assert_eq!(stdout(&out), "");

    let (status, api_body) = producer
        .post(
            "/v1/jobs",
            &json!({"queue": "mail", "payload": 1, "max_attempts": 0}),
        )
        .await;
    assert_eq!(
        (status, api_body["error"]["code"].as_str()),
        (422, Some("invalid"))
    );
    let out = runlease(
        &url,
        &[
            "--json",
            "--key",
            PRODUCER,
            "enqueue",
            "mail",
            "1",
            "--max-attempts",
            "0",
        ],
        None,
    )
    .await;
    assert_eq!(json_error(&out, 1), api_body);

    let (status, api_body) = c.api.get(&format!("/v1/jobs/{unknown}")).await;
    assert_eq!(status, 401);
    assert_eq!(
        json_error(&runlease(&url, &["--json", "get", &unknown], None).await, 1),
        api_body
    );

    let (status, api_body) = c
        .api
        .with_key(WORKER)
        .post("/v1/jobs", &json!({"queue": "mail", "payload": 1}))
        .await;
    assert_eq!(status, 403);
    let out = runlease(&url, &["--key", WORKER, "enqueue", "mail", "1", "--json"], None).await;
    assert_eq!(
        json_error(&out, 1),
        api_body,
        "--json is global: after the verb too"
    );
    // Without --json: one line that names the kind of error.
    let line = refused(&runlease(&url, &["--key", WORKER, "enqueue", "mail", "1"], None).await);
    assert!(line.starts_with("runlease: forbidden: "), "{line}");

    let job = json_out(&runlease(&url, &["--json", "--key", PRODUCER, "enqueue", "mail", "1"], None).await);
    let id = job["id"].as_str().unwrap().to_owned();
    let out = runlease(&url, &["--json", "--key", PRODUCER, "cancel", &id], None).await;
    assert_eq!(json_out(&out)["state"], "cancelled");
    assert_eq!(stderr(&out), "", "a success prints nothing on stderr");
    assert_eq!(
        code_of(&runlease(&url, &["--json", "--key", PRODUCER, "cancel", &id], None).await).0,
        "conflict"
    );

    // Errors found on this side: codes the coordinator never sends.
    let (code, message) = code_of(&runlease(&url, &["--json", "get", "nope"], None).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("invalid_argument", r#""nope" is not a job id (a UUID)"#)
    );
    let (code, message) = code_of(
        &runlease(
            &url,
            &["--json", "--key", PRODUCER, "enqueue", "mail", "{bad"],
            None,
        )
        .await,
    );
    assert_eq!(code, "invalid_argument");
    assert!(message.starts_with("payload is not valid JSON"), "{message}");
    let (code, message) = code_of(&runlease(&url, &["--json", "frobnicate"], None).await);
    assert_eq!(code, "usage");
    assert!(message.contains("frobnicate"), "{message}");
    assert_eq!(
        code_of(&runlease(&url, &["get", "--json"], None).await).0,
        "usage",
        "a missing argument"
    );
    assert_eq!(
        code_of(&runlease(&url, &["--json"], None).await).0,
        "usage",
        "no verb"
    );
    assert_eq!(
        code_of(&runlease(&url, &["--json", "wait", &id, "--wait-ms", "soon"], None).await).0,
        "usage",
        "a value the flag does not take"
    );
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let (code, message) = code_of(&runlease(&nobody, &["--json", "queues"], None).await);
    assert_eq!(code, "unreachable");
    assert!(message.contains("cannot reach the coordinator"), "{message}");

    // A bulk action without --yes: what it counted on stdout, the refusal
    // on stderr.
    let out = runlease(
        &url,
        &[
            "--json",
            "--key",
            ADMIN,
            "jobs",
            "retry",
            "--queue",
            "mail",
            "--state",
            "cancelled",
        ],
        None,
    )
    .await;
    let body = json_error(&out, 1);
    assert_eq!(body["error"]["code"], "not_confirmed");
    let counted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counted, json!({"matched": 1, "exact": true, "changed": 0}));

    // A wait that runs out: the job as last seen on stdout, exit 124.
    let queued =
        json_out(&runlease(&url, &["--json", "--key", PRODUCER, "enqueue", "mail", "2"], None).await);
    let queued_id = queued["id"].as_str().unwrap();
    let out = runlease(
        &url,
        &["--json", "--key", PRODUCER, "wait", queued_id, "--wait-ms", "300"],
        None,
    )
    .await;
    let body = json_error(&out, 124);
    assert_eq!(body["error"]["code"], "timed_out");
    let last_seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (last_seen["id"].as_str(), last_seen["state"].as_str()),
        (Some(queued_id), Some("queued"))
    );
}

/// What bash completes for `words` (the cursor on the last one), with the
/// script `script` loaded.
fn bash_completes(script: &std::path::Path, words: &[&str]) -> BTreeSet<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        r#"source '{script}'
spec=$(complete -p runlease) || exit 3
f=$(printf '%s\n' "$spec" | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
[ -n "$f" ] || exit 4
COMP_WORDS=({words})
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
"$f" runlease "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#,
        script = script.display(),
        words = quoted.join(" ")
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("bash must be installed");
    assert!(
        out.status.success(),
        "bash completion of {words:?} failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn cli_completions_for_bash_are_valid_bash_that_completes_verbs_and_flags() {
    // No coordinator: completions never talk to one.
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = runlease(&url, &["completions", "bash"], None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let script = std::env::temp_dir().join(format!("runlease-completion-{}.bash", uuid::Uuid::new_v4()));
    std::fs::write(&script, &out.stdout).unwrap();

    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash must be installed");
    assert!(
        check.status.success(),
        "bash -n refuses the script: {}",
        String::from_utf8_lossy(&check.stderr)
    );

    let verbs = bash_completes(&script, &["runlease", ""]);
    for verb in [
        "enqueue",
        "get",
        "wait",
        "cancel",
        "retry",
        "queues",
        "jobs",
        "schedules",
        "completions",
    ] {
        assert!(verbs.contains(verb), "{verb} missing from {verbs:?}");
    }
    assert!(bash_completes(&script, &["runlease", "que"]).contains("queues"));
    let queue_verbs = bash_completes(&script, &["runlease", "queues", ""]);
    for verb in ["list", "show", "pause", "resume", "limit", "retention"] {
        assert!(queue_verbs.contains(verb), "{verb} missing from {queue_verbs:?}");
    }
    let wait_flags = bash_completes(&script, &["runlease", "wait", "--"]);
    assert!(wait_flags.contains("--wait-ms"), "{wait_flags:?}");
    assert!(wait_flags.contains("--json"), "global flags too: {wait_flags:?}");
    let shells = bash_completes(&script, &["runlease", "completions", ""]);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.contains(shell), "{shell} missing from {shells:?}");
    }
    std::fs::remove_file(&script).unwrap();

    // The other shells' scripts name the same verbs and flags.
    for (shell, marker) in [("zsh", "#compdef runlease"), ("fish", "complete -c runlease")] {
        let out = runlease(&url, &["completions", shell], None).await;
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains(marker), "{shell}: {text}");
        assert!(text.contains("wait-ms") && text.contains("retention"), "{shell}");
    }
    let line = refused(&runlease(&url, &["completions", "tcsh"], None).await);
    assert!(line.contains("tcsh"), "{line}");
}

/// The verbs a `--help` lists under "Commands:" (without `help`).
fn verbs_in(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| *v != "help")
        .map(str::to_owned)
        .collect()
}

/// Every flag a `--help` shows.
fn flags_in(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '=' || c == '<')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn cli_durations_are_milliseconds_in_every_verb() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();

    // Every verb and sub-verb, found from the help itself: its duration
    // flags end in -ms, none counts seconds or minutes.
    let mut pending: Vec<Vec<String>> = vec![vec![]];
    let mut flags_of: Vec<(String, BTreeSet<String>)> = Vec::new();
    while let Some(path) = pending.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = stdout(&runlease(&url, &args, None).await);
        assert!(help.contains("Usage:"), "{path:?}: {help}");
        for verb in verbs_in(&help) {
            let mut next = path.clone();
            next.push(verb);
            pending.push(next);
        }
        flags_of.push((path.join(" "), flags_in(&help)));
    }
    let verbs: BTreeSet<&str> = flags_of.iter().map(|(v, _)| v.as_str()).collect();
    for verb in [
        "enqueue",
        "wait",
        "jobs list",
        "jobs retry",
        "jobs cancel",
        "jobs delete",
        "queues list",
        "queues show",
        "queues pause",
        "queues resume",
        "queues limit",
        "queues retention",
        "schedules list",
        "schedules set",
        "schedules show",
        "schedules delete",
        "completions",
    ] {
        assert!(verbs.contains(verb), "no verb {verb:?} in {verbs:?}");
    }
    for (verb, flags) in &flags_of {
        for flag in flags {
            for unit in [
                "-secs",
                "-sec",
                "-seconds",
                "-s",
                "-minutes",
                "-mins",
                "-duration",
            ] {
                assert!(
                    !flag.ends_with(unit),
                    "`runlease {verb}` has {flag}: durations are --*-ms"
                );
            }
        }
    }
    let flags = |verb: &str| {
        flags_of
            .iter()
            .find(|(v, _)| v == verb)
            .map(|(_, f)| f.clone())
            .unwrap()
    };
    assert!(flags("enqueue").is_superset(&["--delay-ms".to_owned(), "--timeout-ms".to_owned()].into()));
    assert!(flags("wait").contains("--wait-ms"));
    assert!(flags("schedules set").contains("--timeout-ms"));
    assert!(
        flags("queues retention").is_superset(&["--done-ms".to_owned(), "--failed-ms".to_owned()].into())
    );

    // enqueue: --delay-ms and --timeout-ms are the protocol's delay_ms and timeout_ms.
    let job = json_out(
        &runlease(
            &url,
            &[
                "--json",
                "enqueue",
                "mail",
                "1",
                "--delay-ms",
                "60000",
                "--timeout-ms",
                "5000",
            ],
            None,
        )
        .await,
    );
    assert_eq!(job["timeout_ms"], 5000);
    let at = |field: &str| chrono::DateTime::parse_from_rfc3339(job[field].as_str().unwrap()).unwrap();
    let delay = (at("run_at") - at("created_at")).num_milliseconds();
    assert!(
        (59_000..=61_000).contains(&delay),
        "run_at is {delay} ms after created_at"
    );
    let id = job["id"].as_str().unwrap().to_owned();

    // wait: --wait-ms bounds the wait; the former --timeout-secs (seconds)
    // still works, hidden.
    let started = Instant::now();
    let out = runlease(&url, &["wait", &id, "--wait-ms", "300"], None).await;
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(stderr(&out).contains("after 300 ms"), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(20));
    let out = runlease(&url, &["wait", &id, "--timeout-secs", "1"], None).await;
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(stderr(&out).contains("after 1000 ms"), "{}", stderr(&out));
    assert!(!flags("wait").contains("--timeout-secs"), "hidden from --help");

    // queues retention: ms, 0 for forever, `default` for the coordinator's.
    let out = runlease(
        &url,
        &[
            "queues",
            "retention",
            "mail",
            "--done-ms",
            "86400000",
            "--failed-ms",
            "0",
        ],
        None,
    )
    .await;
    assert_eq!(
        runlease_tests::cli::ok(&out).trim(),
        "queue mail: retention_done 86400000 ms, retention_failed 0 (forever)"
    );
    let (_, queue) = c.api.get("/v1/queues/mail").await;
    assert_eq!(
        (
            &queue["settings"]["retention_done_ms"],
            &queue["settings"]["retention_failed_ms"]
        ),
        (&json!(86_400_000), &json!(0))
    );
    let answer = json_out(
        &runlease(
            &url,
            &["--json", "queues", "retention", "mail", "--done-ms", "default"],
            None,
        )
        .await,
    );
    assert_eq!(
        (
            &answer["settings"]["retention_done_ms"],
            &answer["settings"]["retention_failed_ms"]
        ),
        (&Value::Null, &json!(0))
    );
    assert_eq!(
        answer["settings"],
        c.api.get("/v1/queues/mail").await.1["settings"]
    );
    assert!(
        refused(&runlease(&url, &["queues", "retention", "mail"], None).await).contains("nothing to change")
    );
    assert!(
        refused(&runlease(&url, &["queues", "retention", "mail", "--done-ms", "-1"], None).await)
            .contains("--done-ms")
    );
}
