//! Lease tokens, as a worker sends them back on every heartbeat and finish:
//! `TokenKey::verify`, `verify_scoped` and `peek` on any text. The fuzzer
//! cannot forge a MAC, so the harness also signs the input bytes as a
//! token's payload (in both formats) to reach the parsing behind the MAC,
//! and mints tokens of leases made of the input bytes.
//!
//! Invariants: `verify` and `verify_scoped` agree; a token that verifies is
//! exactly what minting its claims gives (one spelling per lease), `peek`
//! reads the same job and run lease from it, another secret refuses it as
//! forged and a rotation that keeps this secret accepts it; a payload signed
//! under the key is never called forged; mint then verify gives back the
//! fields minted.
#![no_main]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use libfuzzer_sys::fuzz_target;
use runlease_coordinator::token::{TokenError, TokenKey};
use runlease_protocol::{JobId, LeaseToken, QueueName, RunLease, WorkerId};
use sha2::Sha256;
use uuid::Uuid;

const SECRET: &[u8] = b"fuzz secret: lease tokens";
const OTHER: &[u8] = b"fuzz secret: another coordinator";

/// The token formats: prefix and MAC domain tag (coordinator/src/token.rs).
/// If the format changes, the "never called forged" check below fails
/// until these follow it.
const FORMATS: [(&str, &[u8]); 2] = [
    ("rl2.", b"runlease lease token v2\0"),
    ("rl1.", b"runlease lease token v1\0"),
];

fuzz_target!(|data: &[u8]| {
    let key = TokenKey::new(SECRET);

    // The bytes as a token's text (a JSON string: always UTF-8).
    if let Ok(text) = std::str::from_utf8(data) {
        check(&key, &LeaseToken(text.to_owned()), false);
    }

    // The bytes as a payload signed with the key.
    for (prefix, domain) in FORMATS {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET).expect("HMAC takes any key");
        mac.update(domain);
        mac.update(data);
        let token = LeaseToken(format!(
            "{prefix}{}.{}",
            URL_SAFE_NO_PAD.encode(data),
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        ));
        check(&key, &token, true);
    }

    // A lease made of the bytes: 16 for the job id, 8 for the run lease,
    // then `queue worker`.
    if data.len() >= 24
        && let Ok(names) = std::str::from_utf8(&data[24..])
        && let Some((queue, worker)) = names.split_once(' ')
        && let (Ok(queue), Ok(worker)) = (QueueName::new(queue), WorkerId::new(worker))
    {
        let job_id = JobId(Uuid::from_slice(&data[..16]).expect("16 bytes"));
        let run_lease = RunLease(i64::from_be_bytes(data[16..24].try_into().expect("8 bytes")));
        let token = key.mint(job_id, run_lease, &worker, &queue);
        let claims = key.verify_scoped(&token).expect("a minted token verifies");
        assert_eq!(claims.lease.job_id, job_id);
        assert_eq!(claims.lease.run_lease, run_lease);
        assert_eq!(claims.lease.worker_id, worker);
        assert_eq!(claims.queue, Some(queue));
        check(&key, &token, true);
    }
});

fn check(key: &TokenKey, token: &LeaseToken, signed: bool) {
    let scoped = key.verify_scoped(token);
    assert_eq!(key.verify(token), scoped.clone().map(|claims| claims.lease));
    let peeked = key.peek(token);
    match scoped {
        Ok(claims) => {
            let lease = &claims.lease;
            assert_eq!(peeked, Some((lease.job_id, lease.run_lease)), "{token}");
            match &claims.queue {
                Some(queue) => assert_eq!(
                    key.mint(lease.job_id, lease.run_lease, &lease.worker_id, queue),
                    *token,
                    "a token that verifies is the one its claims mint"
                ),
                None => assert!(token.as_str().starts_with("rl1."), "{token}"),
            }
            assert_eq!(TokenKey::new(OTHER).verify_scoped(token), Err(TokenError::Forged));
            assert_eq!(
                TokenKey::rotating(&[OTHER, SECRET]).verify_scoped(token),
                Ok(claims)
            );
        }
        Err(error) => {
            if signed {
                assert_ne!(
                    error,
                    TokenError::Forged,
                    "a payload signed with the key: {token}"
                );
            }
        }
    }
}
