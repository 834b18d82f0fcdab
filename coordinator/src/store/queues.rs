//! Queue figures and settings. Figures come from indexes over live rows
//! (`queue_live_counts.sql`) and from the tallies (`queue_tallies.sql`),
//! kept by the statements that end jobs: nothing here reads the terminal
//! history, so a scrape costs the same with ten million finished jobs as
//! with none.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use runlease_protocol::{Backoff, JobState, QueueName};

use crate::endpoint::ENDPOINT_WORKER;
use crate::store::retry::RetryPolicy;
use crate::store::rows::{col, queue_col};
use crate::store::{Store, StoreError, sql};

/// A queue's settings as stored; a queue without a row has
/// [`QueueSettings::default`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueSettings {
    /// Hands out no claims while true.
    pub paused: bool,
    /// Most running jobs of the queue.
    pub max_running: Option<i32>,
    /// Most running jobs per concurrency key.
    pub max_running_per_key: Option<i32>,
    /// Starts per second on average, and at once.
    pub rate_limit: Option<RateLimit>,
    /// Retention of done jobs, ms (`None`: the coordinator's; 0: forever).
    pub retention_done_ms: Option<i64>,
    /// Retention of failed and cancelled jobs, ms.
    pub retention_failed_ms: Option<i64>,
    /// When the settings last changed (`None`: never set).
    pub updated_at: Option<DateTime<Utc>>,
    /// The endpoint that serves the queue, if any.
    pub endpoint: Option<EndpointSetting>,
    /// The endpoint's signing secrets (kept when the endpoint is removed).
    pub endpoint_keys: Option<EndpointKeys>,
    /// The retry policy of jobs enqueued without their own.
    pub retry: RetryPolicy,
    /// Where a job that fails for good leaves a follow-up.
    pub dead_letter_queue: Option<QueueName>,
}

/// A queue's endpoint: where its jobs are pushed, for how long a request
/// may stay open, and how many may be open at once across coordinators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSetting {
    /// The URL (checked when set: https, or a host the coordinator allows).
    pub url: String,
    /// How long a request may stay open, ms.
    pub timeout_ms: i32,
    /// Most requests open at once, across every coordinator.
    pub concurrency: i32,
}

/// A signing secret (`whsec_` + base64): never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// An endpoint's signing secrets: the current one, and during a rotation
/// the previous one with the end of its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointKeys {
    /// Signs every request.
    pub secret: Secret,
    /// Signs beside it until the time given.
    pub previous: Option<(Secret, DateTime<Utc>)>,
}

impl EndpointKeys {
    /// The secrets that sign a request now, the current one first.
    pub fn live(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.secret).chain(self.previous.as_ref().map(|(s, _)| s))
    }
}

/// What the coordinators saw of an endpoint lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointHealth {
    /// Connection failures in a row (0 after any answer).
    pub failures: i32,
    /// The last error (a failed connection, or an answer that failed a job).
    pub last_error: Option<String>,
    /// When it happened.
    pub last_error_at: Option<DateTime<Utc>>,
}

/// A token-bucket rate limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Refill rate, starts per second.
    pub per_s: f64,
    /// Bucket size: most starts at once.
    pub burst: i32,
}

/// A change of settings: `None` leaves a setting as it is; `Some(None)`
/// clears a nullable one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsChange {
    /// New pause state.
    pub paused: Option<bool>,
    /// New `max_running`.
    pub max_running: Option<Option<i32>>,
    /// New `max_running_per_key`.
    pub max_running_per_key: Option<Option<i32>>,
    /// New rate limit.
    pub rate_limit: Option<Option<RateLimit>>,
    /// New retention of done jobs.
    pub retention_done_ms: Option<Option<i64>>,
    /// New retention of failed and cancelled jobs.
    pub retention_failed_ms: Option<Option<i64>>,
    /// New endpoint (`Some(None)`: removed).
    pub endpoint: Option<Option<EndpointSetting>>,
    /// New attempt budget.
    pub max_attempts: Option<Option<i32>>,
    /// New backoff (replaced whole).
    pub backoff: Option<Option<Backoff>>,
    /// New retry window.
    pub retry_window_ms: Option<Option<i64>>,
    /// New dead-letter queue.
    pub dead_letter_queue: Option<Option<QueueName>>,
}

