//! Bearer keys and roles. `RUNLEASE_API_KEYS` is a comma-separated list of
//! `role:key` or `role:key:queue|queue...`; the role is `producer`, `worker` or
//! `admin`; a queue list limits the key to those queues. With no keys the
//! coordinator serves everyone, but only on a loopback address.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

use runlease_protocol::QueueName;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Enqueue, read, cancel, list queues and jobs.
    Producer,
    /// Claim, heartbeat, finish, read.
    Worker,
    /// Everything, including admin retry, bulk actions and queue settings.
    Admin,
}

/// An action that needs a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Enqueue jobs.
    Enqueue,
    /// Read a job or the queue list.
    Read,
    /// Cancel a job.
    Cancel,
    /// Put a failed or cancelled job back (admin only).
    Retry,
    /// Claim, heartbeat, complete, fail, release, finish.
    Work,
    /// List a queue's jobs.
    List,
    /// Retry, cancel or delete many jobs at once (admin only).
    Bulk,
    /// Change a queue's settings: pause, limits, retention (admin only).
    Configure,
}

impl Role {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "producer" => Some(Role::Producer),
            "worker" => Some(Role::Worker),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The role's name in `RUNLEASE_API_KEYS` and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may perform `action`.
    pub fn allows(self, action: Action) -> bool {
        match self {
            Role::Admin => true,
            Role::Producer => matches!(
                action,
                Action::Enqueue | Action::Read | Action::Cancel | Action::List
            ),
            Role::Worker => matches!(action, Action::Work | Action::Read),
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The key's role.
    pub role: Role,
    /// The queues the key is limited to; `None` for all.
    pub queues: Option<HashSet<String>>,
    /// Which key this is, for limits counted per key (the open caller is
    /// [`KeyId::OPEN`]).
    pub key: KeyId,
}

/// A configured API key's number in `RUNLEASE_API_KEYS` (never the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub u32);

impl KeyId {
    /// Every caller when no keys are configured.
    pub const OPEN: KeyId = KeyId(u32::MAX);
}

impl Caller {
    /// The caller when no keys are configured (loopback only).
    pub fn open() -> Self {
        Self {
            role: Role::Admin,
            queues: None,
            key: KeyId::OPEN,
        }
    }

    /// Whether the caller may touch `queue`.
    pub fn may_use_queue(&self, queue: &QueueName) -> bool {
        self.queues.as_ref().is_none_or(|qs| qs.contains(queue.as_str()))
    }
}

/// The configured keys, stored by SHA-256 so a lookup does not compare
/// secrets byte by byte.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    by_hash: HashMap<[u8; 32], Caller>,
}

fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Parses `RUNLEASE_API_KEYS`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut by_hash = HashMap::new();
        for (n, entry) in spec
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .enumerate()
        {
            let mut parts = entry.splitn(3, ':');
            let role = parts.next().unwrap_or_default();
            let role = Role::parse(role).ok_or_else(|| {
                format!("RUNLEASE_API_KEYS: unknown role {role:?}; use producer, worker or admin (entry form role:key[:queue|queue])")
            })?;
            let key = parts.next().unwrap_or_default();
            if key.len() < 16 {
                return Err(format!(
                    "RUNLEASE_API_KEYS: the {role:?} key must be at least 16 characters (entry form role:key[:queue|queue])"
                ));
            }
            let queues = match parts.next() {
                None => None,
                Some(list) => {
                    let mut set = HashSet::new();
                    for q in list.split('|') {
                        let q = QueueName::new(q).map_err(|e| format!("RUNLEASE_API_KEYS: {e}"))?;
                        set.insert(q.as_str().to_owned());
                    }
                    Some(set)
                }
            };
            let id = KeyId(u32::try_from(n).map_err(|_| "RUNLEASE_API_KEYS: too many keys".to_owned())?);
            if by_hash
                .insert(
                    hash(key),
                    Caller {
                        role,
                        queues,
                        key: id,
                    },
                )
                .is_some()
            {
                return Err("RUNLEASE_API_KEYS: a key appears twice".into());
            }
        }
        Ok(Self { by_hash })
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The caller a bearer key belongs to.
    pub fn lookup(&self, key: &str) -> Option<&Caller> {
        self.by_hash.get(&hash(key))
    }

    /// Whether a request with these fields may have its body read: no key
    /// is needed, or it names a configured one. A body sent without one is
    /// not read, so a client without a key cannot make the coordinator
    /// hold bodies (its request is answered 401 as before).
    pub fn admits(&self, fields: &axum::http::HeaderMap) -> bool {
        self.is_empty()
            || fields
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer)
                .is_some_and(|key| self.lookup(key).is_some())
    }
}

/// The key of an `Authorization` value `Bearer <key>`.
pub fn bearer(value: &str) -> Option<&str> {
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_with_roles_and_queues() {
        let keys = ApiKeys::parse(
            "producer:pppppppppppppppp, worker:wwwwwwwwwwwwwwww:emails|reports,admin:aaaaaaaaaaaaaaaa",
        )
        .unwrap();
        let w = keys.lookup("wwwwwwwwwwwwwwww").unwrap();
        assert_eq!(w.role, Role::Worker);
        assert!(w.may_use_queue(&QueueName::new("emails").unwrap()));
        assert!(!w.may_use_queue(&QueueName::new("billing").unwrap()));
        assert!(keys.lookup("nope").is_none());
        assert!(Role::Producer.allows(Action::Enqueue));
        assert!(!Role::Producer.allows(Action::Work));
        assert!(!Role::Worker.allows(Action::Retry));
        assert!(Role::Admin.allows(Action::Retry));
    }

    #[test]
    fn bad_key_specs_are_refused() {
        assert!(ApiKeys::parse("boss:aaaaaaaaaaaaaaaa").is_err());
        assert!(ApiKeys::parse("admin:short").is_err());
        assert!(ApiKeys::parse("admin:aaaaaaaaaaaaaaaa,worker:aaaaaaaaaaaaaaaa").is_err());
        assert!(ApiKeys::parse("worker:aaaaaaaaaaaaaaaa:bad queue").is_err());
        assert!(ApiKeys::parse("").unwrap().is_empty());
    }
}
