//! Request bodies: the input as the body of every JSON request the
//! coordinator reads, through the extractor's own `parse_json` (claim,
//! heartbeat, complete, fail, release, finish, enqueue, batch enqueue, bulk
//! actions, queue settings, schedules).
//!
//! Invariants: a body that parses, written back as JSON (as the client
//! crate sends it), parses again to an equal request; a body that is valid
//! JSON but not a valid request is refused as `invalid` (422), never as
//! `bad_request` (400, reserved for what is not JSON).
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use runlease_coordinator::http::extract::parse_json;
use runlease_protocol::ErrorCode;
use runlease_protocol::admin::{BulkJobsRequest, UpdateQueueRequest};
use runlease_protocol::producer::{EnqueueBatchRequest, EnqueueJobRequest};
use runlease_protocol::schedules::PutScheduleRequest;
use runlease_protocol::worker::{
    ClaimRequest, CompleteRequest, FailRequest, FinishRequest, HeartbeatRequest, ReleaseRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    let is_json = serde_json::from_slice::<serde_json::Value>(data).is_ok();
    body::<ClaimRequest>(data, is_json);
    body::<HeartbeatRequest>(data, is_json);
    body::<CompleteRequest>(data, is_json);
    body::<FailRequest>(data, is_json);
    body::<ReleaseRequest>(data, is_json);
    body::<FinishRequest>(data, is_json);
    body::<EnqueueJobRequest>(data, is_json);
    body::<EnqueueBatchRequest>(data, is_json);
    body::<BulkJobsRequest>(data, is_json);
    body::<UpdateQueueRequest>(data, is_json);
    body::<PutScheduleRequest>(data, is_json);
});

fn body<T: DeserializeOwned + Serialize + PartialEq + Debug>(data: &[u8], is_json: bool) {
    let name = std::any::type_name::<T>();
    match parse_json::<T>(data) {
        Ok(request) => {
            let written = serde_json::to_vec(&request).expect("a request serialises");
            let again = parse_json::<T>(&written).unwrap_or_else(|e| {
                panic!(
                    "{name} written back does not parse: {}\n{}",
                    e.message,
                    String::from_utf8_lossy(&written)
                )
            });
            assert_eq!(again, request, "{name} changes through JSON");
        }
        Err(error) if is_json => {
            assert_eq!(error.code, ErrorCode::Invalid, "{name}: {}", error.message);
        }
        Err(_) => {}
    }
}