/// What a queue holds and how it is set.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueFigures {
    /// The queue.
    pub queue: QueueName,
    /// Jobs per state, every state present.
    pub counts: BTreeMap<JobState, i64>,
    /// Age of the oldest due claimable job.
    pub oldest_queued_age_ms: Option<i64>,
    /// Attempts ended by an expired lease.
    pub lease_expiries: i64,
    /// Failed or expired attempts after which the job was queued again.
    pub retries: i64,
    /// Due jobs its settings (pause, limits) keep from starting now.
    pub held_by_limits: i64,
    /// Jobs that ended in the last minute
    /// (`runlease_protocol::limits::THROUGHPUT_WINDOW_MS`), per terminal
    /// state (still in it).
    pub ended_recently: BTreeMap<JobState, i64>,
    /// Its settings.
    pub settings: QueueSettings,
    /// Its endpoint's health (with an endpoint set).
    pub endpoint_health: EndpointHealth,
    /// Running jobs its endpoint holds, across coordinators (page figures only).
    pub endpoint_in_flight: i64,
}

impl QueueFigures {
    /// A queue with no jobs, no tallies and the default settings.
    pub fn empty(queue: QueueName) -> Self {
        Self {
            queue,
            counts: JobState::ALL.iter().map(|s| (*s, 0)).collect(),
            oldest_queued_age_ms: None,
            lease_expiries: 0,
            retries: 0,
            held_by_limits: 0,
            ended_recently: BTreeMap::new(),
            settings: QueueSettings::default(),
            endpoint_health: EndpointHealth::default(),
            endpoint_in_flight: 0,
        }
    }
}

fn queue_name(raw: String) -> Result<QueueName, StoreError> {
    QueueName::new(raw).map_err(|e| StoreError::Database(format!("unexpected queue name: {e}")))
}

fn settings_from_row(row: &tokio_postgres::Row) -> Result<(QueueName, QueueSettings), StoreError> {
    let per_s: Option<f64> = col(row, "rate_per_s")?;
    let burst: Option<i32> = col(row, "rate_burst")?;
    let rate_limit = match (per_s, burst) {
        (Some(per_s), Some(burst)) => Some(RateLimit { per_s, burst }),
        _ => None,
    };
    Ok((
        queue_col(row, "queue")?,
        QueueSettings {
            paused: col(row, "paused")?,
            max_running: col(row, "max_running")?,
            max_running_per_key: col(row, "max_running_per_key")?,
            rate_limit,
            retention_done_ms: col(row, "retention_done_ms")?,
            retention_failed_ms: col(row, "retention_failed_ms")?,
            updated_at: Some(col(row, "updated_at")?),
            endpoint: endpoint_from_row(row)?,
            endpoint_keys: keys_from_row(row)?,
            retry: RetryPolicy::from_row(row)?,
            dead_letter_queue: col::<Option<String>>(row, "dead_letter_queue")?
                .map(queue_name)
                .transpose()?,
        },
    ))
}

fn endpoint_from_row(row: &tokio_postgres::Row) -> Result<Option<EndpointSetting>, StoreError> {
    let url: Option<String> = col(row, "endpoint_url")?;
    let timeout: Option<i32> = col(row, "endpoint_timeout_ms")?;
    let concurrency: Option<i32> = col(row, "endpoint_concurrency")?;
    Ok(match (url, timeout, concurrency) {
        (Some(url), Some(timeout_ms), Some(concurrency)) => Some(EndpointSetting {
            url,
            timeout_ms,
            concurrency,
        }),
        _ => None,
    })
}

fn keys_from_row(row: &tokio_postgres::Row) -> Result<Option<EndpointKeys>, StoreError> {
    let secret: Option<String> = col(row, "endpoint_secret")?;
    let previous: Option<String> = col(row, "endpoint_secret_previous")?;
    let until: Option<DateTime<Utc>> = col(row, "endpoint_secret_previous_until")?;
    Ok(secret.map(|s| EndpointKeys {
        secret: Secret(s),
        previous: previous.zip(until).map(|(p, u)| (Secret(p), u)),
    }))
}

fn health_from_row(row: &tokio_postgres::Row) -> Result<EndpointHealth, StoreError> {
    Ok(EndpointHealth {
        failures: col(row, "endpoint_failures")?,
        last_error: col(row, "endpoint_last_error")?,
        last_error_at: col(row, "endpoint_last_error_at")?,
    })
}

