//! Kubernetes resource quantities (`500m`, `2Gi`, `1e3`), parsed exactly (no floats) as
//! `k8s.io/apimachinery/pkg/api/resource.ParseQuantity` does, so two quantities of the same
//! resource compare exactly.
//!
//! The grammar, Kubernetes' own:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= [+-] <digits> [ "." [<digits>] ] | [+-] "." <digits>
//! <suffix>          ::= <binarySI> | <decimalSI> | <decimalExponent>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= ( e | E ) [+-] <digits>      (a 64-bit integer)
//! ```
//!
//! Like Kubernetes, a value is kept to the nano (10^-9) and a non-zero value finer than that
//! is rounded away from zero (`1e-10` is `1n`, `0.0000000003Ki` is `308n`): "if you want some
//! resources, you should get some". Two differences, both refusals of what Kubernetes would
//! store but no workload can use:
//!
//! - the magnitude is at most 2^63-1 units (9223372036854775807, just under `8Ei`), the range
//!   of Kubernetes' `Quantity.Value()`; Kubernetes caps a larger binary-SI value at 2^63-1 and
//!   keeps a larger decimal one as an arbitrary-precision decimal, we refuse both as out of
//!   range. `0e999` is 0, as in Kubernetes; `1e999` is out of range.
//! - a sign or a point without any digit (`+`, `-`, `.`) is refused; Kubernetes' scanner
//!   reads it as 0, its OpenAPI pattern and the grammar above refuse it.

use std::fmt;
use std::str::FromStr;

use super::syntax::quoted;
#[cfg(test)]
use super::syntax::shown;

/// Nano-units per unit.
const NANOS: u128 = 1_000_000_000;

/// The largest magnitude in nano-units: 2^63-1 units.
const MAX_NANOS: u128 = i64::MAX as u128 * NANOS;

/// Decimal digits of the smallest nano count above [`MAX_NANOS`] (10^28 > 9.2e27).
const OUT_OF_RANGE_DIGITS: usize = 29;

/// A quantity that is not in Kubernetes' quantity syntax, or out of the range this operator
/// judges. Displayed with at most 64 characters of the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseQuantityError {
    /// Not in the quantity grammar (`lots`, `1.2.3`, `1Kib`, `""`).
    #[error("{} is not a quantity (such as 500m, 2Gi or 1e9)", quoted(.0))]
    Syntax(String),
    /// Above 2^63-1 units in magnitude (`1e999`, `8Ei`, `9223372036854775807k`).
    #[error(
        "{} is out of range: a quantity is at most 9223372036854775807 (2^63-1, just under 8Ei) in magnitude",
        quoted(.0)
    )]
    OutOfRange(String),
}

