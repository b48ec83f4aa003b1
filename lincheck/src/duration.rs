//! Durations as the command line takes them: `10s`, `500ms`, `2m`, `1m30s`, `1.5s`.

use std::time::Duration;

/// Why a duration does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {text:?}: {reason} (examples: 10s, 500ms, 2m, 1m30s; 0 for no limit)")]
pub struct DurationError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a Go-style duration: one or more `NUMBER UNIT` pairs (units `ns`, `us`, `µs`, `ms`,
/// `s`, `m`, `h`; the number may have a fraction), or a bare `0`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        text: text.to_string(),
        reason,
    };
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("a number without a unit"))?;
        if num_len == 0 {
            return Err(err("expected a number"));
        }
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| err("a malformed number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(err("a number without a unit")),
            _ => return Err(err("an unknown unit")),
        };
        rest = &rest[unit_len..];
        total += number * seconds_per_unit;
    }
    Duration::try_from_secs_f64(total).map_err(|_| err("out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "10", "s", "10x", "1..2s", "-1s", "ms10"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
