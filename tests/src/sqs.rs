//! moto's SQS server on a free port, owned by one test (stopped on drop), and
//! an SQS client for it with static dummy credentials (never the instance
//! metadata service). The Lambda tests also receive whole messages (to build
//! the event an SQS event source mapping delivers) and delete them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use serde_json::{Map, Value};

/// Region the tests use.
pub const REGION: &str = "us-east-1";

/// A message as `ReceiveMessage` answers it, with what an SQS event record
/// carries.
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
    /// System attributes (`ApproximateReceiveCount`, `SentTimestamp`, ...).
    pub attributes: Value,
}

/// A moto server.
pub struct TestSqs {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl TestSqs {
    /// Starts `moto_server` on a free port and waits until it answers.
    pub async fn start() -> Self {
        let port = crate::process::free_port();
        let mut sqs = Self { port, child: None };
        sqs.resume().await;
        sqs
    }

    /// A stopped server's place: its port, with nothing listening yet.
    pub fn not_started() -> Self {
        let port = crate::process::free_port();
        Self { port, child: None }
    }

    /// Starts (again) on the same port.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto_server (pip install 'moto[server]'): {e}"));
        self.child = Some(child);
        for _ in 0..400 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("moto_server did not start on port {}", self.port);
    }

    /// Its endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a coordinator process needs to reach it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RUNLEASE_SQS_ENDPOINT", self.endpoint()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// A client for it.
    pub async fn client(&self) -> aws_sdk_sqs::Client {
        let config = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("test", "test", None, None, "static"))
            .endpoint_url(self.endpoint())
            .load()
            .await;
        aws_sdk_sqs::Client::new(&config)
    }

    /// Creates a queue; answers its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let out = self
            .client()
            .await
            .create_queue()
            .queue_name(name)
            .send()
            .await
            .unwrap();
        out.queue_url().unwrap().to_owned()
    }

    /// Receives up to 10 message bodies, long-polling up to `wait_secs`.
    pub async fn receive(&self, url: &str, wait_secs: i32) -> Vec<String> {
        self.receive_messages(url, wait_secs)
            .await
            .into_iter()
            .map(|m| m.body)
            .collect()
    }

    /// Receives up to 10 whole messages, long-polling up to `wait_secs`.
    pub async fn receive_messages(&self, url: &str, wait_secs: i32) -> Vec<ReceivedMessage> {
        let out = self
            .client()
            .await
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_secs)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap();
        out.messages()
            .iter()
            .map(|m| ReceivedMessage {
                message_id: m.message_id().unwrap().to_owned(),
                receipt_handle: m.receipt_handle().unwrap().to_owned(),
                body: m.body().unwrap_or_default().to_owned(),
                md5_of_body: m.md5_of_body().unwrap_or_default().to_owned(),
                attributes: Value::Object(
                    m.attributes()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.as_str().to_owned(), Value::String(v.clone())))
                        .collect::<Map<_, _>>(),
                ),
            })
            .collect()
    }

    /// Deletes a received message (what an event source mapping does with
    /// every record a function did not name in `batchItemFailures`).
    pub async fn delete(&self, url: &str, receipt_handle: &str) {
        self.client()
            .await
            .delete_message()
            .queue_url(url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .unwrap();
    }

    /// Makes a received message visible again at once, as SQS does when its
    /// visibility timeout ends without a delete.
    pub async fn make_visible(&self, url: &str, receipt_handle: &str) {
        self.client()
            .await
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }

    /// The queue's ARN.
    pub async fn queue_arn(&self, url: &str) -> String {
        self.attribute(url, QueueAttributeName::QueueArn).await
    }

    /// `(visible, in flight)` message counts.
    pub async fn counts(&self, url: &str) -> (u64, u64) {
        let visible = self
            .attribute(url, QueueAttributeName::ApproximateNumberOfMessages)
            .await;
        let in_flight = self
            .attribute(url, QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .await;
        (visible.parse().unwrap(), in_flight.parse().unwrap())
    }

    async fn attribute(&self, url: &str, name: QueueAttributeName) -> String {
        let out = self
            .client()
            .await
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(name.clone())
            .send()
            .await
            .unwrap();
        out.attributes().and_then(|a| a.get(&name)).unwrap().clone()
    }

    /// Stops the server (as an outage would).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestSqs {
    fn drop(&mut self) {
        self.stop();
    }
}