/// The figures of `queue` in `by_queue`, added when missing; `None` when
/// `only` names another queue.
fn entry<'a>(
    by_queue: &'a mut BTreeMap<String, QueueFigures>,
    only: Option<&QueueName>,
    queue: String,
) -> Result<Option<&'a mut QueueFigures>, StoreError> {
    if only.is_some_and(|q| q.as_str() != queue) {
        return Ok(None);
    }
    if !by_queue.contains_key(&queue) {
        let name = queue_name(queue.clone())?;
        by_queue.insert(queue.clone(), QueueFigures::empty(name));
    }
    Ok(by_queue.get_mut(&queue))
}

/// A state name from a statement's row.
fn state_of(name: &str) -> Result<JobState, StoreError> {
    name.parse().map_err(|e| StoreError::Database(format!("{e}")))
}

/// Adds the live states' counts (`queue_live_counts.sql`).
fn add_live(
    by_queue: &mut BTreeMap<String, QueueFigures>,
    only: Option<&QueueName>,
    rows: &[tokio_postgres::Row],
) -> Result<(), StoreError> {
    for row in rows {
        let state = state_of(&col::<String>(row, "state")?)?;
        let jobs: i64 = col(row, "jobs")?;
        let age: Option<i64> = col(row, "oldest_due_age_ms")?;
        if let Some(f) = entry(by_queue, only, col(row, "queue")?)? {
            f.counts.insert(state, jobs);
            if let Some(age) = age {
                f.oldest_queued_age_ms = Some(f.oldest_queued_age_ms.map_or(age, |a| a.max(age)));
            }
        }
    }
    Ok(())
}

/// Adds the terminal states' counts and the attempt tallies (`queue_tallies.sql`).
fn add_tallies(
    by_queue: &mut BTreeMap<String, QueueFigures>,
    only: Option<&QueueName>,
    rows: &[tokio_postgres::Row],
) -> Result<(), StoreError> {
    for row in rows {
        let tally: String = col(row, "tally")?;
        let n: i64 = col(row, "n")?;
        let queue: String = col(row, "queue")?;
        // A queue whose tallies net to zero and that has nothing else is
        // not listed.
        if n == 0 && !by_queue.contains_key(&queue) {
            continue;
        }
        if let Some(f) = entry(by_queue, only, queue)? {
            match tally.as_str() {
                "lease_expiries" => f.lease_expiries = n,
                "retries" => f.retries = n,
                state => {
                    f.counts.insert(state_of(state)?, n);
                }
            }
        }
    }
    Ok(())
}

/// Adds one queue's page figures: jobs ended in the last minute, and jobs
/// held back by its limits.
async fn add_detail(
    client: &crate::store::Db,
    by_queue: &mut BTreeMap<String, QueueFigures>,
) -> Result<(), StoreError> {
    // Only queues with terminal jobs can have ended any recently.
    let ended: Vec<&str> = by_queue
        .values()
        .filter(|f| {
            [JobState::Done, JobState::Failed, JobState::Cancelled]
                .iter()
                .any(|s| f.counts.get(s).is_some_and(|n| *n > 0))
        })
        .map(|f| f.queue.as_str())
        .collect();
    let mut recent = Vec::new();
    if !ended.is_empty() {
        let stmt = client.prepare_cached(sql::QUEUE_THROUGHPUT).await?;
        for row in client.query(&stmt, &[&ended]).await? {
            let queue: String = col(&row, "queue")?;
            recent.push((
                queue,
                state_of(&col::<String>(&row, "state")?)?,
                col::<i64>(&row, "n")?,
            ));
        }
    }
    for (queue, state, n) in recent {
        if let Some(f) = by_queue.get_mut(&queue) {
            f.ended_recently.insert(state, n);
        }
    }
    let held_stmt = client.prepare_cached(sql::QUEUE_HELD_BACK).await?;
    let in_flight_stmt = client.prepare_cached(sql::QUEUE_ENDPOINT_IN_FLIGHT).await?;
    for f in by_queue.values_mut() {
        let s = &f.settings;
        if s.endpoint.is_some() {
            let row = client
                .query_one(&in_flight_stmt, &[&f.queue.as_str(), &ENDPOINT_WORKER])
                .await?;
            f.endpoint_in_flight = col(&row, "n")?;
        }
        let holds = s.paused
            || s.max_running.is_some()
            || s.max_running_per_key.is_some()
            || s.rate_limit.is_some()
            || s.endpoint.is_some();
        let waiting = f.counts.get(&JobState::Queued).copied().unwrap_or(0)
            + f.counts.get(&JobState::EnqueueFailed).copied().unwrap_or(0);
        if holds && waiting > 0 {
            let row = client.query_one(&held_stmt, &[&f.queue.as_str()]).await?;
            f.held_by_limits = col(&row, "held")?;
        }
    }
    Ok(())
}

