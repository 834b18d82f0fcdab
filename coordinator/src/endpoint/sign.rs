//! Signing a request as Standard Webhooks define it: the key is the
//! base64 after `whsec_`; the signature is `v1,` and the base64 of
//! HMAC-SHA256(key, `<webhook-id>.<webhook-timestamp>.<body>`), one per
//! live key, separated by spaces.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::store::queues::Secret;

/// What every secret starts with.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The key bytes of a secret (`None`: not a secret this coordinator made).
fn key_of(secret: &Secret) -> Option<Vec<u8>> {
    let b64 = secret.0.strip_prefix(SECRET_PREFIX).unwrap_or(&secret.0);
    STANDARD.decode(b64).ok()
}

/// The `webhook-signature` header of `body` sent as `id` at `timestamp`
/// (unix seconds), signed with each of `secrets`.
pub fn signature<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let signed_prefix = format!("{id}.{timestamp}.");
    secrets
        .into_iter()
        .filter_map(key_of)
        .filter_map(|key| <Hmac<Sha256> as KeyInit>::new_from_slice(&key).ok())
        .map(|mut mac| {
            mac.update(signed_prefix.as_bytes());
            mac.update(body);
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_secret_is_whsec_and_32_bytes() {
        let s = new_secret();
        assert!(s.starts_with("whsec_"));
        assert_eq!(key_of(&Secret(s.clone())).map(|k| k.len()), Some(32));
        assert_ne!(s, new_secret());
    }

    #[test]
    fn signs_as_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification's libraries.
        let secret = Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into());
        let body = br#"{"test": 2432232314}"#;
        let sig = signature([&secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let two = signature(
            [&secret, &secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
        );
        assert_eq!(two, format!("{sig} {sig}"));
    }
}
