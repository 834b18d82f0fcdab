//! Cron schedules: one job per fire time whatever the number of
//! coordinators; only the latest missed fire after an outage; paused ones
//! enqueue nothing; bad expressions and time zones are refused.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use runlease_coordinator::metrics::Metrics;
use runlease_coordinator::scheduler::Scheduler;
use runlease_tests::{CoordinatorProcess, TestCoordinator, TestDb};
use serde_json::json;

async fn fire_times(db: &TestDb, name: &str) -> Vec<DateTime<Utc>> {
    let client = db.client().await;
    let prefix = format!("schedule:{name}:");
    let rows = client
        .query(
            "SELECT substr(idempotency_key, length($1) + 1) FROM jobs
             WHERE idempotency_key LIKE $1 || '%' ORDER BY 1",
            &[&prefix],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            DateTime::parse_from_rfc3339(&r.get::<_, String>(0))
                .unwrap()
                .with_timezone(&Utc)
        })
        .collect()
}

#[tokio::test]
async fn a_per_second_schedule_on_three_coordinators_enqueues_one_job_per_second() {
    let db = TestDb::new().await;
    let (a, b, c) = (
        CoordinatorProcess::start(&db, &[]).await,
        CoordinatorProcess::start(&db, &[]).await,
        CoordinatorProcess::start(&db, &[]).await,
    );
    let (status, created) = a
        .api
        .put(
            "/v1/schedules/every-second",
            &json!({"queue": "ticks", "cron": "* * * * * *", "payload": {"tick": true}}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert!(created["next_fire_at"].is_string());
    let started = Instant::now();
    // 20 s of fire times, on PostgreSQL's clock.
    loop {
        let times = fire_times(&db, "every-second").await;
        if let (Some(first), Some(last)) = (times.first(), times.last())
            && (*last - *first).num_seconds() >= 20
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the schedule did not keep firing"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _) = b.api.delete("/v1/schedules/every-second").await;
    assert_eq!(status, 200);
    let times = fire_times(&db, "every-second").await;
    let unique: HashSet<_> = times.iter().collect();
    assert_eq!(unique.len(), times.len(), "no fire time enqueued twice");
    for pair in times.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_milliseconds(),
            1000,
            "no second missing: {pair:?}"
        );
    }
    assert!(times.len() >= 21);
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs WHERE queue = 'ticks'", &[])
            .await,
        times.len() as i64,
        "one job per fire time"
    );
    let (_, listed) = c.api.get("/v1/schedules").await;
    assert_eq!(listed["schedules"], json!([]));
}