/// The exact value of a quantity, in nano-units (10^-9), as Kubernetes keeps it.
/// Ordered by value: `1e3 == 1k`, `1.5Gi == 1536Mi`, `1P < 1000000000000000001m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// A whole number of units, such as bytes or cores.
    pub const fn from_units(units: i64) -> Quantity {
        Quantity {
            nanos: units as i128 * NANOS as i128,
        }
    }

    /// Parses `s` exactly; see the module documentation for the grammar and the range.
    pub fn parse(s: &str) -> Result<Quantity, ParseQuantityError> {
        let syntax = || ParseQuantityError::Syntax(s.to_string());
        let (negative, unsigned) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (int_digits, rest) = split_digits(unsigned);
        let (frac_digits, suffix) = match rest.strip_prefix('.') {
            Some(after_point) => split_digits(after_point),
            None => ("", rest),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(syntax());
        }
        let (binary_exp, decimal_exp): (u32, i64) = match suffix {
            "" => (0, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            other => match other.strip_prefix(['e', 'E']) {
                // i64's parser takes what Go's strconv.ParseInt(_, 10, 64) takes: an optional
                // sign and at least one digit, within 64 bits.
                Some(exp) => (0, exp.parse().map_err(|_| syntax())?),
                None => return Err(syntax()),
            },
        };
        // The digits without leading zeros, D: the value is D * 10^shift * 2^binary_exp nanos.
        let digits: Vec<u8> = int_digits
            .bytes()
            .chain(frac_digits.bytes())
            .map(|b| b - b'0')
            .skip_while(|&d| d == 0)
            .collect();
        if digits.is_empty() {
            return Ok(Quantity { nanos: 0 });
        }
        let shift = i128::from(decimal_exp) - frac_digits.len() as i128 + 9;
        let magnitude = nanos_of(&digits, shift, binary_exp)
            .filter(|&n| n <= MAX_NANOS)
            .ok_or_else(|| ParseQuantityError::OutOfRange(s.to_string()))?;
        // MAX_NANOS < 2^127, so the magnitude fits.
        let nanos = magnitude as i128;
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// Below zero (`-1`, `-1n`; `-0` is zero).
    pub fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// The float nearest to the value (never NaN or infinite).
    pub fn as_f64(self) -> f64 {
        let magnitude = self.nanos.unsigned_abs();
        let sign = if self.nanos < 0 { "-" } else { "" };
        // Rust's float parser rounds to the nearest, so this is the correctly rounded value.
        format!("{sign}{}.{:09}", magnitude / NANOS, magnitude % NANOS)
            .parse()
            .unwrap_or(self.nanos as f64 / 1e9)
    }
}

impl FromStr for Quantity {
    type Err = ParseQuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl fmt::Display for Quantity {
    /// The value in units with up to nine decimals (`1.5Gi` is `1610612736`, `500m` is `0.5`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let magnitude = self.nanos.unsigned_abs();
        let sign = if self.nanos < 0 { "-" } else { "" };
        let (units, frac) = (magnitude / NANOS, magnitude % NANOS);
        if frac == 0 {
            write!(f, "{sign}{units}")
        } else {
            let decimals = format!("{frac:09}");
            write!(f, "{sign}{units}.{}", decimals.trim_end_matches('0'))
        }
    }
}

/// The value of a quantity as the nearest float (`"1Ki"` is 1024.0, `"500m"` is 0.5), never
/// NaN or infinite. Floats cannot tell `1P` from `1P` + `1m`: compare [`Quantity`] values
/// for an exact answer.
pub fn parse_quantity(s: &str) -> Result<f64, ParseQuantityError> {
    Quantity::parse(s).map(Quantity::as_f64)
}

/// The leading ASCII digits of `s` and the rest.
fn split_digits(s: &str) -> (&str, &str) {
    s.split_at(s.bytes().take_while(u8::is_ascii_digit).count())
}

/// `digits` (most significant first, no leading zero, not empty) times 10^shift times
/// 2^binary_exp, rounded up to a whole number; `None` when it is certainly above
/// [`MAX_NANOS`]. Exact: every intermediate value is below 2^128.
fn nanos_of(digits: &[u8], shift: i128, binary_exp: u32) -> Option<u128> {
    let binary = 1u128 << binary_exp;
    let n = digits.len() as i128;
    if shift >= 0 {
        // At least 10^(n - 1 + shift).
        if n + shift >= OUT_OF_RANGE_DIGITS as i128 {
            return None;
        }
        // Below 10^28 now.
        let decimal = to_u128(digits)? * 10u128.pow(shift as u32);
        return decimal.checked_mul(binary);
    }
    // A fractional value: the whole part W (the leading n - places digits) and the fraction
    // F (the trailing `places` digits, padded with leading zeros when n < places).
    let places = -shift;
    let whole_len = (n - places).max(0) as usize;
    if whole_len >= OUT_OF_RANGE_DIGITS {
        return None;
    }
    let (whole, fraction) = digits.split_at(whole_len);
    // F * 2^binary_exp = carry + a fraction, computed digit by digit from the least
    // significant one: each step keeps carry < 2^binary_exp.
    let mut carry = 0u128;
    let mut inexact = false;
    for &d in fraction.iter().rev() {
        let t = u128::from(d) * binary + carry;
        inexact |= !t.is_multiple_of(10);
        carry = t / 10;
    }
    // The padding zeros only move the carry down; it is zero after at most 40 of them.
    let mut padding = places - fraction.len() as i128;
    while padding > 0 && carry > 0 {
        inexact |= !carry.is_multiple_of(10);
        carry /= 10;
        padding -= 1;
    }
    to_u128(whole)?
        .checked_mul(binary)?
        .checked_add(carry)?
        .checked_add(u128::from(inexact))
}

/// The number of at most 38 decimal digits (0 when there are none).
fn to_u128(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u128::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(s: &str) -> Result<i128, ParseQuantityError> {
        Quantity::parse(s).map(|q| q.nanos)
    }

    #[test]
    fn parses_exactly_to_the_nano() {
        const G: i128 = 1_000_000_000;
        let cases: &[(&str, i128)] = &[
            ("0", 0),
            ("-0", 0),
            ("+000.000", 0),
            ("0e999", 0),
            ("0e-999", 0),
            ("0e9223372036854775807", 0),
            ("0Ei", 0),
            ("1", G),
            ("+1", G),
            ("-1", -G),
            ("5.", 5 * G),
            (".5", G / 2),
            ("-.5", -G / 2),
            ("0.5", G / 2),
            ("500m", G / 2),
            ("1e3", 1000 * G),
            ("1E3", 1000 * G),
            ("1e+3", 1000 * G),
            ("1000e-3", G),
            ("1k", 1000 * G),
            ("1E", 1_000_000_000_000_000_000 * G),
            ("1Ki", 1024 * G),
            ("1.5Gi", 1_610_612_736 * G),
            ("1536Mi", 1_610_612_736 * G),
            ("0.1Ki", 102_400_000_000),
            ("1n", 1),
            ("1u", 1000),
            ("1.5n", 2),
            ("-1.5n", -2),
            ("1e-10", 1),
            ("-1e-10", -1),
            ("1e-999", 1),
            ("1e-9223372036854775808", 1),
            ("0.000000000001Ki", 2),
            ("0.0000000003Ki", 308),
            ("0.00000000025Ki", 256),
            ("9223372036854775807", i64::MAX as i128 * G),
            ("-9223372036854775807", -(i64::MAX as i128) * G),
            ("9223372036854775807000000000n", i64::MAX as i128 * G),
            ("7Ei", (7 << 60) * G),
        ];
        for &(s, want) in cases {
            assert_eq!(nanos(s), Ok(want), "{s}");
        }
        let long_zeros = format!("{}1", "0".repeat(100_000));
        assert_eq!(nanos(&long_zeros), Ok(G));
        let long_fraction = format!("1.{}1", "0".repeat(100_000));
        assert_eq!(nanos(&long_fraction), Ok(G + 1));
    }

    #[test]
    fn refuses_what_kubernetes_refuses_and_what_is_out_of_range() {
        for s in [
            "",
            "+",
            "-",
            ".",
            "+.",
            "1.2.3",
            "1Kib",
            "1K",
            "1KI",
            "Gi",
            "1GB",
            "one",
            "1e",
            "1e+",
            "1e2.5",
            "1e3e3",
            "--1",
            "+-1",
            " 1",
            "1 ",
            "0x10",
            "1_000",
            "١",
            "1e99999999999999999999",
            "1e-12Ki",
            "1e3k",
        ] {
            assert_eq!(
                Quantity::parse(s),
                Err(ParseQuantityError::Syntax(s.to_string())),
                "{s:?}"
            );
        }
        for s in [
            "9223372036854775808",
            "-9223372036854775808",
            "9223372036854775807.000000001",
            "9223372036854775807k",
            "8Ei",
            "1e999",
            "1e9223372036854775807",
            "100000000000000000000000000000000000000000000000Ki",
        ] {
            assert_eq!(
                Quantity::parse(s),
                Err(ParseQuantityError::OutOfRange(s.to_string())),
                "{s:?}"
            );
        }
    }

    #[test]
    fn compares_exactly_across_suffixes() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("700m"), q("0.7"));
        assert_eq!(q("1e-10"), q("1n"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("1") > q("999m"));
        assert!(q("1000000000000000001m") > q("1P"));
        assert!(q("1073741823") < q("1Gi"));
        assert_eq!(q("64Mi"), Quantity::from_units(64 << 20));
    }

    #[test]
    fn floats_are_the_nearest_and_never_nan() {
        assert_eq!(parse_quantity("1Ki"), Ok(1024.0));
        assert_eq!(parse_quantity("500m"), Ok(0.5));
        assert_eq!(parse_quantity("700m"), Ok(0.7));
        assert_eq!(parse_quantity("2300m"), Ok(2.3));
        assert_eq!(parse_quantity("-1.5Gi"), Ok(-1.5 * 1024f64.powi(3)));
        assert_eq!(parse_quantity("0e999"), Ok(0.0));
        assert_eq!(parse_quantity("1073741823"), Ok(1_073_741_823.0));
        assert!(parse_quantity("1e999").is_err());
        // Every combination of these pieces parses or is refused, without a panic.
        let numbers = [
            "",
            "0",
            "9",
            "+1",
            "-1",
            ".",
            "1.",
            ".5",
            "99999999999999999999.99",
        ];
        let suffixes = [
            "", "n", "m", "k", "E", "Ei", "e", "e9", "e-30", "e+40", "Ki", "x",
        ];
        for number in numbers {
            for suffix in suffixes {
                let s = format!("{number}{suffix}");
                if let Ok(f) = parse_quantity(&s) {
                    assert!(f.is_finite(), "{s}");
                }
            }
        }
    }

    #[test]
    fn displays_units_and_clips_long_values() {
        let q = |s: &str| Quantity::parse(s).unwrap().to_string();
        assert_eq!(q("1.5Gi"), "1610612736");
        assert_eq!(q("500m"), "0.5");
        assert_eq!(q("-1n"), "-0.000000001");
        let long = "x".repeat(1000);
        let message = ParseQuantityError::Syntax(long.clone()).to_string();
        assert!(message.starts_with(&format!("\"{}\"... (1000 characters)", "x".repeat(64))));
        assert!(message.len() < 150, "{message}");
        assert_eq!(
            shown(&long),
            format!("{}... (1000 characters)", "x".repeat(64))
        );
        assert_eq!(shown("2Gi"), "2Gi");
    }
}
