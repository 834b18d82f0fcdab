//! Cron expressions and time zones of schedules (`PUT /v1/schedules/{name}`):
//! `CronSpec::parse` on any text (input: the expression, a newline, then the
//! time zone; without a newline the zone is `UTC`), then the searches the
//! scheduler runs on what was accepted.
//!
//! Invariants: an accepted expression has a fire time strictly after any
//! instant asked (it was refused otherwise), the next fire time after a fire
//! time is later still, and catching up after an outage enqueues a fire time
//! between the first one due and now, and plans the next one after now.
#![no_main]

use chrono::{DateTime, Duration, TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use runlease_coordinator::cron::CronSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (expression, timezone) = text.split_once('\n').unwrap_or((text, "UTC"));
    let Ok(spec) = CronSpec::parse(expression, timezone) else {
        return;
    };
    let now: DateTime<Utc> = Utc
        .with_ymd_and_hms(2026, 3, 29, 0, 59, 30)
        .single()
        .expect("a valid instant");
    let next = spec.next_after(now);
    if let Some(next) = next {
        assert!(next > now, "{expression:?} in {timezone}: {next} after {now}");
        if let Some(after) = spec.next_after(next) {
            assert!(after > next, "{expression:?} in {timezone}: {after} after {next}");
        }
    }
    let due = now - Duration::minutes(90);
    if let Some(first) = spec.next_after(due - Duration::seconds(1))
        && first <= now
        && let Some((fire, planned)) = spec.catch_up(first, now)
    {
        assert!(
            first <= fire && fire <= now,
            "{expression:?} in {timezone}: fire {fire}"
        );
        assert!(planned > now, "{expression:?} in {timezone}: next {planned}");
    }
});
