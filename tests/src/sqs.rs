//! A moto SQS server of a test's own (`moto_server`, PyPI `moto[server]`),
//! on a free port, and the few SQS calls the tests make, in SQS's JSON
//! protocol. Also builds the event Lambda's SQS event source mapping would
//! hand a function for received messages.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The region tests use with moto (its default account is 123456789012).
pub const TEST_REGION: &str = "us-east-1";

/// moto routes a request by the service in its credential scope; it does not
/// check signatures.
const AUTHORIZATION: &str =
    "AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=00";

/// A moto server owned by one test; killed when dropped.
pub struct TestSqs {
    /// Its port.
    pub port: u16,
    child: Child,
    http: reqwest::Client,
}

/// A message as `ReceiveMessage` answers it.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    /// `MessageId`.
    pub message_id: String,
    /// `ReceiptHandle`, to delete it.
    pub receipt_handle: String,
    /// `Body`.
    pub body: String,
    /// `MD5OfBody`.
    pub md5_of_body: String,
    /// `Attributes` (`ApproximateReceiveCount`, `SentTimestamp`, ...).
    pub attributes: Value,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestSqs {
    /// Starts `moto_server` on a free port and waits until SQS answers. Fails
    /// the test, saying how to install it, when it is missing.
    pub async fn start() -> Self {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start moto_server ({e}): install it with pip install 'moto[server]'")
            });
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let mut sqs = Self { port, child, http };
        for _ in 0..400 {
            if let Ok(Some(status)) = sqs.child.try_wait() {
                panic!(
                    "moto_server exited at start ({status}): is moto[server] installed? pip install 'moto[server]'"
                );
            }
            if sqs.try_call("ListQueues", json!({})).await.is_ok() {
                return sqs;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("moto_server did not answer on port {port}");
    }

    /// The endpoint to give an SQS client (`RUNLEASE_SQS_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn try_call(&self, action: &str, body: Value) -> Result<Value, String> {
        let response = self
            .http
            .post(self.endpoint())
            .header("X-Amz-Target", format!("AmazonSQS.{action}"))
            .header("Content-Type", "application/x-amz-json-1.0")
            .header("Authorization", AUTHORIZATION)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{action}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{action}: {e}: {text}"))
    }

    /// One SQS call (JSON protocol); panics on failure.
    pub async fn call(&self, action: &str, body: Value) -> Value {
        self.try_call(action, body).await.unwrap()
    }

    /// Creates a queue; its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let answer = self.call("CreateQueue", json!({"QueueName": name})).await;
        answer["QueueUrl"].as_str().unwrap().to_owned()
    }

    /// The queue's ARN.
    pub async fn queue_arn(&self, queue_url: &str) -> String {
        let answer = self
            .call(
                "GetQueueAttributes",
                json!({"QueueUrl": queue_url, "AttributeNames": ["QueueArn"]}),
            )
            .await;
        answer["Attributes"]["QueueArn"].as_str().unwrap().to_owned()
    }

    /// Sends a message; its id.
    pub async fn send(&self, queue_url: &str, body: &str) -> String {
        let answer = self
            .call("SendMessage", json!({"QueueUrl": queue_url, "MessageBody": body}))
            .await;
        answer["MessageId"].as_str().unwrap().to_owned()
    }

    /// Receives up to `max` messages, long-polling up to `wait_secs`.
    pub async fn receive(&self, queue_url: &str, max: u32, wait_secs: u32) -> Vec<ReceivedMessage> {
        let answer = self
            .call(
                "ReceiveMessage",
                json!({
                    "QueueUrl": queue_url,
                    "MaxNumberOfMessages": max,
                    "WaitTimeSeconds": wait_secs,
                    "AttributeNames": ["All"],
                }),
            )
            .await;
        answer
            .get("Messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|m| ReceivedMessage {
                message_id: m["MessageId"].as_str().unwrap().to_owned(),
                receipt_handle: m["ReceiptHandle"].as_str().unwrap().to_owned(),
                body: m["Body"].as_str().unwrap().to_owned(),
                md5_of_body: m["MD5OfBody"].as_str().unwrap_or_default().to_owned(),
                attributes: m.get("Attributes").cloned().unwrap_or_else(|| json!({})),
            })
            .collect()
    }

    /// Deletes a received message (what the event source mapping does for
    /// every record a function did not name in `batchItemFailures`).
    pub async fn delete(&self, queue_url: &str, receipt_handle: &str) {
        self.call(
            "DeleteMessage",
            json!({"QueueUrl": queue_url, "ReceiptHandle": receipt_handle}),
        )
        .await;
    }

    /// `(visible, in flight)` message counts.
    pub async fn counts(&self, queue_url: &str) -> (u64, u64) {
        let answer = self
            .call(
                "GetQueueAttributes",
                json!({
                    "QueueUrl": queue_url,
                    "AttributeNames": ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                }),
            )
            .await;
        let n = |k: &str| answer["Attributes"][k].as_str().unwrap().parse().unwrap();
        (
            n("ApproximateNumberOfMessages"),
            n("ApproximateNumberOfMessagesNotVisible"),
        )
    }
}

impl Drop for TestSqs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
            "awsRegion": TEST_REGION,
        })).collect::<Vec<_>>()
    })
}

/// The event an EventBridge schedule (rule) hands a function.
pub fn scheduled_event() -> Value {
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": TEST_REGION,
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/runlease-sweep"],
        "detail": {}
    })
}
