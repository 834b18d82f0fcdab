//! Fencing: a stale, forged or repeated finish can never change a job it does
//! not own, and concurrent claimers never share a lease.

use std::collections::HashSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use runlease_protocol::worker::Lease;
use runlease_protocol::{AttemptOutcome, Job, JobState, LeaseToken, RunLease};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

#[tokio::test]
async fn late_complete_after_reap_is_rejected_and_the_new_attempt_stands() {
    let db = TestDb::new().await;
    // The real reaper loop, with a short TTL.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.ttl = std::time::Duration::from_millis(300);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(100);
        cfg.leases.reaper_interval = std::time::Duration::from_millis(50);
    })
    .await;
    let created = c.api.enqueue("q", json!("work")).await;
    let slow = c.api.claim_one("q", "slow-worker").await;

    // The slow worker stops heartbeating; the reaper re-queues; another worker claims.
    let mut fresh = None;
    for _ in 0..100 {
        let leases = c.api.claim_wait("q", "fast-worker", 1, 200).await;
        if let Some(lease) = leases.into_iter().next() {
            fresh = Some(lease);
            break;
        }
    }
    let fresh = fresh.expect("the reaper re-queued the expired job");
    assert_eq!(fresh.job_id, created.id);
    assert_eq!(fresh.run_lease, RunLease(2));

    let (status, body) = c.api.complete(&fresh, json!("new result")).await;
    assert_eq!(status, 200, "{body}");

    // The slow worker finally answers: 409, and nothing changes.
    let before = c.api.job(created.id).await;
    let (status, body) = c.api.complete(&slow, json!("stale result")).await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "lease_lost");
    let (status, _) = c.api.fail(&slow, "stale failure", true, None).await;
    assert_eq!(status, 409);
    let (status, _) = c.api.release(&slow, None).await;
    assert_eq!(status, 409);
    assert_eq!(c.api.heartbeat(&slow).await, "lease_lost");
    let after = c.api.job(created.id).await;
    assert_eq!(after, before);
    assert_eq!(after.state, JobState::Done);
    assert_eq!(after.result, Some(json!("new result")));
    let outcomes: Vec<_> = after.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            Some(AttemptOutcome::LeaseExpired),
            Some(AttemptOutcome::Completed)
        ]
    );

    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        metrics.contains("runlease_lease_lost_total{action=\"complete\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runlease_leases_expired_total{queue=\"q\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn racing_claimers_never_share_a_lease_and_every_job_is_done_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| cfg.database.pool_size = 10).await;
    let jobs: Vec<_> = (0..1000)
        .map(|i| json!({"queue": "race", "payload": i}))
        .collect();
    for chunk in jobs.chunks(500) {
        let (status, _) = c.api.post("/v1/jobs/batch", &json!({"jobs": chunk})).await;
        assert_eq!(status, 201);
    }
    let mut workers = Vec::new();
    for w in 0..8 {
        let api = c.api.clone();
        workers.push(tokio::spawn(async move {
            let mut seen: Vec<(uuid::Uuid, i64)> = Vec::new();
            loop {
                let leases = api.claim("race", &format!("w{w}"), 7).await;
                if leases.is_empty() {
                    return seen;
                }
                for lease in leases {
                    seen.push((lease.job_id.0, lease.run_lease.0));
                    let (status, body) = api.complete(&lease, json!({"by": w})).await;
                    assert_eq!(status, 200, "{body}");
                }
            }
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().copied().collect();
    assert_eq!(
        unique.len(),
        all.len(),
        "a (job_id, run_lease) was handed out twice"
    );
    let jobs: HashSet<_> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(jobs.len(), 1000);

    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*), max(run_lease) FROM jobs",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)),
        (1000, 1000, 1)
    );
    let completed: i64 = client
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'completed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(completed, 1000, "every job completed exactly once");
}

fn altered(token: &LeaseToken, tamper: impl FnOnce(&mut Vec<u8>)) -> LeaseToken {
    let (version, rest) = token.0.split_once('.').unwrap();
    let (payload, mac) = rest.split_once('.').unwrap();
    let mut bytes = URL_SAFE_NO_PAD.decode(payload).unwrap();
    tamper(&mut bytes);
    LeaseToken(format!("{version}.{}.{mac}", URL_SAFE_NO_PAD.encode(bytes)))
}

#[tokio::test]
async fn a_forged_token_changes_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let victim = c.api.enqueue("q", json!("victim")).await;
    let other = c.api.enqueue("q", json!("other")).await;
    let lease = c.api.claim_one("q", "honest").await;
    assert_eq!(lease.job_id, victim.id);
    let mine = c.api.claim_one("q", "attacker").await;
    assert_eq!(mine.job_id, other.id);
    let before = c.api.job(victim.id).await;

    // 1. The attacker's own valid token, edited to point at the victim's job.
    let retargeted = altered(&mine.lease_token, |b| {
        b[..16].copy_from_slice(victim.id.0.as_bytes())
    });
    // 2. The victim's token with the lease bumped.
    let bumped = altered(&lease.lease_token, |b| b[23] ^= 1);
    // 3. A token minted under another secret.
    let foreign = runlease_coordinator::token::TokenKey::new(b"guessed secret").mint(
        victim.id,
        lease.run_lease,
        &runlease_protocol::WorkerId::new("honest").unwrap(),
        &runlease_protocol::QueueName::new("q").unwrap(),
    );
    for token in [retargeted, bumped, foreign] {
        let forged = Lease {
            lease_token: token.clone(),
            ..lease.clone()
        };
        let (status, body) = c.api.complete(&forged, json!("pwned")).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (409, Some("lease_lost")),
            "{body}"
        );
        let (status, _) = c.api.fail(&forged, "pwned", false, None).await;
        assert_eq!(status, 409);
        let (status, _) = c.api.release(&forged, None).await;
        assert_eq!(status, 409);
        assert_eq!(c.api.heartbeat(&forged).await, "lease_lost");
        let (status, body) = c
            .api
            .post(
                "/v1/finish",
                &json!({"items": [{"lease_token": token, "action": "complete"}]}),
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(body["items"][0]["status"], "lease_lost");
        assert_eq!(
            body["items"][0]["state"],
            json!(null),
            "a forged token learns nothing"
        );
    }
    // Garbage is refused as a bad request, also before PostgreSQL.
    let garbage = Lease {
        lease_token: LeaseToken("not-a-token".into()),
        ..lease.clone()
    };
    let (status, body) = c.api.complete(&garbage, json!("pwned")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );

    let after = c.api.job(victim.id).await;
    assert_eq!(after, before, "the victim's job is untouched");
    let (status, _) = c.api.complete(&lease, json!("legit")).await;
    assert_eq!(status, 200, "the honest worker's lease still works");

    let (_, metrics) = c.api.get_text("/metrics").await;
    let forged: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("runlease_forged_tokens_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(forged, 16.0, "15 forged uses and one malformed token are counted");
}

#[tokio::test]
async fn a_repeated_finish_with_the_same_token_answers_200_as_it_was_left() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    let (s1, first) = c.api.complete(&lease, json!("r")).await;
    let (s2, second) = c.api.complete(&lease, json!("r")).await;
    assert_eq!((s1, s2), (200, 200));
    let (first, second): (Job, Job) = (
        serde_json::from_value(first).unwrap(),
        serde_json::from_value(second).unwrap(),
    );
    assert_eq!(first, second);
    assert_eq!(crate::attempts_with(&db, created.id.0, "completed").await, 1);

    // A fail after the complete is not the same outcome: 409.
    let (status, _) = c.api.fail(&lease, "late", true, None).await;
    assert_eq!(status, 409);

    // Repeated fail and release are idempotent too.
    let f = c.api.enqueue("q", json!(2)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(lease.job_id, f.id);
    assert_eq!(c.api.fail(&lease, "x", true, Some(3_600_000)).await.0, 200);
    assert_eq!(c.api.fail(&lease, "x", true, Some(3_600_000)).await.0, 200);
    assert_eq!(crate::attempts_with(&db, f.id.0, "failed").await, 1);
    let r = c.api.enqueue("q", json!(3)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(lease.job_id, r.id);
    assert_eq!(c.api.release(&lease, None).await.0, 200);
    assert_eq!(c.api.release(&lease, None).await.0, 200);
    assert_eq!(
        c.api.job(r.id).await.attempt,
        0,
        "a repeated release gives back one attempt, not two"
    );
}

#[tokio::test]
async fn finish_answers_each_item_on_its_own_in_order() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for i in 0..3 {
        c.api.enqueue("q", json!(i)).await;
    }
    let leases = c.api.claim("q", "w", 3).await;
    assert_eq!(leases.len(), 3);
    // The first lease goes stale: released, claimed again by someone else.
    c.api.release(&leases[0], None).await;
    let _thief = c.api.claim_one("q", "other").await;
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [
                {"lease_token": leases[0].lease_token, "action": "complete", "result": 0},
                {"lease_token": leases[1].lease_token, "action": "fail", "error": "nope", "retryable": false},
                {"lease_token": leases[2].lease_token, "action": "complete", "result": 2},
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let items = body["items"].as_array().unwrap();
    assert_eq!(items[0]["status"], "lease_lost");
    assert_eq!(items[0]["state"], "running");
    assert_eq!(items[0]["job_id"], json!(leases[0].job_id));
    assert_eq!(
        (items[1]["status"].as_str(), items[1]["state"].as_str()),
        (Some("ok"), Some("failed"))
    );
    assert_eq!(
        (items[2]["status"].as_str(), items[2]["state"].as_str()),
        (Some("ok"), Some("done"))
    );

    // A value PostgreSQL cannot store refuses the whole request before any write.
    let a = c.api.enqueue("q", json!("a")).await;
    let b = c.api.enqueue("q", json!("b")).await;
    let leases = c.api.claim("q", "w", 2).await;
    assert_eq!(leases.len(), 2);
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [
                {"lease_token": leases[0].lease_token, "action": "complete", "result": "fine"},
                {"lease_token": leases[1].lease_token, "action": "complete", "result": {"k": "nul \u{0000}"}},
            ]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().starts_with("items[1]"),
        "{body}"
    );
    assert_eq!(c.api.job(a.id).await.state, JobState::Running);
    assert_eq!(c.api.job(b.id).await.state, JobState::Running);

    // A fail without an error refuses the whole request before any write.
    let more = c.api.enqueue("q", json!(9)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(lease.job_id, more.id);
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [{"lease_token": lease.lease_token, "action": "fail"}]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(c.api.job(more.id).await.state, JobState::Running);
}
