//! Durations as Go and Helm write them: `500ms`, `20s`, `5m`, `1h30m`, `1.5h`.
//!
//! Accepts everything the CRD's duration pattern allows (`([0-9]+(\.[0-9]+)?(ms|s|m|h))+`) and
//! the rest of Go's `time.ParseDuration` syntax (`ns`, `us`, `µs`, a leading `+`, `.5s`, and a
//! bare `0`), except negative durations, which make no sense as a timeout.

use std::time::Duration;

/// Why a duration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {}: {message}", super::expr::quote(.text))]
pub struct DurationError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub message: String,
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// The units Go accepts, in nanoseconds.
const UNITS: [(&str, u128); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", NANOS_PER_SECOND),
    ("m", 60 * NANOS_PER_SECOND),
    ("h", 3600 * NANOS_PER_SECOND),
    ("d", 0), // not a Go unit: listed only to give a helpful error
];

/// How many fraction digits are read; later ones are below a nanosecond of any unit.
const MAX_FRACTION_DIGITS: usize = 18;

/// Parses a Go-style duration: a sequence of decimal numbers, each with an optional fraction
/// and a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), such as `500ms`, `20s`, `5m`, `1h30m`,
/// `1.5h`. A bare `0` is zero. Surrounding whitespace is ignored.
///
/// # Errors
///
/// Returns a [`DurationError`] naming the text when it is empty, negative, has a number without
/// a unit or an unknown unit, or is longer than Go's maximum duration (about 292 years).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let error = |message: &str| DurationError {
        text: text.to_string(),
        message: message.to_string(),
    };
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.starts_with('-') {
        return Err(error("a duration cannot be negative"));
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    if rest.is_empty() {
        return Err(error("empty; write a number and a unit, such as 30s or 5m"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let integer_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (integer, after) = rest.split_at(integer_len);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let len = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(len)
            }
            None => ("", after),
        };
        if integer.is_empty() && fraction.is_empty() {
            return Err(error(
                "expected a number, such as the 30 of 30s (units: ms, s, m, h)",
            ));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(error(&format!(
                "the number {} has no unit (use ms, s, m or h, as in 30s or 5m)",
                super::expr::cut(&format!(
                    "{integer}{}{fraction}",
                    if fraction.is_empty() { "" } else { "." }
                ))
            )));
        }
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .filter(|scale| *scale > 0)
            .ok_or_else(|| {
                error(&format!(
                    "unknown unit {:?} (use ms, s, m or h)",
                    super::expr::cut(unit)
                ))
            })?;
        let too_large = || error("too large (the maximum is about 292 years)");
        let mut nanos: u128 = 0;
        for digit in integer.bytes() {
            nanos = nanos
                .checked_mul(10)
                .and_then(|n| n.checked_add(u128::from(digit - b'0')))
                .ok_or_else(too_large)?;
            if nanos > u128::from(u64::MAX) {
                return Err(too_large());
            }
        }
        nanos = nanos.checked_mul(scale).ok_or_else(too_large)?;
        let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
        if !fraction.is_empty() {
            let digits: u128 = fraction.parse().map_err(|_| too_large())?;
            let denominator = 10u128.pow(fraction.len() as u32);
            nanos += digits * scale / denominator;
        }
        total = total.checked_add(nanos).ok_or_else(too_large)?;
        // Go's durations are int64 nanoseconds.
        if total > i64::MAX as u128 {
            return Err(too_large());
        }
        rest = after;
    }
    let seconds = (total / NANOS_PER_SECOND) as u64;
    let nanos = (total % NANOS_PER_SECOND) as u32;
    Ok(Duration::new(seconds, nanos))
}

/// Writes a duration the short way a user writes one: `20s`, `5m`, `1h30m`, `1.5s`, `500ms`.
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_string();
    }
    let nanos = duration.subsec_nanos();
    let seconds = duration.as_secs();
    if seconds == 0 {
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}µs", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let mut out = String::new();
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    if seconds > 0 || nanos > 0 {
        out.push_str(&seconds.to_string());
        if nanos > 0 {
            let fraction = format!("{nanos:09}");
            out.push('.');
            out.push_str(fraction.trim_end_matches('0'));
        }
        out.push('s');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse_duration(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn reads_the_durations_the_crd_allows() {
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("20s"), Duration::from_secs(20));
        assert_eq!(ok("5m"), Duration::from_secs(300));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("2h45m30.25s"), Duration::from_millis(9_930_250));
        assert_eq!(ok("1m1m"), Duration::from_secs(120));
    }

    #[test]
    fn reads_the_rest_of_go_syntax() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("3us"), Duration::from_micros(3));
        assert_eq!(ok("3µs"), Duration::from_micros(3));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok(" 20s "), Duration::from_secs(20));
        assert_eq!(ok("1.0000000000000000000000001s"), Duration::from_secs(1));
    }

    #[test]
    fn rejects_what_go_rejects_and_negative_timeouts() {
        for (text, message) in [
            ("", "empty"),
            ("  ", "empty"),
            ("5", "has no unit"),
            ("1h5", "has no unit"),
            ("5x", "unknown unit \"x\""),
            ("2d", "unknown unit \"d\""),
            ("s", "expected a number"),
            (".s", "expected a number"),
            ("-5s", "negative"),
            ("5 s", "unknown unit \" s\""),
            ("99999999999999999999999h", "too large"),
            ("2562048h", "too large"),
        ] {
            let error = parse_duration(text).expect_err(text);
            assert!(error.to_string().contains(message), "{text}: {error}");
            assert!(
                error.to_string().contains(&format!("{:?}", text.trim())),
                "{error}"
            );
        }
    }

    #[test]
    fn long_text_is_quoted_cut_short() {
        let error = parse_duration(&"9".repeat(100_000))
            .unwrap_err()
            .to_string();
        assert!(error.len() < 400, "{error}");
    }

    #[test]
    fn the_largest_go_duration_is_accepted() {
        assert_eq!(ok("2562047h"), Duration::from_secs(2_562_047 * 3600));
    }

    #[test]
    fn formats_the_way_users_write_durations() {
        for (seconds, millis, text) in [
            (0, 0, "0s"),
            (0, 500, "500ms"),
            (20, 0, "20s"),
            (300, 0, "5m"),
            (90, 0, "1m30s"),
            (5400, 0, "1h30m"),
            (3605, 0, "1h5s"),
            (1, 500, "1.5s"),
        ] {
            let duration = Duration::from_secs(seconds) + Duration::from_millis(millis);
            assert_eq!(format_duration(duration), text);
            assert_eq!(ok(text), duration, "round trip of {text}");
        }
        assert_eq!(format_duration(Duration::from_micros(3)), "3µs");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
    }
}
