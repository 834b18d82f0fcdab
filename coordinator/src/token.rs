//! Lease tokens: `rl2.<payload>.<mac>`, both parts base64url without padding.
//! The payload is the job id (16 bytes), the run lease (8 bytes, big-endian),
//! the job's queue (a length byte, then UTF-8) and the worker id (UTF-8); the MAC is HMAC-SHA256 under `RUNLEASE_SECRET`
//! over a domain tag and the payload. A token is checked before any database
//! work, so a forged or altered one costs a hash, not a query.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use runlease_protocol::{JobId, LeaseToken, QueueName, RunLease, WorkerId};
use sha2::Sha256;
use uuid::Uuid;

use crate::store::leases::LeaseRef;

const PREFIX: &str = "rl2.";
const DOMAIN: &[u8] = b"runlease lease token v2\0";
/// Tokens minted before they carried the queue: still verified, so leases
/// running across an upgrade finish; only a key without queue limits may
/// use them.
const PREFIX_V1: &str = "rl1.";
const DOMAIN_V1: &[u8] = b"runlease lease token v1\0";
const CURSOR_DOMAIN: &[u8] = b"runlease list cursor v1\0";
/// MAC bytes a cursor carries: forging one is as hard as guessing 2^128.
const CURSOR_MAC_LEN: usize = 16;
/// Longest token we bother decoding (a 128-byte worker id gives about 260).
const MAX_TOKEN_LEN: usize = 512;

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not shaped like a runlease token at all.
    #[error("lease_token is not a runlease lease token; pass the lease_token a claim returned, unchanged")]
    Malformed,
    /// Shaped right, but its MAC does not verify: forged, altered, or minted
    /// under another secret.
    #[error("lease_token does not verify: it was altered, forged, or minted under another RUNLEASE_SECRET")]
    Forged,
}

/// Mints and verifies lease tokens. It may hold several keys: the first
/// signs, every one verifies, so a key is rotated (new key first, old one
/// kept until the leases it signed are over) without refusing running leases.
#[derive(Clone)]
pub struct TokenKey {
    mac: Hmac<Sha256>,
    /// Every key, the signing one first.
    verifiers: Vec<Hmac<Sha256>>,
    /// Mint `rl1.` tokens (without the queue), which coordinators older
    /// than v1.2 verify: for a rolling upgrade (`RUNLEASE_LEASE_TOKEN_VERSION=1`).
    mint_v1: bool,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from the secret's bytes.
    pub fn new(secret: &[u8]) -> Self {
        Self::rotating(&[secret])
    }

    /// Keys from several secrets: the first signs, every one verifies.
    /// `secrets` must not be empty.
    pub fn rotating(secrets: &[&[u8]]) -> Self {
        // HMAC accepts keys of any length.
        let verifiers: Vec<Hmac<Sha256>> = secrets
            .iter()
            .map(|s| {
                <Hmac<Sha256> as KeyInit>::new_from_slice(s)
                    .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
            })
            .collect();
        let mac = verifiers
            .first()
            .cloned()
            .unwrap_or_else(|| unreachable!("TokenKey::rotating needs at least one secret"));
        Self {
            mac,
            verifiers,
            mint_v1: false,
        }
    }

    /// The same key, minting tokens of `version` (1: `rl1.`, which older
    /// coordinators verify; 2: `rl2.`, which names the queue).
    pub fn minting(self, version: u8) -> Self {
        Self {
            mint_v1: version == 1,
            ..self
        }
    }

    /// Whether this key mints `rl1.` tokens (a rolling upgrade is under way).
    pub fn mints_v1(&self) -> bool {
        self.mint_v1
    }

    fn tag(&self, domain: &[u8], payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(domain);
        mac.update(payload);
        mac
    }

