//! Cron schedules: a schedule enqueues one job on its queue at each fire
//! time of its cron expression, in its time zone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::QueueName;

/// `PUT /v1/schedules/{name}` (admin): creates or replaces a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutScheduleRequest {
    /// The queue its jobs go to.
    pub queue: QueueName,
    /// `minute hour day month weekday`, or six fields with seconds first.
    pub cron: String,
    /// An IANA time zone the cron expression is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The payload of every job it enqueues.
    pub payload: Value,
    /// Priority of its jobs (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Attempt budget of its jobs (default: the coordinator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    /// Attempt timeout of its jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    /// A paused schedule enqueues nothing (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// A schedule as the protocol answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its name.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: QueueName,
    /// Its cron expression.
    pub cron: String,
    /// The time zone the expression is read in.
    pub timezone: String,
    /// The payload of its jobs.
    pub payload: Value,
    /// Priority of its jobs.
    pub priority: i32,
    /// Attempt budget of its jobs (`null`: the coordinator's default).
    pub max_attempts: Option<i32>,
    /// Attempt timeout of its jobs.
    pub timeout_ms: Option<i64>,
    /// Whether it is paused.
    pub paused: bool,
    /// The next fire time (`null` while paused).
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The last fire time a job was enqueued for.
    pub last_fired_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// Answer to `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListSchedulesResponse {
    /// Every schedule, by name.
    pub schedules: Vec<Schedule>,
}
