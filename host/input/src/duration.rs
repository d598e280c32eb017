//! Go duration strings (`60s`, `1m30s`, `1.5h`), as upstream's agents take them, parsed with
//! integer arithmetic and an upper bound, so no value can overflow or panic.

use std::time::Duration;

/// The longest duration any agent setting accepts: 366 days (`8784h`). Longer values are
/// errors rather than "forever" (settings that mean forever say so, e.g. GFD's `infinite`).
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// [`MAX_DURATION`] in whole seconds: the bound of every agent flag given in seconds.
pub const MAX_DURATION_SECS: u64 = MAX_DURATION.as_secs();
/// [`MAX_DURATION`] in milliseconds: the bound of every agent flag given in milliseconds.
pub const MAX_DURATION_MS: u64 = MAX_DURATION.as_secs() * 1000;

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a Go duration; the message is Go's (`time: invalid duration "soon"`, `time: unknown
    /// unit "d" in duration "1d"`, `time: missing unit in duration "1"`).
    #[error("{0}")]
    Invalid(String),
    /// Longer than the bound.
    #[error("duration {value} is longer than the maximum {}h", max.as_secs() / 3600)]
    TooLong {
        /// The value as written.
        value: String,
        /// The bound.
        max: Duration,
    },
}

/// `d` when it is at most `max`; `value` is how it was written (for the error).
///
/// # Errors
/// [`DurationError::TooLong`].
pub fn check_max(d: Duration, max: Duration, value: &str) -> Result<Duration, DurationError> {
    if d > max {
        Err(DurationError::TooLong {
            value: value.to_owned(),
            max,
        })
    } else {
        Ok(d)
    }
}

/// Parses a Go duration (Go's `time.ParseDuration`): `0`, or one or more decimal numbers with
/// an optional fraction, each followed by a unit `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`
/// (`1h30m`, `1.5s`, `+2m`). A negative duration is refused (no agent sleeps backwards), and so
/// is one longer than `max` (at most [`MAX_DURATION`] where the setting has no own bound).
/// Fractions below a nanosecond are dropped, as Go does.
///
/// # Errors
/// [`DurationError::Invalid`] with Go's message, [`DurationError::TooLong`].
pub fn parse_go_duration(s: &str, max: Duration) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(format!("time: invalid duration {s:?}"));
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(DurationError::Invalid(format!(
            "time: invalid duration {s:?} (negative)"
        )));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    // Beyond this many nanoseconds the value is over any bound; stop adding (no overflow).
    let cap = max.as_nanos().saturating_add(1);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(invalid());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(DurationError::Invalid(format!(
                    "time: missing unit in duration {s:?}"
                )));
            }
            other => {
                return Err(DurationError::Invalid(format!(
                    "time: unknown unit {other:?} in duration {s:?}"
                )));
            }
        };
        // Integer part, saturating at the cap (a longer string of digits only grows).
        let mut whole: u128 = 0;
        for d in int.bytes() {
            whole = whole
                .saturating_mul(10)
                .saturating_add(u128::from(d - b'0'))
                .min(cap);
        }
        let mut part = whole.saturating_mul(unit_ns);
        // Fraction: digits beyond 1 ns of this unit do not matter.
        let mut scale = unit_ns;
        for d in frac.bytes() {
            if scale < 10 {
                break;
            }
            scale /= 10;
            part = part.saturating_add(u128::from(d - b'0') * scale);
        }
        total = total.saturating_add(part).min(cap);
        rest = after;
    }
    if total >= cap {
        return Err(DurationError::TooLong {
            value: s.to_owned(),
            max,
        });
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| invalid())?;
    #[allow(clippy::cast_possible_truncation)] // < 1e9
    let nanos = (total % 1_000_000_000) as u32;
    check_max(Duration::new(secs, nanos), max, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Duration, DurationError> {
        parse_go_duration(s, MAX_DURATION)
    }

    #[test]
    fn go_forms_parse_exactly() {
        assert_eq!(p("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(p("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(p("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(p("1h0.5m").unwrap(), Duration::from_secs(3630));
        assert_eq!(p("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(p("2us").unwrap(), Duration::from_micros(2));
        assert_eq!(p("2µs").unwrap(), Duration::from_micros(2));
        assert_eq!(p("7ns").unwrap(), Duration::from_nanos(7));
        assert_eq!(p(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(p("+5s").unwrap(), Duration::from_secs(5));
        assert_eq!(p("0").unwrap(), Duration::ZERO);
        assert_eq!(p("8784h").unwrap(), MAX_DURATION);
    }

    #[test]
    fn malformed_values_get_gos_messages() {
        let msg = |s: &str| p(s).unwrap_err().to_string();
        assert_eq!(msg("soon"), "time: invalid duration \"soon\"");
        assert_eq!(msg(""), "time: invalid duration \"\"");
        assert_eq!(msg("1"), "time: missing unit in duration \"1\"");
        assert_eq!(msg("1d"), "time: unknown unit \"d\" in duration \"1d\"");
        assert_eq!(msg("."), "time: invalid duration \".\"");
        assert!(msg("-5s").contains("negative"));
    }

    #[test]
    fn huge_values_are_refused_not_panicking() {
        for s in [
            "99999999999999999999999h",
            "8784h1ns",
            "18446744073709551616s",
            &format!("{}h", "9".repeat(10_000)),
            "9999999999h9999999999h",
        ] {
            let e = p(s).unwrap_err();
            assert!(matches!(e, DurationError::TooLong { .. }), "{s}: {e:?}");
        }
        assert_eq!(
            p("99999999999999999999999h").unwrap_err().to_string(),
            "duration 99999999999999999999999h is longer than the maximum 8784h"
        );
        assert_eq!(
            parse_go_duration("2s", Duration::from_secs(1)).unwrap_err(),
            DurationError::TooLong {
                value: "2s".into(),
                max: Duration::from_secs(1)
            }
        );
    }
}
