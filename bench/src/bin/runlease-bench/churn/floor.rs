//! What a scrape's latency is made of, beside the latency itself: the
//! coordinator's own time for each route (its `request_duration_seconds`
//! histogram, read before and after the sampling), and the machine's floor
//! in the same seconds (how late a plain thread that sleeps 10 ms at a time
//! wakes up). A scrape that the coordinator answers in half a millisecond
//! can still take several on the clock of a client when the machine's two
//! cores are shared by PostgreSQL, the coordinator and the workers: every
//! round trip waits for at least two threads to be scheduled.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::stats::percentile;

/// The routes sampled, as the coordinator labels them.
pub const ROUTES: [&str; 3] = ["/metrics", "/v1/queues", "/v1/queues/{queue}"];

/// How long the sleeper sleeps at a time.
const NAP: Duration = Duration::from_millis(10);

/// Cumulative bucket counts of one route's request durations: upper bound
/// in seconds → requests at or under it.
type Buckets = BTreeMap<u64, u64>;

/// Bucket counts per route, from `GET /metrics` text.
pub fn durations(text: &str) -> BTreeMap<String, Buckets> {
    let mut routes: BTreeMap<String, Buckets> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("runlease_request_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
        };
        let (Some(le), Some(route), Some(count)) =
            (label("le"), label("route"), count.trim().parse::<f64>().ok())
        else {
            continue;
        };
        // Bounds in microseconds as keys (+Inf last).
        let bound = le.parse::<f64>().map_or(u64::MAX, |s| (s * 1e6).round() as u64);
        *routes
            .entry(route.to_owned())
            .or_default()
            .entry(bound)
            .or_default() += count as u64;
    }
    routes
}

/// One route's requests between two readings: how many, the share within
/// 0.5 ms and within 1 ms, and the bucket bound (ms) holding the p99.
pub fn served(before: &BTreeMap<String, Buckets>, after: &BTreeMap<String, Buckets>, route: &str) -> String {
    let empty = Buckets::new();
    let (was, now) = (
        before.get(route).unwrap_or(&empty),
        after.get(route).unwrap_or(&empty),
    );
    let delta: Vec<(u64, u64)> = now
        .iter()
        .map(|(bound, n)| (*bound, n - was.get(bound).copied().unwrap_or(0).min(*n)))
        .collect();
    let total = delta.last().map_or(0, |(_, n)| *n);
    if total == 0 {
        return format!("{route}: no requests");
    }
    let within = |us: u64| delta.iter().find(|(b, _)| *b >= us).map_or(total, |(_, n)| *n);
    let p99 = delta
        .iter()
        .find(|(_, n)| *n as f64 >= total as f64 * 0.99)
        .map_or("+Inf".to_owned(), |(b, _)| bound_ms(*b));
    format!(
        "{route}: {total} requests, {:.1}% within 0.5 ms, {:.1}% within 1 ms, p99 ≤ {p99} ms",
        within(500) as f64 * 100.0 / total as f64,
        within(1_000) as f64 * 100.0 / total as f64,
    )
}

fn bound_ms(us: u64) -> String {
    if us == u64::MAX {
        "+Inf".to_owned()
    } else {
        format!("{}", us as f64 / 1e3)
    }
}

/// Lateness (ms) of a plain thread's 10 ms sleeps for `seconds`, each with
/// its second since the start. Blocks its thread.
pub fn sleeper(seconds: u64) -> Vec<(f64, f64)> {
    let started = Instant::now();
    let mut late = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        let at = started.elapsed().as_secs_f64();
        let asleep = Instant::now();
        std::thread::sleep(NAP);
        late.push((at, (asleep.elapsed().saturating_sub(NAP)).as_secs_f64() * 1e3));
    }
    late
}

/// p50 / p99 / max of the lateness.
pub fn lateness(late: &[(f64, f64)]) -> String {
    let mut ms: Vec<f64> = late.iter().map(|(_, ms)| *ms).collect();
    ms.sort_by(f64::total_cmp);
    format!(
        "a thread sleeping 10 ms at a time woke late by p50 {:.2} / p99 {:.2} / max {:.1} ms ({} naps)",
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN),
        ms.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "runlease_request_duration_seconds_bucket{le=\"0.0005\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 10\n\
        runlease_request_duration_seconds_bucket{le=\"0.001\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 10\n\
        runlease_request_duration_seconds_bucket{le=\"+Inf\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 10\n";
    const AFTER: &str = "runlease_request_duration_seconds_bucket{le=\"0.0005\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 100\n\
        runlease_request_duration_seconds_bucket{le=\"0.001\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 105\n\
        runlease_request_duration_seconds_bucket{le=\"+Inf\",route=\"/metrics\",method=\"GET\",status=\"2xx\"} 110\n\
        runlease_request_duration_seconds_bucket{le=\"0.0005\",route=\"/v1/claim\",method=\"POST\",status=\"2xx\"} 7\n";

    #[test]
    fn served_counts_the_requests_between_two_readings() {
        let (before, after) = (durations(BEFORE), durations(AFTER));
        assert_eq!(
            served(&before, &after, "/metrics"),
            "/metrics: 100 requests, 90.0% within 0.5 ms, 95.0% within 1 ms, p99 ≤ +Inf ms"
        );
        assert_eq!(served(&before, &after, "/v1/queues"), "/v1/queues: no requests");
        assert_eq!(after["/v1/claim"][&500], 7);
    }

    #[test]
    fn lateness_reads_the_naps() {
        let late = [(0.0, 0.1), (0.1, 0.2), (0.2, 5.0)];
        assert!(
            lateness(&late).starts_with(
                "a thread sleeping 10 ms at a time woke late by p50 0.20 / p99 5.00 / max 5.0 ms"
            )
        );
    }
}
