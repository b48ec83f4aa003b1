//! Durations as Kubernetes components take them: Go's `time.ParseDuration` grammar, a sequence
//! of decimal numbers, each with a unit, such as `10s`, `500ms`, `1.5s` or `1h30m`.
//!
//! Units: `ns`, `us` (or `µs`, `μs`), `ms`, `s`, `m`, `h`. A lone `0` is zero; any other number
//! needs a unit. A leading `+` is allowed; negative durations are refused (no flag takes one).
//! The largest duration is Go's, about 292 years (2^63 - 1 nanoseconds).

use std::time::Duration;

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    /// Not in the grammar.
    #[error("must be a duration such as 500ms, 10s, 1.5s or 1m30s, got {0:?}")]
    Invalid(String),
    /// A number without a unit (only `0` may go without).
    #[error("missing unit in duration {0:?} (such as 10s, 500ms, 1m)")]
    MissingUnit(String),
    /// A unit this grammar does not know.
    #[error("unknown unit {unit:?} in duration {input:?} (ns, us, ms, s, m, h)")]
    UnknownUnit {
        /// The duration as written.
        input: String,
        /// The unit.
        unit: String,
    },
    /// A negative duration.
    #[error("duration {0:?} is negative")]
    Negative(String),
    /// Longer than 2^63 - 1 nanoseconds.
    #[error("duration {0:?} is too long")]
    Overflow(String),
}

const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a duration in Go's `time.ParseDuration` grammar (see the module documentation); a
/// clap value parser (`value_parser = parse_duration`).
pub fn parse_duration(input: &str) -> Result<Duration, ParseDurationError> {
    let invalid = || ParseDurationError::Invalid(input.to_string());
    let mut s = input;
    if let Some(rest) = s.strip_prefix('-') {
        // `-0` is zero in Go; anything else negative is refused.
        return match parse_duration(rest) {
            Ok(d) if d.is_zero() => Ok(d),
            Ok(_) => Err(ParseDurationError::Negative(input.to_string())),
            Err(_) => Err(invalid()),
        };
    }
    if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        // The integer part.
        let int_len = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (int_digits, rest) = s.split_at(int_len);
        // The fraction.
        let (frac_digits, rest) = match rest.strip_prefix('.') {
            Some(after) => {
                let len = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(len)
            }
            None => ("", rest),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            // No digits at all (`.s`, `s`, `1s.`).
            return Err(invalid());
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "" => return Err(ParseDurationError::MissingUnit(input.to_string())),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(ParseDurationError::UnknownUnit {
                    input: input.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        let overflow = || ParseDurationError::Overflow(input.to_string());
        let mut whole: u128 = 0;
        for d in int_digits.bytes() {
            whole = whole * 10 + u128::from(d - b'0');
            if whole > MAX_NANOS {
                return Err(overflow());
            }
        }
        let mut nanos = whole.checked_mul(unit_nanos).ok_or_else(overflow)?;
        // The fraction, exactly, as far as it can matter (digits past nanoseconds of an hour
        // are dropped, as Go does).
        let mut frac: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac_digits.bytes().take(24) {
            frac = frac * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        nanos += frac * unit_nanos / scale;
        total += nanos;
        if total > MAX_NANOS {
            return Err(overflow());
        }
        s = rest;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| invalid())?;
    // Below 10^9, so it fits.
    let sub = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_grammar_table() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (input, want) in [
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10s", s(10)),
            ("500ms", ms(500)),
            ("1m", s(60)),
            ("1.5s", ms(1500)),
            ("1h30m", s(5400)),
            ("1m30s", s(90)),
            ("2h45m30.5s", ms((2 * 3600 + 45 * 60 + 30) * 1000 + 500)),
            (".5s", ms(500)),
            ("1.s", s(1)),
            ("+5s", s(5)),
            ("1.0000000001s", Duration::new(1, 0)),
            ("0.000000001s", Duration::from_nanos(1)),
            ("100ns", Duration::from_nanos(100)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("250μs", Duration::from_micros(250)),
            ("1h1m1s1ms1us1ns", Duration::new(3661, 1_001_001)),
            ("0.1h", s(360)),
            ("2562047h", s(2_562_047 * 3600)),
            (
                "9223372036854775807ns",
                Duration::from_nanos(i64::MAX as u64),
            ),
        ] {
            assert_eq!(parse_duration(input), Ok(want), "{input:?}");
        }
        for bad in [
            "",
            "5",
            "15",
            "s",
            ".",
            ".s",
            "1x",
            "1.2.3s",
            "-1s",
            "1s2",
            "1 s",
            " 1s",
            "1S",
            "1sec",
            "9223372036854775808ns",
            "2562048h",
            "--1s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(matches!(
            parse_duration("5"),
            Err(ParseDurationError::MissingUnit(_))
        ));
        assert!(matches!(
            parse_duration("-1s"),
            Err(ParseDurationError::Negative(_))
        ));
    }
}
