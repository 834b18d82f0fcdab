//! The operator's calls of [`Client`]: queue figures and settings, endpoint
//! secrets, listings, bulk actions and schedules.

use std::time::Duration;

use reqwest::Method;
use runlease_protocol::admin::{
    BulkJobsRequest, BulkJobsResponse, EndpointSecretResponse, ListJobsResponse, UpdateQueueRequest,
};
use runlease_protocol::limits::MAX_SCHEDULE_NAME_LEN;
use runlease_protocol::producer::{ListQueuesResponse, QueueSummary};
use runlease_protocol::schedules::{ListSchedulesResponse, PutScheduleRequest, Schedule};
use runlease_protocol::{JobState, QueueName, routes};

use super::{Client, Repeat, encode_query_value};
use crate::error::{Error, Result};

impl Client {
    /// Per-queue figures.
    pub async fn queues(&self) -> Result<Vec<QueueSummary>> {
        let answer: ListQueuesResponse = self
            .call::<(), _>(Method::GET, routes::QUEUES, None, Repeat::Safe, Duration::ZERO)
            .await?;
        Ok(answer.queues)
    }

    /// One page of a queue's jobs, newest first: those in `states` (every
    /// state when empty), at most `limit` (the coordinator's default, 50,
    /// when `None`; at most 500), after `cursor` (the previous page's
    /// `next_cursor`, passed unchanged with the same queue and states).
    pub async fn list_jobs(
        &self,
        queue: &str,
        states: &[JobState],
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<ListJobsResponse> {
        let queue = QueueName::new(queue).map_err(|e| Error::Config(e.to_string()))?;
        let mut path = format!("{}?queue={}", routes::JOBS, encode_query_value(queue.as_str()));
        if !states.is_empty() {
            let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
            path.push_str(&format!("&state={}", encode_query_value(&names.join(","))));
        }
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={}", encode_query_value(cursor)));
        }
        self.call::<(), _>(Method::GET, &path, None, Repeat::Safe, Duration::ZERO)
            .await
    }

    /// Retries, cancels or deletes every job of a queue that the filter
    /// matches, each by its single-job rule (admin key). Not retried: a
    /// repeat could act on jobs that reached the states in the meantime.
    pub async fn bulk(&self, req: &BulkJobsRequest) -> Result<BulkJobsResponse> {
        self.call(
            Method::POST,
            routes::JOBS_BULK,
            Some(req),
            Repeat::Once,
            Duration::ZERO,
        )
        .await
    }

    /// One queue's figures and settings (a queue without jobs or settings
    /// answers zeros and the defaults).
    pub async fn queue(&self, name: &str) -> Result<QueueSummary> {
        let queue = QueueName::new(name).map_err(|e| Error::Config(e.to_string()))?;
        self.call::<(), _>(
            Method::GET,
            &routes::queue_path(queue.as_str()),
            None,
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Changes a queue's settings (admin key): absent fields are unchanged,
    /// `Some(None)` clears a limit or an override. Answers the queue's
    /// figures and settings after the change. Retried: it sets values, so
    /// a repeat leaves the same settings.
    pub async fn update_queue(&self, name: &str, req: &UpdateQueueRequest) -> Result<QueueSummary> {
        let queue = QueueName::new(name).map_err(|e| Error::Config(e.to_string()))?;
        self.call(
            Method::PATCH,
            &routes::queue_path(queue.as_str()),
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// The signing secret of the queue's endpoint (admin key), and during a
    /// rotation the previous one, which still signs until it expires.
    pub async fn endpoint_secret(&self, queue: &str) -> Result<EndpointSecretResponse> {
        self.call::<(), _>(
            Method::GET,
            &endpoint_secret_path(queue, "")?,
            None,
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Makes a new signing secret for the queue's endpoint (admin key); the
    /// previous one keeps signing beside it for the coordinator's rotation
    /// window. Not retried: a repeat would rotate again and cut the window
    /// of the secret the endpoint still holds.
    pub async fn rotate_endpoint_secret(&self, queue: &str) -> Result<EndpointSecretResponse> {
        self.call(
            Method::POST,
            &endpoint_secret_path(queue, "/rotate")?,
            Some(&serde_json::json!({})),
            Repeat::Once,
            Duration::ZERO,
        )
        .await
    }

    /// Creates or replaces the schedule `name` (admin key); answers it as
    /// stored, with its next fire time (the first after now). Retried: a
    /// repeat sets the same values (its answer says 200 rather than 201,
    /// which this call does not tell apart anyway).
    pub async fn put_schedule(&self, name: &str, req: &PutScheduleRequest) -> Result<Schedule> {
        self.call(
            Method::PUT,
            &checked_schedule_path(name)?,
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Every schedule the key may see, by name.
    pub async fn schedules(&self) -> Result<Vec<Schedule>> {
        let answer: ListSchedulesResponse = self
            .call::<(), _>(Method::GET, routes::SCHEDULES, None, Repeat::Safe, Duration::ZERO)
            .await?;
        Ok(answer.schedules)
    }

    /// One schedule; `Err(NotFound)` when there is none of that name.
    pub async fn schedule(&self, name: &str) -> Result<Schedule> {
        self.call::<(), _>(
            Method::GET,
            &checked_schedule_path(name)?,
            None,
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Deletes a schedule (admin key) and answers it as it was; the jobs it
    /// enqueued stay. Sent once: after a lost answer a repeat would say
    /// `NotFound` for the schedule this call deleted, or delete one put
    /// under the same name in the meantime, and no failure (not even a 503,
    /// which a connection lost mid-statement also gives) proves the first
    /// try did nothing. After a transient error, [`Client::schedule`] tells
    /// whether it is gone.
    pub async fn delete_schedule(&self, name: &str) -> Result<Schedule> {
        self.call::<(), _>(
            Method::DELETE,
            &checked_schedule_path(name)?,
            None,
            Repeat::Once,
            Duration::ZERO,
        )
        .await
    }
}

/// The path of schedule `name`, refused here as the coordinator would: 1 to
/// 128 bytes, no control characters (an empty name would address the list).
pub(super) fn checked_schedule_path(name: &str) -> Result<String> {
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME_LEN || name.chars().any(char::is_control) {
        return Err(Error::Config(format!(
            "{name:?} is not a schedule name: 1 to {MAX_SCHEDULE_NAME_LEN} bytes without control characters"
        )));
    }
    Ok(routes::schedule_path(name))
}

/// `/v1/queues/{queue}/endpoint-secret` and what follows it (`suffix`), for
/// a checked queue name.
pub(super) fn endpoint_secret_path(queue: &str, suffix: &str) -> Result<String> {
    let queue = QueueName::new(queue).map_err(|e| Error::Config(e.to_string()))?;
    let queue = routes::queue_path(queue.as_str());
    let route = routes::QUEUE_ENDPOINT_SECRET.replace("/v1/queues/{queue}", &queue);
    Ok(format!("{route}{suffix}"))
}
