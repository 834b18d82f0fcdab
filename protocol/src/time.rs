//! Instants on the wire: RFC 3339 in UTC with a `Z`, and the fraction of a
//! second as chrono writes it (none, or 3, 6 or 9 digits), exactly what
//! chrono's own `Serialize` writes. The job answer writes each instant as
//! one finished string, its digits put in place here: chrono's `Serialize`
//! hands serde_json a `Display` that is escaped one character at a time, and
//! its general formatting was still the largest part of writing an instant
//! (a batch enqueue of 1,000 jobs writes 3,000).

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::Serializer;

/// Serializes an instant (`#[serde(serialize_with = "crate::time::instant")]`).
pub(crate) fn instant<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; RFC3339_MAX];
    match rfc3339(at, &mut buf) {
        Some(text) => s.serialize_str(text),
        None => s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
    }
}

/// [`instant`] for an instant that may be absent (`null`).
pub(crate) fn maybe_instant<S: Serializer>(at: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => instant(at, s),
        None => s.serialize_none(),
    }
}

/// `2026-12-05T22:57:47.602077123Z`: the longest [`rfc3339`] writes.
const RFC3339_MAX: usize = 30;

/// `at` as chrono's `to_rfc3339_opts(SecondsFormat::AutoSi, true)` writes
/// it, in `buf`; `None` for what it leaves to chrono (years outside
/// 0000–9999, a leap second).
fn rfc3339<'b>(at: &DateTime<Utc>, buf: &'b mut [u8; RFC3339_MAX]) -> Option<&'b str> {
    let year = u32::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = at.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    digits(&mut buf[0..4], year);
    buf[4] = b'-';
    digits(&mut buf[5..7], at.month());
    buf[7] = b'-';
    digits(&mut buf[8..10], at.day());
    buf[10] = b'T';
    digits(&mut buf[11..13], at.hour());
    buf[13] = b':';
    digits(&mut buf[14..16], at.minute());
    buf[16] = b':';
    digits(&mut buf[17..19], at.second());
    let (fraction, places) = match nanos {
        0 => (0, 0),
        n if n % 1_000_000 == 0 => (n / 1_000_000, 3),
        n if n % 1_000 == 0 => (n / 1_000, 6),
        n => (n, 9),
    };
    let mut end = 19;
    if places > 0 {
        buf[19] = b'.';
        end = 20 + places;
        digits(&mut buf[20..end], fraction);
    }
    buf[end] = b'Z';
    // Only ASCII digits and punctuation were written.
    std::str::from_utf8(&buf[..=end]).ok()
}

/// `value` in decimal, zero-padded to fill `out`.
fn digits(out: &mut [u8], mut value: u32) {
    for d in out.iter_mut().rev() {
        *d = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    struct Ours(#[serde(serialize_with = "instant")] DateTime<Utc>);

    #[derive(Serialize)]
    struct Maybe(#[serde(serialize_with = "maybe_instant")] Option<DateTime<Utc>>);

    #[test]
    fn an_instant_is_written_as_chrono_writes_it() {
        let second = Utc.with_ymd_and_hms(2026, 12, 5, 22, 57, 47).unwrap();
        for nanos in [
            0,
            602_000_000,
            602_077_000,
            602_077_123,
            1_000,
            7,
            999_999_999,
            10_000,
        ] {
            let at = second + chrono::Duration::nanoseconds(nanos);
            assert_eq!(
                serde_json::to_string(&Ours(at)).unwrap(),
                serde_json::to_string(&at).unwrap(),
                "{nanos} ns past the second"
            );
        }
        // Every month's last day, the turn of a leap year and of a century,
        // the ends of the range, and one outside it (left to chrono).
        let days = [
            (2024, 1, 31),
            (2024, 2, 29),
            (2023, 2, 28),
            (2000, 2, 29),
            (1900, 3, 1),
            (2026, 4, 30),
            (2026, 6, 30),
            (2026, 9, 30),
            (2026, 11, 30),
            (2026, 12, 31),
            (1970, 1, 1),
            (0, 1, 1),
            (9999, 12, 31),
            (10_000, 1, 1),
            (-1, 6, 15),
        ];
        for (y, m, d) in days {
            let at = Utc.with_ymd_and_hms(y, m, d, 23, 59, 59).unwrap() + chrono::Duration::microseconds(5);
            assert_eq!(
                serde_json::to_string(&Ours(at)).unwrap(),
                serde_json::to_string(&at).unwrap(),
                "{y}-{m}-{d}"
            );
        }
        // A leap second (nanoseconds past 1e9) is chrono's to write.
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        assert_eq!(
            serde_json::to_string(&Ours(leap)).unwrap(),
            serde_json::to_string(&leap).unwrap()
        );
        assert_eq!(serde_json::to_string(&Maybe(None)).unwrap(), "null");
        assert_eq!(
            serde_json::to_string(&Maybe(Some(second))).unwrap(),
            "\"2026-12-05T22:57:47Z\""
        );
    }
}