    /// A listing cursor: the last job id of a page, signed together with
    /// the listing's `scope` (its filter), so a cursor is only accepted by
    /// the listing that issued it.
    pub fn mint_cursor(&self, last: JobId, scope: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(CURSOR_DOMAIN);
        mac.update(last.0.as_bytes());
        mac.update(scope.as_bytes());
        let tag = mac.finalize().into_bytes();
        let mut raw = Vec::with_capacity(16 + CURSOR_MAC_LEN);
        raw.extend_from_slice(last.0.as_bytes());
        raw.extend_from_slice(&tag[..CURSOR_MAC_LEN]);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// The job id of a cursor [`TokenKey::mint_cursor`] issued for `scope`.
    pub fn verify_cursor(&self, cursor: &str, scope: &str) -> Result<JobId, TokenError> {
        if cursor.len() > 64 {
            return Err(TokenError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| TokenError::Malformed)?;
        if raw.len() != 16 + CURSOR_MAC_LEN {
            return Err(TokenError::Malformed);
        }
        let (id, tag) = raw.split_at(16);
        let verified = self.verifiers.iter().any(|key| {
            let mut mac = key.clone();
            mac.update(CURSOR_DOMAIN);
            mac.update(id);
            mac.update(scope.as_bytes());
            mac.verify_truncated_left(tag).is_ok()
        });
        if !verified {
            return Err(TokenError::Forged);
        }
        let id = Uuid::from_slice(id).map_err(|_| TokenError::Malformed)?;
        Ok(JobId(id))
    }

    /// The token for a lease of a job of `queue`.
    pub fn mint(
        &self,
        job_id: JobId,
        run_lease: RunLease,
        worker_id: &WorkerId,
        queue: &QueueName,
    ) -> LeaseToken {
        let queue = queue.as_str().as_bytes();
        let worker = worker_id.as_str().as_bytes();
        let mut payload = Vec::with_capacity(25 + queue.len() + worker.len());
        payload.extend_from_slice(job_id.0.as_bytes());
        payload.extend_from_slice(&run_lease.0.to_be_bytes());
        let (prefix, domain) = if self.mint_v1 {
            (PREFIX_V1, DOMAIN_V1)
        } else {
            // Queue names are at most 128 bytes: one length byte.
            payload.push(u8::try_from(queue.len()).unwrap_or(u8::MAX));
            payload.extend_from_slice(queue);
            (PREFIX, DOMAIN)
        };
        payload.extend_from_slice(worker);
        let mac = self.tag(domain, &payload).finalize().into_bytes();
        LeaseToken(format!(
            "{prefix}{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(mac)
        ))
    }

    /// Reads and verifies a token: its lease.
    pub fn verify(&self, token: &LeaseToken) -> Result<LeaseRef, TokenError> {
        self.verify_scoped(token).map(|t| t.lease)
    }

    /// Reads and verifies a token: its lease and the queue of its job (a
    /// token minted before tokens carried the queue has none).
    pub fn verify_scoped(&self, token: &LeaseToken) -> Result<TokenClaims, TokenError> {
        let text = token.as_str();
        if text.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed);
        }
        let (domain, rest) = if let Some(rest) = text.strip_prefix(PREFIX) {
            (DOMAIN, rest)
        } else if let Some(rest) = text.strip_prefix(PREFIX_V1) {
            (DOMAIN_V1, rest)
        } else {
            return Err(TokenError::Malformed);
        };
        let (payload, mac) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)?;
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| TokenError::Malformed)?;
        if payload.len() <= 24 || mac.len() != 32 {
            return Err(TokenError::Malformed);
        }
        let verified = self.verifiers.iter().any(|key| {
            let mut tag = key.clone();
            tag.update(domain);
            tag.update(&payload);
            tag.verify_slice(&mac).is_ok()
        });
        if !verified {
            return Err(TokenError::Forged);
        }
        let job_id = Uuid::from_slice(&payload[..16]).map_err(|_| TokenError::Malformed)?;
        let mut lease = [0u8; 8];
        lease.copy_from_slice(&payload[16..24]);
        let (queue, worker) = if domain == DOMAIN {
            let len = usize::from(payload[24]);
            let queue = payload.get(25..25 + len).ok_or(TokenError::Malformed)?;
            let queue = std::str::from_utf8(queue).map_err(|_| TokenError::Malformed)?;
            let queue = QueueName::new(queue).map_err(|_| TokenError::Malformed)?;
            (Some(queue), &payload[25 + len..])
        } else {
            (None, &payload[24..])
        };
        let worker = std::str::from_utf8(worker).map_err(|_| TokenError::Malformed)?;
        let worker_id = WorkerId::new(worker).map_err(|_| TokenError::Malformed)?;
        Ok(TokenClaims {
            lease: LeaseRef {
                job_id: JobId(job_id),
                run_lease: RunLease(i64::from_be_bytes(lease)),
                worker_id,
            },
            queue,
        })
    }
}

/// What a verified lease token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    /// The lease.
    pub lease: LeaseRef,
    /// The queue of the job; `None` in a token minted before tokens carried it.
    pub queue: Option<QueueName>,
}

