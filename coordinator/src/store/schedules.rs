//! Cron schedules: stored definitions, and the fire pass that enqueues one
//! job per fire time.

use chrono::{DateTime, Utc};
use runlease_protocol::{JobId, QueueName};
use serde_json::Value;

use crate::cron::CronSpec;
use crate::store::jobs::{Enqueued, NewJob};
use crate::store::rows::{col, queue_col};
use crate::store::{Store, StoreError, sql};

/// What a schedule is set to: what a `PUT` gives and a row keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleDefinition {
    /// Its name.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: QueueName,
    /// Its cron expression, as given.
    pub cron: String,
    /// Its IANA time zone, as given.
    pub timezone: String,
    /// The payload of its jobs.
    pub payload: Value,
    /// Priority of its jobs.
    pub priority: i32,
    /// Attempt budget of its jobs.
    pub max_attempts: Option<i32>,
    /// Attempt timeout of its jobs.
    pub timeout_ms: Option<i64>,
    /// Whether it is paused.
    pub paused: bool,
}

impl ScheduleDefinition {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self, StoreError> {
        Ok(Self {
            name: col(row, "name")?,
            queue: queue_col(row, "queue")?,
            cron: col(row, "cron")?,
            timezone: col(row, "timezone")?,
            payload: col(row, "payload")?,
            priority: col(row, "priority")?,
            max_attempts: col(row, "max_attempts")?,
            timeout_ms: col(row, "timeout_ms")?,
            paused: col(row, "paused")?,
        })
    }
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// What it is set to.
    pub definition: ScheduleDefinition,
    /// The first fire time not yet enqueued.
    pub next_fire_at: DateTime<Utc>,
    /// The last fire time enqueued.
    pub last_fired_at: Option<DateTime<Utc>>,
    /// Created at.
    pub created_at: DateTime<Utc>,
    /// Last changed at.
    pub updated_at: DateTime<Utc>,
}

impl ScheduleRow {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self, StoreError> {
        Ok(Self {
            definition: ScheduleDefinition::from_row(row)?,
            next_fire_at: col(row, "next_fire_at")?,
            last_fired_at: col(row, "last_fired_at")?,
            created_at: col(row, "created_at")?,
            updated_at: col(row, "updated_at")?,
        })
    }
}

/// A schedule to create or replace (validated by the HTTP layer).
#[derive(Debug, Clone)]
pub struct NewSchedule {
    /// What to set it to.
    pub definition: ScheduleDefinition,
    /// Its cron expression, parsed.
    pub spec: CronSpec,
}

/// One fire time enqueued by a fire pass.
#[derive(Debug, Clone)]
pub struct Fired {
    /// The schedule.
    pub schedule: String,
    /// The fire time.
    pub fire: DateTime<Utc>,
    /// The job (new, or the one an earlier pass enqueued for this fire time).
    pub job: Enqueued,
}

impl Store {
    /// Creates or replaces a schedule; its next fire time is the first after
    /// now (PostgreSQL's clock). Answers it and whether it is new.
    pub async fn put_schedule(&self, new: &NewSchedule) -> Result<(ScheduleRow, bool), StoreError> {
        let s = &new.definition;
        self.timed("schedules", || async move {
            let client = self.conn().await?;
            let clock = client.prepare_cached(sql::CLOCK_NOW).await?;
            let now: DateTime<Utc> = col(&client.query_one(&clock, &[]).await?, "now")?;
            let next = new.spec.next_after(now).ok_or_else(|| {
                StoreError::Rejected(format!("cron {:?} has no fire time after now", s.cron))
            })?;
            let stmt = client.prepare_cached(sql::SCHEDULE_PUT).await?;
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &s.name,
                        &s.queue.as_str(),
                        &s.cron,
                        &s.timezone,
                        &s.payload,
                        &s.priority,
                        &s.max_attempts,
                        &s.timeout_ms,
                        &s.paused,
                        &next,
                    ],
                )
                .await?;
            Ok((ScheduleRow::from_row(&row)?, col(&row, "created")?))
        })
        .await
    }

    /// Schedules by name (`None`: all).
    pub async fn schedules(&self, name: Option<&str>) -> Result<Vec<ScheduleRow>, StoreError> {
        self.timed("schedules", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::SCHEDULE_LIST).await?;
            client
                .query(&stmt, &[&name])
                .await?
                .iter()
                .map(ScheduleRow::from_row)
                .collect()
        })
        .await
    }

    /// Deletes a schedule; answers it as it was.
    pub async fn delete_schedule(&self, name: &str) -> Result<Option<ScheduleRow>, StoreError> {
        self.timed("schedules", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::SCHEDULE_DELETE).await?;
            client
                .query_opt(&stmt, &[&name])
                .await?
                .as_ref()
                .map(ScheduleRow::from_row)
                .transpose()
        })
        .await
    }

    /// One fire pass over up to `limit` due schedules: each enqueues the job
    /// of its latest fire time at or before now (idempotency key
    /// `schedule:<name>:<fire time>`) and moves on to its next fire time.
    /// `default_max_attempts` fills a schedule that sets no budget.
    pub async fn fire_schedules(
        &self,
        limit: i64,
        default_max_attempts: i32,
    ) -> Result<Vec<Fired>, StoreError> {
        self.timed("schedules", || async move {
            let mut client = self.conn().await?;
            let tx = client.transaction().await?;
            let stmt = tx.prepare_cached(sql::SCHEDULE_DUE).await?;
            let due = tx.query(&stmt, &[&limit]).await?;
            let fired_stmt = tx.prepare_cached(sql::SCHEDULE_FIRED).await?;
            let mut fired = Vec::new();
            for row in &due {
                let ScheduleRow {
                    definition: schedule,
                    next_fire_at,
                    ..
                } = ScheduleRow::from_row(row)?;
                let now: DateTime<Utc> = col(row, "now")?;
                let Ok(spec) = CronSpec::parse(&schedule.cron, &schedule.timezone) else {
                    tracing::warn!(schedule = %schedule.name, "a stored schedule no longer parses; it is skipped");
                    continue;
                };
                let Some((fire, next)) = spec.catch_up(next_fire_at, now) else {
                    continue;
                };
                let job = NewJob {
                    id: JobId::new(),
                    queue: schedule.queue.clone(),
                    payload: schedule.payload.clone(),
                    priority: schedule.priority,
                    run_at: None,
                    delay_ms: None,
                    max_attempts: schedule.max_attempts.unwrap_or(default_max_attempts),
                    timeout_ms: schedule.timeout_ms,
                    idempotency_key: Some(format!(
                        "schedule:{}:{}",
                        schedule.name,
                        fire.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    )),
                    concurrency_key: None,
                    // A schedule's jobs start traces of their own.
                    traceparent: None,
                    dependencies: None,
                };
                // Committed before the schedule moves on: a crash in between
                // repeats this fire time, and its key answers the same job.
                let enqueued = self.enqueue(vec![job]).await?;
                tx.execute(&fired_stmt, &[&schedule.name, &fire, &next]).await?;
                for job in enqueued {
                    fired.push(Fired {
                        schedule: schedule.name.clone(),
                        fire,
                        job,
                    });
                }
            }
            tx.commit().await?;
            Ok(fired)
        })
        .await
    }
}
