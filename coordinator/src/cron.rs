//! Cron expressions of schedules, read in a time zone. Parsing and the
//! search for fire times are croner's (5 fields, or 6 with seconds first);
//! daylight-saving changes follow its rules: a local time that does not
//! exist (the hour skipped in spring) fires at the first instant after the
//! gap, and one that occurs twice (the hour repeated in autumn) fires once,
//! at its first occurrence.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::errors::CronError;

/// A parsed cron expression with its time zone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: Cron,
    tz: Tz,
}

/// Most fire times stepped over when catching up after an outage (a
/// per-second schedule down for a day steps 86,400).
const MAX_CATCH_UP_STEPS: usize = 1_000_000;

impl CronSpec {
    /// Parses `expression` (5 or 6 fields) in time zone `timezone` (IANA
    /// name); the error says what is wrong.
    pub fn parse(expression: &str, timezone: &str) -> Result<Self, String> {
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "cron must have 5 fields (minute hour day month weekday) or 6 (seconds first), not {fields}"
            ));
        }
        let cron = Cron::new(expression)
            .with_seconds_optional()
            .parse()
            .map_err(|e| format!("cron {expression:?} does not parse: {e}"))?;
        // croner accepts a seconds, minutes or hours field that matches
        // nothing (`,`, or `L` in seconds), then searches minute by minute,
        // for minutes of CPU, to find no fire time: refuse it at once.
        let pattern = &cron.pattern;
        if !(matches_any(60, |s| pattern.second_match(s))
            && matches_any(60, |m| pattern.minute_match(m))
            && matches_any(24, |h| pattern.hour_match(h)))
        {
            return Err(format!(
                "cron {expression:?} has no fire time: its seconds, minutes or hours match no value"
            ));
        }
        let tz = Tz::from_str(timezone).map_err(|_| {
            format!("timezone {timezone:?} is not an IANA time zone name (e.g. Europe/Paris, UTC)")
        })?;
        let spec = Self { cron, tz };
        // An expression that never fires (e.g. February 30) is refused too.
        spec.next_after(Utc::now())
            .ok_or_else(|| format!("cron {expression:?} has no fire time"))?;
        Ok(spec)
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // croner searches in local time; during the second pass of a
        // repeated hour it answers that hour's first pass, which is before
        // `t`. Those times have fired already (a repeated time fires once):
        // search on from each until the answer is after `t`.
        let mut from = t;
        for _ in 0..10_000 {
            let next = self
                .cron
                .find_next_occurrence(&from.with_timezone(&self.tz), false)
                .ok()?
                .with_timezone(&Utc);
            if next > t {
                return Some(next);
            }
            from = from.max(next) + chrono::Duration::seconds(1);
        }
        None
    }

    /// Given the first fire time not yet enqueued (`due`, at or before
    /// `now`): the fire time to enqueue (the latest one at or before `now`:
    /// after an outage only the latest missed fire runs) and the next one
    /// after `now`.
    pub fn catch_up(&self, due: DateTime<Utc>, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        // A long outage of a frequent schedule: start from the last hour
        // rather than step over every missed fire time.
        let hour_ago = now - chrono::Duration::hours(1);
        let mut fire = due;
        if due < hour_ago
            && let Some(recent) = self.next_after(hour_ago)
            && recent <= now
        {
            fire = recent;
        }
        for _ in 0..MAX_CATCH_UP_STEPS {
            match self.next_after(fire) {
                Some(next) if next <= now => fire = next,
                Some(next) => return Some((fire, next)),
                None => return None,
            }
        }
        // Too many to step over: the latest is found from a minute back.
        let recent = self.next_after(now - chrono::Duration::minutes(1))?;
        let mut fire = if recent <= now { recent } else { due };
        while let Some(next) = self.next_after(fire) {
            if next > now {
                return Some((fire, next));
            }
            fire = next;
        }
        None
    }
}

/// Whether a field of values `0..count` matches any of them.
fn matches_any(count: u32, matches: impl Fn(u32) -> Result<bool, CronError>) -> bool {
    (0..count).any(|value| matches(value).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn five_and_six_fields_parse_and_others_are_refused() {
        assert!(CronSpec::parse("*/5 * * * *", "UTC").is_ok());
        assert!(CronSpec::parse("* * * * * *", "Europe/Paris").is_ok());
        assert!(
            CronSpec::parse("* * * *", "UTC")
                .unwrap_err()
                .contains("5 fields")
        );
        assert!(
            CronSpec::parse("61 * * * *", "UTC")
                .unwrap_err()
                .contains("does not parse")
        );
        assert!(
            CronSpec::parse("* * * * *", "Mars/Olympus")
                .unwrap_err()
                .contains("IANA")
        );
    }

    #[test]
    fn a_field_that_matches_nothing_is_refused_at_once() {
        // Found by the fuzz target cron: croner accepts `,` or `L` as a
        // seconds, minutes or hours field that matches nothing, then took
        // minutes of CPU (`, * * * * *`: 6 minutes) to find no fire time.
        for expression in [", * * * * *", "L * * * * *", ", * * * *", "* * , * * *"] {
            let (sent, parsed) = std::sync::mpsc::channel();
            std::thread::spawn(move || sent.send(CronSpec::parse(expression, "UTC").map(|_| ())));
            let error = parsed
                .recv_timeout(std::time::Duration::from_secs(2))
                .unwrap_or_else(|_| panic!("{expression:?}: still parsing after 2 s"))
                .unwrap_err();
            assert!(error.contains("no fire time"), "{expression:?}: {error}");
        }
    }

    #[test]
    fn after_an_outage_only_the_latest_missed_fire_runs() {
        let spec = CronSpec::parse("0 * * * *", "UTC").unwrap();
        let due = Utc.with_ymd_and_hms(2026, 1, 1, 1, 0, 0).unwrap();
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 5, 30, 0).unwrap();
        let (fire, next) = spec.catch_up(due, now).unwrap();
        assert_eq!(fire, Utc.with_ymd_and_hms(2026, 1, 1, 5, 0, 0).unwrap());
        assert_eq!(next, Utc.with_ymd_and_hms(2026, 1, 1, 6, 0, 0).unwrap());
    }

    #[test]
    fn daylight_saving_gaps_and_repeats_fire_once() {
        // Europe/Paris: 2026-03-29 02:00 does not exist; 2026-10-25 02:30 occurs twice.
        let spec = CronSpec::parse("30 2 * * *", "Europe/Paris").unwrap();
        let utc = |month, day, hour, minute| Utc.with_ymd_and_hms(2026, month, day, hour, minute, 0).unwrap();
        for (after, fire, why) in [
            (
                utc(3, 28, 12, 0),
                utc(3, 29, 1, 0),
                "03:00 CEST, right after the gap",
            ),
            (utc(10, 24, 12, 0), utc(10, 25, 0, 30), "02:30 CEST"),
            (utc(10, 25, 0, 30), utc(10, 26, 1, 30), "the next day, once"),
        ] {
            assert_eq!(spec.next_after(after).unwrap(), fire, "{why}");
        }
    }
}
