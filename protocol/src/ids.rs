//! Identifiers. Each is a newtype so a job id can never be passed as a lease.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

use crate::limits::{MAX_QUEUE_NAME_LEN, MAX_WORKER_ID_LEN};

/// A job's id: a UUIDv7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl JobId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// The fencing counter of a job: every claim increments it, nothing lowers it.
/// `(JobId, RunLease)` names one running attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunLease(pub i64);

impl fmt::Display for RunLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Error for a name (queue or worker id) that breaks the naming rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName(pub String);

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidName {}

fn check_name(kind: &str, s: &str, max: usize) -> Result<(), InvalidName> {
    if s.is_empty() || s.len() > max {
        return Err(InvalidName(format!("{kind} must be 1 to {max} bytes long")));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/' | b'@'))
    {
        return Err(InvalidName(format!(
            "{kind} may only contain ASCII letters, digits and _ - . : / @"
        )));
    }
    Ok(())
}

/// Who holds a lease: chosen by the worker, recorded on every attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct WorkerId(String);

impl WorkerId {
    /// Validates a worker id (1–128 bytes of ASCII letters, digits, `_-.:/@`).
    pub fn new(s: impl Into<String>) -> Result<Self, InvalidName> {
        let s = s.into();
        check_name("worker_id", &s, MAX_WORKER_ID_LEN)?;
        Ok(Self(s))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for WorkerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        WorkerId::new(s).map_err(serde::de::Error::custom)
    }
}

/// A queue's name (1–128 bytes of ASCII letters, digits, `_-.:/@`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct QueueName(String);

impl QueueName {
    /// Validates a queue name.
    pub fn new(s: impl Into<String>) -> Result<Self, InvalidName> {
        let s = s.into();
        check_name("queue", &s, MAX_QUEUE_NAME_LEN)?;
        Ok(Self(s))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for QueueName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        QueueName::new(s).map_err(serde::de::Error::custom)
    }
}

/// The opaque proof of a lease that a claim hands out. Workers pass it back
/// unchanged; only the coordinator that knows the secret can read or mint one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(pub String);

impl LeaseToken {
    /// The token as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(QueueName::new("emails").is_ok());
        assert!(QueueName::new("team/a:emails-v2.x@eu").is_ok());
        assert!(QueueName::new("").is_err());
        assert!(QueueName::new("has space").is_err());
        assert!(QueueName::new("x".repeat(129)).is_err());
        assert!(serde_json::from_str::<QueueName>("\"ok\"").is_ok());
        assert!(serde_json::from_str::<QueueName>("\"no way\"").is_err());
        assert!(WorkerId::new("lambda-1/abc").is_ok());
        assert!(WorkerId::new("é").is_err());
    }

    #[test]
    fn job_ids_sort_by_creation() {
        let a = JobId::new();
        let b = JobId::new();
        assert!(a < b);
        assert_eq!(a.to_string().parse::<JobId>().ok(), Some(a));
    }
}