impl Store {
    /// Figures of every queue that holds jobs, has tallies or has settings;
    /// with `only`, of that queue alone (always answered, empty or not).
    /// `detail` also counts the due jobs each paused or limited queue holds
    /// back (a pass over that queue's backlog) and the jobs that ended in
    /// the last minute (a range of `jobs_prune_idx` per queue and terminal
    /// state); a scrape leaves both out.
    pub async fn queue_figures(
        &self,
        only: Option<&QueueName>,
        detail: bool,
    ) -> Result<Vec<QueueFigures>, StoreError> {
        self.timed("queue_figures", || async move {
            let client = self.conn().await?;
            let live = client.prepare_cached(sql::QUEUE_LIVE_COUNTS).await?;
            let tallies = client.prepare_cached(sql::QUEUE_TALLIES).await?;
            let settings = client.prepare_cached(sql::QUEUE_SETTINGS_LIST).await?;
            let filter: Option<Vec<&str>> = only.map(|q| vec![q.as_str()]);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&filter];
            let (live, tallies, settings) = tokio::try_join!(
                client.query(&live, &[]),
                client.query(&tallies, &[]),
                client.query(&settings, &params),
            )?;
            let mut by_queue: BTreeMap<String, QueueFigures> = BTreeMap::new();
            if let Some(q) = only {
                by_queue.insert(q.to_string(), QueueFigures::empty(q.clone()));
            }
            add_live(&mut by_queue, only, &live)?;
            add_tallies(&mut by_queue, only, &tallies)?;
            for row in &settings {
                let (queue, s) = settings_from_row(row)?;
                if let Some(f) = entry(&mut by_queue, only, queue.to_string())? {
                    f.settings = s;
                    f.endpoint_health = health_from_row(row)?;
                }
            }
            if detail {
                add_detail(&client, &mut by_queue).await?;
            }
            Ok(by_queue.into_values().collect())
        })
        .await
    }

    /// Reads `figures.queue`'s settings and endpoint health into `figures`
    /// (the defaults for a queue without settings): one row.
    pub async fn read_settings_into(&self, figures: &mut QueueFigures) -> Result<(), StoreError> {
        let queue = &figures.queue;
        (figures.settings, figures.endpoint_health) = self
            .timed("queue_settings_health", || async move {
                let client = self.conn().await?;
                let stmt = client.prepare_cached(sql::QUEUE_SETTINGS_LIST).await?;
                let only = vec![queue.as_str()];
                match client.query(&stmt, &[&only]).await?.first() {
                    Some(row) => Ok((settings_from_row(row)?.1, health_from_row(row)?)),
                    None => Ok(Default::default()),
                }
            })
            .await?;
        Ok(())
    }

    /// Row versions of the jobs table, live and dead, as PostgreSQL's
    /// statistics count them.
    pub async fn jobs_table_rows(&self) -> Result<i64, StoreError> {
        self.timed("jobs_table_rows", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::JOBS_TABLE_ROWS).await?;
            col(&client.query_one(&stmt, &[]).await?, "n")
        })
        .await
    }

    /// Settings of every queue that has any.
    pub async fn queue_settings(&self) -> Result<Vec<(QueueName, QueueSettings)>, StoreError> {
        self.timed("queue_settings", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::QUEUE_SETTINGS_LIST).await?;
            let none: Option<Vec<&str>> = None;
            client
                .query(&stmt, &[&none])
                .await?
                .iter()
                .map(settings_from_row)
                .collect()
        })
        .await
    }

    /// `queue`'s settings, if it has any.
    pub async fn queue_settings_of(&self, queue: &QueueName) -> Result<Option<QueueSettings>, StoreError> {
        self.timed("queue_settings", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::QUEUE_SETTINGS_LIST).await?;
            let only = Some(vec![queue.as_str()]);
            match client.query_opt(&stmt, &[&only]).await? {
                Some(row) => Ok(Some(settings_from_row(&row)?.1)),
                None => Ok(None),
            }
        })
        .await
    }

    /// Applies `change` to `queue`'s settings (creating them); answers the result.
    pub async fn update_queue_settings(
        &self,
        queue: &QueueName,
        change: &SettingsChange,
    ) -> Result<QueueSettings, StoreError> {
        self.timed("update_queue_settings", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::QUEUE_SETTINGS_UPDATE).await?;
            let rate = change.rate_limit.flatten();
            let endpoint = change.endpoint.clone().flatten();
            let new_secret = endpoint.as_ref().map(|_| crate::endpoint::sign::new_secret());
            let backoff = change.backoff.flatten().unwrap_or_default();
            let dead_letter = change.dead_letter_queue.clone().flatten();
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &queue.as_str(),
                        &change.paused,
                        &change.max_running.is_some(),
                        &change.max_running.flatten(),
                        &change.max_running_per_key.is_some(),
                        &change.max_running_per_key.flatten(),
                        &change.rate_limit.is_some(),
                        &rate.map(|r| r.per_s),
                        &rate.map(|r| r.burst),
                        &change.retention_done_ms.is_some(),
                        &change.retention_done_ms.flatten(),
                        &change.retention_failed_ms.is_some(),
                        &change.retention_failed_ms.flatten(),
                        &change.endpoint.is_some(),
                        &endpoint.as_ref().map(|e| e.url.as_str()),
                        &endpoint.as_ref().map(|e| e.timeout_ms),
                        &endpoint.as_ref().map(|e| e.concurrency),
                        &new_secret,
                        &change.max_attempts.is_some(),
                        &change.max_attempts.flatten(),
                        &change.backoff.is_some(),
                        &backoff.base_ms,
                        &backoff.max_ms,
                        &backoff.factor,
                        &backoff.jitter,
                        &change.retry_window_ms.is_some(),
                        &change.retry_window_ms.flatten(),
                        &change.dead_letter_queue.is_some(),
                        &dead_letter.as_ref().map(QueueName::as_str),
                    ],
                )
                .await?;
            let changed: Option<Vec<String>> = Some(vec![row.get("queue")]);
            let list = client.prepare_cached(sql::QUEUE_SETTINGS_LIST).await?;
            let row = client.query_one(&list, &[&changed]).await?;
            Ok(settings_from_row(&row)?.1)
        })
        .await
    }
}

