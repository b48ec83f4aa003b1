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
    if let Some(rest) = input.strip_prefix('-') {
        return parse_negative(input, rest);
    }
    let s = input.strip_prefix('+').unwrap_or(input);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let total = total_nanos(input, s)?;
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| invalid())?;
    // Below 10^9, so it fits.
    let sub = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// A duration written with a leading `-` (`rest` follows it): `-0` is zero in Go; anything
/// else negative is refused, and what does not parse after the sign is invalid as a whole.
fn parse_negative(input: &str, rest: &str) -> Result<Duration, ParseDurationError> {
    match parse_duration(rest) {
        Ok(d) if d.is_zero() => Ok(d),
        Ok(_) => Err(ParseDurationError::Negative(input.to_string())),
        Err(_) => Err(ParseDurationError::Invalid(input.to_string())),
    }
}

/// The sum of the terms of `s` (the duration `input` without its sign), in nanoseconds, at
/// most [`MAX_NANOS`]. Each term is checked whole (its digits, then its unit, then its size)
/// before the next is read.
fn total_nanos(input: &str, mut s: &str) -> Result<u128, ParseDurationError> {
    let overflow = || ParseDurationError::Overflow(input.to_string());
    let mut total: u128 = 0;
    while !s.is_empty() {
        let (term, rest) =
            split_term(s).ok_or_else(|| ParseDurationError::Invalid(input.to_string()))?;
        let unit_nanos = unit_nanos(input, term.unit)?;
        total += term_nanos(&term, unit_nanos).ok_or_else(overflow)?;
        if total > MAX_NANOS {
            return Err(overflow());
        }
        s = rest;
    }
    Ok(total)
}

/// One term of a duration as written: a decimal number and its unit (`1.5` and `s` of `1.5s`).
#[derive(Debug, PartialEq, Eq)]
struct Term<'a> {
    /// The digits before the `.`, perhaps none (`.5s`).
    int_digits: &'a str,
    /// The digits after the `.`, perhaps none (`1s`, `1.s`).
    frac_digits: &'a str,
    /// Everything up to the next digit or `.`, perhaps nothing (`5`).
    unit: &'a str,
}

/// The first term of `s` and what follows it; `None` when the term has no digits at all
/// (`.s`, `s`, the `.` after `1s`).
fn split_term(s: &str) -> Option<(Term<'_>, &str)> {
    let (int_digits, rest) = split_digits(s);
    let (frac_digits, rest) = match rest.strip_prefix('.') {
        Some(after) => split_digits(after),
        None => ("", rest),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return None;
    }
    let unit_len = rest
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(rest.len());
    let (unit, rest) = rest.split_at(unit_len);
    let term = Term {
        int_digits,
        frac_digits,
        unit,
    };
    Some((term, rest))
}

/// The leading ASCII digits of `s`, and the rest.
fn split_digits(s: &str) -> (&str, &str) {
    s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()))
}

/// The units, each with its length in nanoseconds.
const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Nanoseconds in `unit`, one of [`UNITS`]; a missing or unknown unit is an error about the
/// duration `input`.
fn unit_nanos(input: &str, unit: &str) -> Result<u128, ParseDurationError> {
    if unit.is_empty() {
        return Err(ParseDurationError::MissingUnit(input.to_string()));
    }
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, nanos)| *nanos)
        .ok_or_else(|| ParseDurationError::UnknownUnit {
            input: input.to_string(),
            unit: unit.to_string(),
        })
}

/// Nanoseconds of one term whose unit is `unit_nanos` long; `None` when its whole part alone
/// is over [`MAX_NANOS`] (a number of any unit) or times the unit overflows. The fraction is
/// exact as far as it can matter: digits past nanoseconds of an hour are dropped, as Go does.
fn term_nanos(term: &Term<'_>, unit_nanos: u128) -> Option<u128> {
    let mut whole: u128 = 0;
    for d in term.int_digits.bytes() {
        whole = whole * 10 + u128::from(d - b'0');
        if whole > MAX_NANOS {
            return None;
        }
    }
    let nanos = whole.checked_mul(unit_nanos)?;
    let mut frac: u128 = 0;
    let mut scale: u128 = 1;
    for d in term.frac_digits.bytes().take(24) {
        frac = frac * 10 + u128::from(d - b'0');
        scale *= 10;
    }
    Some(nanos + frac * unit_nanos / scale)
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

    #[test]
    fn each_error_names_what_is_wrong() {
        let input = |s: &str| s.to_string();
        assert_eq!(
            parse_duration("1x"),
            Err(ParseDurationError::UnknownUnit {
                input: input("1x"),
                unit: input("x"),
            })
        );
        assert_eq!(
            parse_duration("1.2.3s"),
            Err(ParseDurationError::MissingUnit(input("1.2.3s")))
        );
        for bad in ["", "s", "1s.", "--1s", "-x"] {
            assert_eq!(
                parse_duration(bad),
                Err(ParseDurationError::Invalid(input(bad))),
                "{bad:?}"
            );
        }
        for long in [
            "9223372036854775808ns",
            "2562048h",
            "2562047h3600s",
            "99999999999999999999h",
        ] {
            assert_eq!(
                parse_duration(long),
                Err(ParseDurationError::Overflow(input(long))),
                "{long:?}"
            );
        }
        // The first term's fault is reported, before a later term is read.
        assert_eq!(
            parse_duration("1x2y"),
            Err(ParseDurationError::UnknownUnit {
                input: input("1x2y"),
                unit: input("x"),
            })
        );
    }

    #[test]
    fn a_term_is_its_digits_and_its_unit() {
        let term = |int_digits, frac_digits, unit| Term {
            int_digits,
            frac_digits,
            unit,
        };
        assert_eq!(split_term("1.5s30m"), Some((term("1", "5", "s"), "30m")));
        assert_eq!(split_term(".5µs"), Some((term("", "5", "µs"), "")));
        assert_eq!(split_term("1.s"), Some((term("1", "", "s"), "")));
        assert_eq!(split_term("12"), Some((term("12", "", ""), "")));
        assert_eq!(split_term("1.2.3s"), Some((term("1", "2", ""), ".3s")));
        for none in [".s", "s", "."] {
            assert_eq!(split_term(none), None, "{none:?}");
        }
        for (unit, nanos) in [("ns", 1), ("μs", 1_000), ("h", 3_600_000_000_000)] {
            assert_eq!(unit_nanos("1", unit), Ok(nanos));
        }
        // Digits past the 24th of a fraction are dropped.
        let tiny = format!("0.{}1", "0".repeat(24));
        assert_eq!(
            term_nanos(&term("0", &tiny[2..], "h"), 3_600_000_000_000),
            Some(0)
        );
        assert_eq!(
            term_nanos(&term("1", "5", "s"), 1_000_000_000),
            Some(1_500_000_000)
        );
    }
}