impl TokenKey {
    /// What a well-formed token *claims* to be, unverified: only for echoing
    /// it back in a per-item `lease_lost` answer, never for a decision.
    pub fn peek(&self, token: &LeaseToken) -> Option<(JobId, RunLease)> {
        let text = token.as_str();
        let rest = text
            .strip_prefix(PREFIX)
            .or_else(|| text.strip_prefix(PREFIX_V1))?;
        let (payload, _) = rest.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        if payload.len() <= 24 {
            return None;
        }
        let job_id = Uuid::from_slice(&payload[..16]).ok()?;
        let mut lease = [0u8; 8];
        lease.copy_from_slice(&payload[16..24]);
        Some((JobId(job_id), RunLease(i64::from_be_bytes(lease))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> WorkerId {
        WorkerId::new("w-1").unwrap()
    }

    fn queue() -> QueueName {
        QueueName::new("emails").unwrap()
    }

    #[test]
    fn a_token_carries_its_job_s_queue() {
        let key = TokenKey::new(b"secret");
        let token = key.mint(JobId::new(), RunLease(3), &worker(), &queue());
        assert_eq!(key.verify_scoped(&token).unwrap().queue, Some(queue()));
        // The longest queue and worker names fit in a token.
        let long_queue = QueueName::new("q".repeat(128)).unwrap();
        let long_worker = WorkerId::new("w".repeat(128)).unwrap();
        let token = key.mint(JobId::new(), RunLease(i64::MAX), &long_worker, &long_queue);
        let claims = key.verify_scoped(&token).unwrap();
        assert_eq!(
            (claims.queue, claims.lease.worker_id),
            (Some(long_queue), long_worker)
        );
    }

    #[test]
    fn a_token_minted_before_tokens_carried_the_queue_still_verifies() {
        let key = TokenKey::new(b"secret");
        let id = JobId::new();
        let mut payload = id.0.as_bytes().to_vec();
        payload.extend_from_slice(&9i64.to_be_bytes());
        payload.extend_from_slice(b"w-1");
        let mac = key.tag(DOMAIN_V1, &payload).finalize().into_bytes();
        let old = LeaseToken(format!(
            "{PREFIX_V1}{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(mac)
        ));
        let claims = key.verify_scoped(&old).unwrap();
        assert_eq!(claims.queue, None);
        assert_eq!((claims.lease.job_id, claims.lease.run_lease), (id, RunLease(9)));
        assert_eq!(key.peek(&old), Some((id, RunLease(9))));
        // The key minting v1 tokens mints what this test built by hand.
        let v1 = TokenKey::new(b"secret").minting(1);
        assert_eq!(v1.mint(id, RunLease(9), &worker(), &queue()), old);
        // A v1 MAC does not verify a v2 token of the same bytes, nor the reverse.
        let swapped = LeaseToken(old.0.replacen(PREFIX_V1, PREFIX, 1));
        assert!(key.verify(&swapped).is_err());
    }

    #[test]
    fn a_minted_token_verifies_to_its_lease() {
        let key = TokenKey::new(b"secret");
        let id = JobId::new();
        let token = key.mint(id, RunLease(7), &worker(), &queue());
        let lease = key.verify(&token).unwrap();
        assert_eq!(lease.job_id, id);
        assert_eq!(lease.run_lease, RunLease(7));
        assert_eq!(lease.worker_id, worker());
    }

    #[test]
    fn altered_or_foreign_tokens_are_refused() {
        let key = TokenKey::new(b"secret");
        let other = TokenKey::new(b"other secret");
        let id = JobId::new();
        let token = key.mint(id, RunLease(1), &worker(), &queue());
        assert_eq!(other.verify(&token), Err(TokenError::Forged));

        // Raise the run lease inside the payload, keep the MAC.
        let (payload, mac) = token.0[PREFIX.len()..].split_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(payload).unwrap();
        bytes[23] ^= 1;
        let altered = LeaseToken(format!("{PREFIX}{}.{mac}", URL_SAFE_NO_PAD.encode(&bytes)));
        assert_eq!(key.verify(&altered), Err(TokenError::Forged));

        // A token for another job id, with a MAC made under a guessed key.
        let guessed = other.mint(id, RunLease(2), &worker(), &queue());
        assert_eq!(key.verify(&guessed), Err(TokenError::Forged));

        for junk in ["", "rl1.", "rl1.abc", "rl1.!!.??", "xyz.aa.bb", &"a".repeat(600)] {
            assert_eq!(
                key.verify(&LeaseToken(junk.into())),
                Err(TokenError::Malformed),
                "{junk}"
            );
        }
    }
}
