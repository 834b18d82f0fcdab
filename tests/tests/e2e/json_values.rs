//! Every JSON value the protocol accepts comes back from PostgreSQL as sent:
//! `jsonb` prints numbers in full (`1.79e308` as 309 digits), and reading
//! them back must not fail, or the job becomes unreadable (schemathesis found
//! this: a heartbeat's `progress` near `f64::MAX` made the job's release,
//! every later claim and every read answer 500).

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

/// Numbers at the edges of `f64`, which `jsonb` stores as exact decimals.
fn extremes() -> Value {
    json!([
        f64::MAX,
        -f64::MAX,
        1.797_693_134_862_315_5e308,
        f64::MIN_POSITIVE,
        5e-324,
        4.753_591_877_163_667e16,
        u64::MAX,
        i64::MIN,
        0.1,
    ])
}

/// Equal as numbers: `jsonb` keeps the value, not the spelling, so a float
/// with an integral value (`4.753591877163667e16`) comes back as an integer.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)),
        (Value::Number(x), Value::Number(y)) => {
            x == y || ((x.is_f64() || y.is_f64()) && x.as_f64() == y.as_f64())
        }
        _ => a == b,
    }
}

#[track_caller]
fn assert_same(got: &Value, want: &Value) {
    assert!(same(got, want), "got {got}, want {want}");
}

#[tokio::test]
async fn numbers_at_the_edges_of_f64_survive_payload_progress_and_result() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let values = extremes();

    let job = c.api.enqueue("edges", values.clone()).await;
    assert_same(&job.payload, &values);

    let lease = c.api.claim_one("edges", "w").await;
    assert_same(&lease.payload, &values);
    let (status, body) = c
        .api
        .post(
            "/v1/heartbeat",
            &json!({"leases": [{"lease_token": lease.lease_token, "progress": values}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.api.release(&lease, None).await;
    assert_eq!(status, 200, "{body}");
    assert_same(&body["progress"], &values);

    let lease = c.api.claim_one("edges", "w").await;
    assert_same(lease.progress.as_ref().unwrap(), &values);
    let (status, body) = c.api.complete(&lease, values.clone()).await;
    assert_eq!(status, 200, "{body}");
    let done = c.api.job(job.id).await;
    assert_same(done.result.as_ref().unwrap(), &values);
    assert_same(done.progress.as_ref().unwrap(), &values);
    c.stop().await.unwrap();
}
