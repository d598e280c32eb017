//! Int-or-percent values (`maxUnavailable`): the one rule every such field of kiln is parsed
//! with, Kubernetes' own.
//!
//! The API server's rule for a DaemonSet's `rollingUpdate.maxUnavailable`
//! (`ValidatePositiveIntOrPercent` and `IsNotMoreThan100Percent`): an integer of at least 0, or
//! a string of digits followed by `%` (`^[0-9]+%$`) of at most 100%. A string that is not a
//! percentage is refused (apimachinery's `GetScaledValueFromIntOrPercent` refuses it too, and
//! NVIDIA's upgrade controller then stops, where kiln once read `"many"`, `"150%"` or `""` as
//! "all nodes"). Fields typed as plain strings in the CRD (`daemonsets.rollingUpdate.
//! maxUnavailable`) also take a bare integer (`"1"`), which upstream converts to an int.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A valid int-or-percent: a count, or a percentage of 0–100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    /// An absolute number (of nodes, pods), at most `i32::MAX`.
    Count(u32),
    /// A percentage, 0–100.
    Percent(u32),
}

/// The message of every refusal: what the value must be, and the value (quoted, escaped).
fn refused(shown: &str) -> String {
    format!(
        "must be a non-negative integer or a percentage from 0% to 100% (e.g. 25%), got {shown}"
    )
}

fn percent(s: &str, shown: &str) -> Result<IntOrPercent, String> {
    let digits = s.strip_suffix('%').ok_or_else(|| refused(shown))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refused(shown));
    }
    match digits.parse::<u32>() {
        Ok(p) if p <= 100 => Ok(IntOrPercent::Percent(p)),
        _ => Err(refused(shown)),
    }
}

impl IntOrPercent {
    /// Parse an int-or-string field (`driver.upgradePolicy.maxUnavailable`): an integer ≥ 0,
    /// or a string `N%` with N ≤ 100.
    ///
    /// # Errors
    /// The rule and the value, e.g. `must be a non-negative integer or a percentage from 0% to
    /// 100% (e.g. 25%), got "150%"`; the caller names the field.
    pub fn parse(value: &IntOrString) -> Result<Self, String> {
        match value {
            IntOrString::Int(n) => u32::try_from(*n)
                .map(IntOrPercent::Count)
                .map_err(|_| refused(&n.to_string())),
            IntOrString::String(s) => percent(s, &format!("{s:?}")),
        }
    }

    /// Parse a string field holding an int-or-percent (`daemonsets.rollingUpdate.
    /// maxUnavailable`): digits (`"1"`, a count) or `N%`.
    ///
    /// # Errors
    /// As [`IntOrPercent::parse`].
    pub fn parse_str(raw: &str) -> Result<Self, String> {
        let shown = format!("{raw:?}");
        if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
            return raw
                .parse::<i32>()
                .ok()
                .and_then(|n| u32::try_from(n).ok())
                .map(IntOrPercent::Count)
                .ok_or_else(|| refused(&shown));
        }
        percent(raw, &shown)
    }

    /// The value as Kubernetes writes it: a count as an int, a percentage as `"N%"`.
    #[must_use]
    pub fn to_int_or_string(self) -> IntOrString {
        match self {
            // A count is at most i32::MAX (checked when parsed).
            IntOrPercent::Count(n) => IntOrString::Int(i32::try_from(n).unwrap_or(i32::MAX)),
            IntOrPercent::Percent(p) => IntOrString::String(format!("{p}%")),
        }
    }

    /// The value for `total` items: a count as is, a percentage of `total` rounded up (as
    /// `GetScaledValueFromIntOrPercent(…, roundUp=true)`).
    #[must_use]
    pub fn scaled(self, total: usize) -> usize {
        match self {
            IntOrPercent::Count(n) => n as usize,
            IntOrPercent::Percent(p) => (p as usize * total).div_ceil(100),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> IntOrString {
        IntOrString::String(v.into())
    }

    #[test]
    fn the_api_servers_rule() {
        assert_eq!(
            IntOrPercent::parse(&s("25%")),
            Ok(IntOrPercent::Percent(25))
        );
        assert_eq!(IntOrPercent::parse(&s("0%")), Ok(IntOrPercent::Percent(0)));
        assert_eq!(
            IntOrPercent::parse(&s("100%")),
            Ok(IntOrPercent::Percent(100))
        );
        assert_eq!(
            IntOrPercent::parse(&IntOrString::Int(3)),
            Ok(IntOrPercent::Count(3))
        );
        for bad in [
            "many", "150%", "", "-1", "7", "%", "-5%", "1.5%", " 5%", "5 %", "+5%", "5%%",
        ] {
            let e = IntOrPercent::parse(&s(bad)).unwrap_err();
            assert!(e.ends_with(&format!("got {bad:?}")), "{bad}: {e}");
        }
        assert!(
            IntOrPercent::parse(&IntOrString::Int(-1))
                .unwrap_err()
                .ends_with("got -1")
        );
        assert_eq!(
            IntOrPercent::parse(&s("99999999999%")).unwrap_err(),
            "must be a non-negative integer or a percentage from 0% to 100% (e.g. 25%), got \"99999999999%\""
        );
    }

    #[test]
    fn string_fields_take_a_bare_count() {
        assert_eq!(IntOrPercent::parse_str("1"), Ok(IntOrPercent::Count(1)));
        assert_eq!(
            IntOrPercent::parse_str("10%"),
            Ok(IntOrPercent::Percent(10))
        );
        for bad in ["-1", "150%", "", "one", "99999999999", "1\0"] {
            assert!(IntOrPercent::parse_str(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            IntOrPercent::parse_str("1").unwrap().to_int_or_string(),
            IntOrString::Int(1)
        );
        assert_eq!(
            IntOrPercent::parse_str("10%").unwrap().to_int_or_string(),
            s("10%")
        );
    }

    #[test]
    fn scaling_rounds_up() {
        assert_eq!(IntOrPercent::Percent(25).scaled(100), 25);
        assert_eq!(IntOrPercent::Percent(1).scaled(101), 2);
        assert_eq!(IntOrPercent::Percent(100).scaled(7), 7);
        assert_eq!(IntOrPercent::Count(7).scaled(3), 7);
    }
}
