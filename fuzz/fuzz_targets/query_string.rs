//! Query strings: the input as the query of `GET /v1/jobs` (listing),
//! `GET /v1/jobs/{id}` (`wait_ms`) and `GET /v1/jobs/{id}/attempts`, parsed
//! as axum's `Query` extractor does (serde_urlencoded); a listing's `state`
//! list as the handler splits it.
//!
//! Invariants: a query that parses, written back as a query string, parses
//! to an equal query; each name of a `state` list that parses is that
//! state's own name.
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use runlease_protocol::JobState;
use runlease_protocol::admin::ListJobsQuery;
use runlease_protocol::producer::{GetJobQuery, ListAttemptsQuery};
use serde::Serialize;
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    if let Some(list) = query::<ListJobsQuery>(data)
        && let Some(states) = list.state
    {
        for name in states.split(',').map(str::trim) {
            if let Ok(state) = name.parse::<JobState>() {
                assert_eq!(state.as_str(), name);
            }
        }
    }
    query::<GetJobQuery>(data);
    query::<ListAttemptsQuery>(data);
});

fn query<T: DeserializeOwned + Serialize + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let name = std::any::type_name::<T>();
    let parsed = serde_urlencoded::from_bytes::<T>(data).ok()?;
    let written = serde_urlencoded::to_string(&parsed).expect("a query serialises");
    let again = serde_urlencoded::from_str::<T>(&written)
        .unwrap_or_else(|e| panic!("{name} written back does not parse: {e}\n{written}"));
    assert_eq!(again, parsed, "{name} changes through a query string");
    Some(parsed)
}
