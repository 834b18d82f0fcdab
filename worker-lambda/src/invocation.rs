//! What invoked the function: SQS wake-ups, an EventBridge schedule (a sweep)
//! or a direct invocation. Every kind runs the same worker; they differ in
//! what is answered.

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `eventSource` of a record delivered by an SQS event source mapping.
pub const SQS_EVENT_SOURCE: &str = "aws:sqs";
/// The `source` of an EventBridge scheduled event.
pub const SCHEDULE_SOURCE: &str = "aws.events";
/// The `detail-type` of an EventBridge scheduled event.
pub const SCHEDULE_DETAIL_TYPE: &str = "Scheduled Event";

/// The body of a wake-up message the coordinator sends to SQS. A hint only:
/// the function claims whatever its registered queues hold, whatever it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeUp {
    /// The runlease queue that has work.
    pub queue: String,
    /// How many jobs the coordinator meant this wake-up for.
    pub jobs: u64,
}

impl WakeUp {
    /// Parses a message body; `None` when it is not a wake-up.
    pub fn parse(body: &str) -> Option<Self> {
        serde_json::from_str(body).ok()
    }
}

/// One invocation, classified.
#[derive(Debug, Clone)]
pub enum Invocation {
    /// SQS wake-ups, answered with a partial batch response.
    Wake(SqsEvent),
    /// An EventBridge scheduled event: a sweep of whatever is queued.
    Scheduled,
    /// Any other JSON (a test, `aws lambda invoke`, another service): a sweep too.
    Direct(Value),
}

impl Invocation {
    /// Classifies an event: `Records` whose every entry has `eventSource`
    /// `aws:sqs` are wake-ups; `source` `aws.events` with `detail-type`
    /// `Scheduled Event` is the schedule; anything else is direct.
    pub fn classify(event: Value) -> Self {
        if let Some(records) = event.get("Records").and_then(Value::as_array)
            && !records.is_empty()
            && records
                .iter()
                .all(|r| r.get("eventSource").and_then(Value::as_str) == Some(SQS_EVENT_SOURCE))
        {
            match serde_json::from_value::<SqsEvent>(event.clone()) {
                Ok(sqs) => return Invocation::Wake(sqs),
                Err(e) => {
                    tracing::warn!(error = %e, "an SQS event that does not parse; treating it as a direct invocation")
                }
            }
        }
        if event.get("source").and_then(Value::as_str) == Some(SCHEDULE_SOURCE)
            && event.get("detail-type").and_then(Value::as_str) == Some(SCHEDULE_DETAIL_TYPE)
        {
            return Invocation::Scheduled;
        }
        Invocation::Direct(event)
    }

    /// The kind, as logged and answered.
    pub fn kind(&self) -> &'static str {
        match self {
            Invocation::Wake(_) => "sqs",
            Invocation::Scheduled => "scheduled",
            Invocation::Direct(_) => "direct",
        }
    }
}

/// The message id of a record, which a partial batch response names.
pub fn message_id(record: &SqsMessage) -> Option<&str> {
    record.message_id.as_deref()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sqs_record(id: &str, body: &str) -> Value {
        json!({
            "messageId": id,
            "receiptHandle": "rh",
            "body": body,
            "attributes": {"ApproximateReceiveCount": "1"},
            "messageAttributes": {},
            "md5OfBody": "x",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:wake",
            "awsRegion": "us-east-1"
        })
    }

    #[test]
    fn sqs_records_are_wake_ups() {
        let event =
            json!({"Records": [sqs_record("m1", r#"{"queue":"q","jobs":3}"#), sqs_record("m2", "junk")]});
        let Invocation::Wake(sqs) = Invocation::classify(event) else {
            panic!("not a wake")
        };
        assert_eq!(sqs.records.len(), 2);
        assert_eq!(message_id(&sqs.records[0]), Some("m1"));
        assert_eq!(
            WakeUp::parse(sqs.records[0].body.as_deref().unwrap_or_default()),
            Some(WakeUp {
                queue: "q".into(),
                jobs: 3
            })
        );
        assert_eq!(WakeUp::parse("junk"), None);
    }

    #[test]
    fn a_scheduled_event_is_a_sweep() {
        let event = json!({
            "version": "0", "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
            "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "123456789012", "time": "2024-01-01T00:00:00Z", "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/sweep"], "detail": {}
        });
        assert!(matches!(Invocation::classify(event), Invocation::Scheduled));
    }

    #[test]
    fn anything_else_is_direct() {
        for event in [
            json!({}),
            json!(null),
            json!("sweep"),
            json!({"Records": []}),
            json!({"Records": [{"eventSource": "aws:s3"}]}),
            json!({"source": "aws.events", "detail-type": "EC2 Instance State-change Notification"}),
        ] {
            assert!(
                matches!(Invocation::classify(event.clone()), Invocation::Direct(_)),
                "{event}"
            );
        }
    }
}
