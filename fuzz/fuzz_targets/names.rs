//! Names and ids a client sends in paths, bodies and queries:
//! `QueueName::new`, `WorkerId::new`, `JobId`'s `FromStr` (the `{id}` of a
//! path), the `FromStr` of `JobState`, `AttemptOutcome` and `FinishAction`,
//! on any text, and each as the JSON string a body carries.
//!
//! Invariants: a name that is accepted is kept byte for byte (`as_str`,
//! `Display`), is 1 to 128 bytes of the allowed characters, and queue names
//! and worker ids follow one rule; the JSON field accepts exactly what `new`
//! accepts; a job id prints as 36 lowercase characters that parse back to
//! it; a state, outcome or finish action that parses is its own wire name,
//! in `FromStr` and in JSON alike.
#![no_main]

use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use runlease_protocol::worker::FinishAction;
use runlease_protocol::{AttemptOutcome, JobId, JobState, QueueName, WorkerId};
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let json = serde_json::to_string(text).expect("a string serialises");

    let queue = QueueName::new(text);
    let worker = WorkerId::new(text);
    assert_eq!(
        queue.is_ok(),
        worker.is_ok(),
        "one rule for queue names and worker ids: {text:?}"
    );
    assert_eq!(from_json::<QueueName>(&json), queue.clone().ok());
    assert_eq!(from_json::<WorkerId>(&json), worker.clone().ok());
    if let (Ok(queue), Ok(worker)) = (queue, worker) {
        assert_eq!(queue.as_str(), text);
        assert_eq!(queue.to_string(), text);
        assert_eq!(worker.as_str(), text);
        assert_eq!(worker.to_string(), text);
        assert!((1..=128).contains(&text.len()), "{text:?}");
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:/@".contains(&b)),
            "{text:?}"
        );
    }

    if let Ok(id) = JobId::from_str(text) {
        let printed = id.to_string();
        assert_eq!(printed.len(), 36);
        assert!(!printed.bytes().any(|b| b.is_ascii_uppercase()), "{printed}");
        assert_eq!(printed.parse::<JobId>(), Ok(id));
        assert_eq!(
            from_json::<JobId>(&serde_json::to_string(&printed).expect("a string")),
            Some(id)
        );
    }

    let state = JobState::from_str(text).ok();
    assert_eq!(from_json::<JobState>(&json), state);
    if let Some(state) = state {
        assert_eq!(state.as_str(), text);
        assert_eq!(state.to_string(), text);
    }
    let outcome = AttemptOutcome::from_str(text).ok();
    assert_eq!(from_json::<AttemptOutcome>(&json), outcome);
    if let Some(outcome) = outcome {
        assert_eq!(outcome.as_str(), text);
    }
    let action = FinishAction::from_str(text).ok();
    assert_eq!(from_json::<FinishAction>(&json), action);
    if let Some(action) = action {
        assert_eq!(action.as_str(), text);
        assert_eq!(action.to_string(), text);
    }
});

fn from_json<T: DeserializeOwned>(json: &str) -> Option<T> {
    serde_json::from_str(json).ok()
}