#[tokio::test]
async fn after_an_outage_only_the_latest_missed_fire_is_enqueued_and_a_paused_schedule_waits() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, _) = c
        .api
        .put(
            "/v1/schedules/hourly",
            &json!({"queue": "reports", "cron": "0 * * * *", "payload": 1}),
        )
        .await;
    assert_eq!(status, 201);
    c.stop().await.unwrap();
    // Down for five hours: the schedule's next fire time is long past.
    let client = db.client().await;
    client
        .execute(
            "UPDATE schedules SET next_fire_at = date_trunc('hour', now()) - interval '5 hours'",
            &[],
        )
        .await
        .unwrap();
    let scheduler = Scheduler::new(
        db.store().await,
        runlease_coordinator::wake::Wake::local_only(),
        Arc::new(Metrics::new(Duration::from_secs(25))),
    );
    assert_eq!(scheduler.run_once().await.unwrap(), 1, "one job, not six");
    let times = fire_times(&db, "hourly").await;
    let hour: DateTime<Utc> = client
        .query_one("SELECT date_trunc('hour', now())", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(times, vec![hour], "the latest missed fire time");
    let next: DateTime<Utc> = client
        .query_one("SELECT next_fire_at FROM schedules WHERE name = 'hourly'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(next, hour + chrono::Duration::hours(1));
    assert_eq!(scheduler.run_once().await.unwrap(), 0, "nothing more is due");

    // Paused, a due schedule enqueues nothing; resumed, it starts from now
    // (the fire times it missed while paused are not caught up).
    let c = TestCoordinator::start(&db).await;
    let (_, paused) = c
        .api
        .put(
            "/v1/schedules/hourly",
            &json!({"queue": "reports", "cron": "0 * * * *", "payload": 1, "paused": true}),
        )
        .await;
    assert_eq!(paused["paused"], json!(true));
    assert_eq!(paused["next_fire_at"], json!(null));
    assert!(paused["last_fired_at"].as_str().is_some());
    client
        .execute(
            "UPDATE schedules SET next_fire_at = now() - interval '2 hours'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        scheduler.run_once().await.unwrap(),
        0,
        "a paused schedule fires nothing"
    );
    let (status, resumed) = c
        .api
        .put(
            "/v1/schedules/hourly",
            &json!({"queue": "reports", "cron": "0 * * * *", "payload": 1}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(resumed["next_fire_at"], json!(hour + chrono::Duration::hours(1)));
    assert_eq!(scheduler.run_once().await.unwrap(), 0);
    assert_eq!(fire_times(&db, "hourly").await.len(), 1);
}

#[tokio::test]
async fn bad_schedules_are_refused_with_what_is_wrong() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for (body, needle) in [
        (json!({"queue": "q", "cron": "not a cron", "payload": 1}), "cron"),
        (
            json!({"queue": "q", "cron": "61 * * * *", "payload": 1}),
            "does not parse",
        ),
        (json!({"queue": "q", "cron": "* * * *", "payload": 1}), "5 fields"),
        (
            json!({"queue": "q", "cron": "* * * * *", "timezone": "Mars/Olympus", "payload": 1}),
            "IANA",
        ),
        (
            json!({"queue": "q", "cron": "* * * * *", "payload": 1, "max_attempts": 0}),
            "max_attempts",
        ),
        (json!({"queue": "q", "cron": "* * * * *"}), "payload"),
        (
            json!({"queue": "q", "cron": "* * * * *", "payload": 1, "every": "day"}),
            "every",
        ),
    ] {
        let (status, answer) = c.api.put("/v1/schedules/s", &body).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(needle),
            "{needle}: {answer}"
        );
    }
    assert_eq!(c.api.get("/v1/schedules/s").await.0, 404);
    assert_eq!(c.api.delete("/v1/schedules/s").await.0, 404);
    let (status, ok) = c
        .api
        .put(
            "/v1/schedules/s",
            &json!({"queue": "q", "cron": "30 2 * * *", "timezone": "Europe/Paris", "payload": 1}),
        )
        .await;
    assert_eq!(status, 201, "{ok}");
    assert_eq!(ok["timezone"], json!("Europe/Paris"));
}

#[tokio::test]
async fn a_key_limited_to_some_queues_cannot_take_over_another_queues_schedule() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some("admin:admin-all-0000000001,admin:admin-qa-00000000001:qa".into());
    })
    .await;
    let all = c.api.with_key("admin-all-0000000001");
    let qa = c.api.with_key("admin-qa-00000000001");
    let body = |queue: &str| json!({"queue": queue, "cron": "0 0 1 1 *", "payload": 1});
    assert_eq!(all.put("/v1/schedules/z", &body("qb")).await.0, 201);
    assert_eq!(qa.get("/v1/schedules/z").await.0, 404);
    assert_eq!(
        qa.put("/v1/schedules/z", &body("qa")).await.0,
        404,
        "not moved to qa"
    );
    assert_eq!(qa.put("/v1/schedules/z", &body("qb")).await.0, 403);
    let (_, z) = all.get("/v1/schedules/z").await;
    assert_eq!(z["queue"], json!("qb"));
    assert_eq!(qa.put("/v1/schedules/mine", &body("qa")).await.0, 201);
}