impl Store {
    /// Rotates `queue`'s endpoint secret to `new`, the current one signing
    /// beside it for `window`; `None` when the queue has no secret (no
    /// endpoint was ever set).
    pub async fn rotate_endpoint_secret(
        &self,
        queue: &QueueName,
        new: &str,
        window: std::time::Duration,
    ) -> Result<Option<EndpointKeys>, StoreError> {
        self.timed("rotate_endpoint_secret", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::QUEUE_ENDPOINT_ROTATE).await?;
            let window_ms = crate::store::ms(window);
            match client
                .query_opt(&stmt, &[&queue.as_str(), &new, &window_ms])
                .await?
            {
                Some(row) => keys_from_row(&row),
                None => Ok(None),
            }
        })
        .await
    }

    /// Records what this coordinator saw of `queue`'s endpoint: a failure
    /// to connect (`failed`), or an answer after failures; `error` becomes
    /// its last error.
    pub async fn note_endpoint_health(
        &self,
        queue: &QueueName,
        failed: bool,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        self.timed("note_endpoint_health", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::QUEUE_ENDPOINT_HEALTH).await?;
            client.execute(&stmt, &[&queue.as_str(), &failed, &error]).await?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runlease_protocol::limits::THROUGHPUT_WINDOW_MS;

    #[test]
    fn the_throughput_statement_counts_the_window_the_protocol_names() {
        assert_eq!(THROUGHPUT_WINDOW_MS, 60_000);
        assert!(sql::QUEUE_THROUGHPUT.contains("now() - interval '1 minute'"));
    }
}
