//! Listing cursors (`GET /v1/jobs?cursor=`): `TokenKey::verify_cursor` on
//! any text and scope (input: `cursor`, a newline, then the scope; without
//! a newline the scope of an `emails` listing), and cursors minted for a job
//! id and a scope made of the input bytes.
//!
//! Invariants: a cursor that verifies is exactly what minting its job id
//! for that scope gives; a minted cursor verifies to its job id under its
//! scope only, under a rotation that keeps the secret, never under another
//! secret, and is never a lease token.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runlease_coordinator::token::{TokenError, TokenKey};
use runlease_protocol::{JobId, LeaseToken};
use uuid::Uuid;

const SECRET: &[u8] = b"fuzz secret: list cursors";
const OTHER: &[u8] = b"fuzz secret: another coordinator";
/// The scope the coordinator signs a listing of `emails`, every state, with.
const SCOPE: &str = "emails\0queued,enqueue_failed,running,done,failed,cancelled";

fuzz_target!(|data: &[u8]| {
    let key = TokenKey::new(SECRET);

    if let Ok(text) = std::str::from_utf8(data) {
        let (cursor, scope) = text.split_once('\n').unwrap_or((text, SCOPE));
        if let Ok(id) = key.verify_cursor(cursor, scope) {
            assert_eq!(key.mint_cursor(id, scope), cursor, "one spelling per cursor");
        }
    }

    if data.len() >= 16 {
        let id = JobId(Uuid::from_slice(&data[..16]).expect("16 bytes"));
        let scope = String::from_utf8_lossy(&data[16..]);
        let cursor = key.mint_cursor(id, &scope);
        assert_eq!(key.verify_cursor(&cursor, &scope), Ok(id));
        assert_eq!(
            key.verify_cursor(&cursor, &format!("{scope}x")),
            Err(TokenError::Forged),
            "a cursor is bound to its listing"
        );
        assert_eq!(
            TokenKey::new(OTHER).verify_cursor(&cursor, &scope),
            Err(TokenError::Forged)
        );
        assert_eq!(
            TokenKey::rotating(&[OTHER, SECRET]).verify_cursor(&cursor, &scope),
            Ok(id)
        );
        assert!(
            key.verify(&LeaseToken(cursor)).is_err(),
            "a cursor is no lease token"
        );
    }
});
