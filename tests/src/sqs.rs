//! moto's SQS server on a free port, owned by one test (stopped on drop), and
//! an SQS client for it with static dummy credentials (never the instance
//! metadata service).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::{Credentials, Region};

/// Region the tests use.
pub const REGION: &str = "us-east-1";

/// A moto server.
pub struct TestSqs {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl TestSqs {
    /// Starts `moto_server` on a free port and waits until it answers.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut sqs = Self { port, child: None };
        sqs.resume().await;
        sqs
    }

    /// A stopped server's place: its port, with nothing listening yet.
    pub fn not_started() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
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
        let out = self
            .client()
            .await
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_secs)
            .send()
            .await
            .unwrap();
        out.messages()
            .iter()
            .filter_map(|m| m.body().map(str::to_owned))
            .collect()
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
