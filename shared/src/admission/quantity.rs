//! Parsing of Kubernetes resource quantities (`500m`, `2Gi`, `1e3`), enough to compare two
//! quantities of the same resource.

/// A quantity that is not in Kubernetes' quantity syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity (such as 500m, 2Gi or 1e9)")]
pub struct ParseQuantityError(pub String);

/// The value of a quantity as a float (`"1Ki"` is 1024.0, `"500m"` is 0.5).
pub fn parse_quantity(s: &str) -> Result<f64, ParseQuantityError> {
    let err = || ParseQuantityError(s.to_string());
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() || number == "+" || number == "-" {
        return Err(err());
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err())?;
            10f64.powi(e)
        }
        _ => return Err(err()),
    };
    Ok(value * multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_suffixes() {
        assert_eq!(parse_quantity("1Ki"), Ok(1024.0));
        assert_eq!(parse_quantity("500m"), Ok(0.5));
        assert_eq!(parse_quantity("2"), Ok(2.0));
        assert_eq!(parse_quantity("1.5Gi"), Ok(1.5 * 1024f64.powi(3)));
        assert_eq!(parse_quantity("1e3"), Ok(1000.0));
        assert_eq!(parse_quantity("1G"), Ok(1e9));
        assert!(parse_quantity("").is_err());
        assert!(parse_quantity("Gi").is_err());
        assert!(parse_quantity("1GB").is_err());
        assert!(parse_quantity("one").is_err());
    }

    #[test]
    fn compares_across_suffixes() {
        assert!(parse_quantity("1Gi").unwrap() > parse_quantity("1G").unwrap());
        assert!(parse_quantity("1").unwrap() > parse_quantity("999m").unwrap());
    }
}
