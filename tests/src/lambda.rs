//! The events Lambda hands a function (an SQS event source mapping's, an
//! EventBridge schedule's), and the example Lambda function
//! (`runlease-worker-lambda`'s `bootstrap`) under cargo-lambda's emulator of
//! the Lambda Runtime API (`cargo lambda watch`): the function polls
//! `/2018-06-01/runtime/invocation/next` as it would in Lambda, and a test
//! invokes it over HTTP as Lambda's invoke API would.
//!
//! cargo-lambda (`pip install cargo-lambda`) must be installed; a test fails,
//! saying so, when it is not. The emulator builds the function with `cargo
//! run` in the workspace (a no-op once `cargo build -p runlease-worker-lambda
//! --bin bootstrap` has run with the same target directory).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::sqs::{REGION, ReceivedMessage};

/// The event Lambda's SQS event source mapping hands a function for
/// `messages` received from the queue `queue_arn`.
pub fn sqs_event(queue_arn: &str, messages: &[ReceivedMessage]) -> Value {
    json!({
        "Records": messages.iter().map(|m| json!({
            "messageId": m.message_id,
            "receiptHandle": m.receipt_handle,
            "body": m.body,
            "attributes": m.attributes,
            "messageAttributes": {},
            "md5OfBody": m.md5_of_body,
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": REGION,
        })).collect::<Vec<_>>()
    })
}

/// The event an EventBridge schedule (a rule) hands a function.
pub fn scheduled_event() -> Value {
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": REGION,
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/runlease-sweep"],
        "detail": {}
    })
}

/// The function's name under the emulator: its binary's.
pub const FUNCTION: &str = "bootstrap";

/// Longest an invocation may take here, the function's first build included.
const INVOKE_TIMEOUT: Duration = Duration::from_secs(300);

/// `cargo lambda watch` serving the example function; stopped when dropped.
pub struct LambdaEmulator {
    /// Where invocations are sent.
    pub port: u16,
    child: Child,
    log: PathBuf,
    http: reqwest::Client,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Fails the test, saying how to install it, unless `cargo lambda` runs.
pub fn require_cargo_lambda() {
    let ok = Command::new("cargo")
        .args(["lambda", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "cargo-lambda is not installed: pip install cargo-lambda (about 20 s), then run the tests again"
    );
}

impl LambdaEmulator {
    /// Starts `cargo lambda watch` for the example function with `env` in its
    /// environment (`RUNLEASE_URL`, `RUNLEASE_QUEUES`, ...), and waits until it
    /// accepts invocations.
    pub async fn start(env: &[(&str, String)]) -> Self {
        require_cargo_lambda();
        let port = crate::process::free_port();
        let log = std::env::temp_dir().join(format!("runlease-lambda-{port}-{}.log", uuid::Uuid::new_v4()));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("cargo");
        cmd.args(["lambda", "watch", "-A", "127.0.0.1", "-P", &port.to_string()])
            // Tests change no source: do not rebuild and restart on file events.
            .args([
                "--ignore-changes",
                "--bin",
                FUNCTION,
                "-p",
                "runlease-worker-lambda",
            ])
            .current_dir(workspace_root())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("cargo lambda watch");
        for _ in 0..1200 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "cargo lambda watch exited at start ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                let http = reqwest::Client::builder()
                    .timeout(INVOKE_TIMEOUT)
                    .build()
                    .unwrap();
                return Self {
                    port,
                    child,
                    log,
                    http,
                };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cargo lambda watch did not listen on port {port} within 60 s");
    }

    /// Invokes the function with `event` (the Lambda invoke API); the status
    /// (200, or 500 when the function returned an error) and what it answered.
    pub async fn invoke(&self, event: &Value) -> (u16, Value) {
        let url = format!(
            "http://127.0.0.1:{}/2015-03-31/functions/{FUNCTION}/invocations",
            self.port
        );
        let response = self
            .http
            .post(url)
            .json(event)
            .send()
            .await
            .unwrap_or_else(|e| panic!("invoking the function failed: {e}\n{}", self.log()));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    /// What the emulator and the function printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LambdaEmulator {
    fn drop(&mut self) {
        // SIGTERM lets cargo-lambda stop the function process it started (in
        // a process group of its own); SIGKILL only if it does not exit.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
