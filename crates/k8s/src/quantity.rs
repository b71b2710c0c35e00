//! Kubernetes quantities (`16Gi`, `512Mi`, `1e9`, `30`) as whole numbers.
//!
//! k8s-openapi carries a `Quantity` as its string; it does not parse it. A slice's memory and
//! compute are whole numbers (bytes, percent), so only that case is needed here: a quantity
//! with a fraction that does not come out whole (`1.5` bytes, `500m`) is an error, as is a
//! negative one or one that overflows 64 bits.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a whole, non-negative Kubernetes quantity (like 16Gi, 512Mi, 1G or 30)")]
pub struct QuantityError(pub String);

const MIB: u64 = 1 << 20;

/// `q` as a whole number.
pub fn parse(q: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() {
        return Err(err());
    }
    // (multiplier numerator, denominator): exact arithmetic on integers.
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().map_err(|_| err())?;
            (10u128.checked_pow(exp).ok_or_else(err)?, 1)
        }
        _ => return Err(err()),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(err());
    }
    let digits = format!("{whole}{frac}");
    let mantissa: u128 = digits.parse().map_err(|_| err())?;
    let scale = 10u128.checked_pow(frac.len() as u32).ok_or_else(err)?;
    let num = mantissa.checked_mul(mul).ok_or_else(err)?;
    let den = scale * div;
    if num % den != 0 {
        return Err(err());
    }
    u64::try_from(num / den).map_err(|_| err())
}

/// Parses a `Quantity`.
pub fn parse_quantity(q: &Quantity) -> Result<u64, QuantityError> {
    parse(&q.0)
}

/// Bytes as a quantity: in `Mi`/`Gi` when they divide it (what people write), else plain.
pub fn bytes(b: u64) -> Quantity {
    let s = if b != 0 && b.is_multiple_of(1 << 30) {
        format!("{}Gi", b >> 30)
    } else if b != 0 && b.is_multiple_of(MIB) {
        format!("{}Mi", b >> 20)
    } else {
        b.to_string()
    };
    Quantity(s)
}

/// A plain number as a quantity.
pub fn plain(n: u64) -> Quantity {
    Quantity(n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_exponent_forms_parse_exactly() {
        assert_eq!(parse("16Gi"), Ok(16 << 30));
        assert_eq!(parse("512Mi"), Ok(512 << 20));
        assert_eq!(parse("1G"), Ok(1_000_000_000));
        assert_eq!(parse("30"), Ok(30));
        assert_eq!(parse("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse("2e3"), Ok(2000));
        assert_eq!(parse("3000m"), Ok(3));
        assert_eq!(parse("+7"), Ok(7));
    }

    #[test]
    fn fractions_negatives_overflow_and_junk_are_errors() {
        for bad in [
            "1.5",
            "500m",
            "-1",
            "",
            "Gi",
            "1Zi",
            "1e99",
            "99999999999Ei",
            "1..2",
        ] {
            assert!(parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn bytes_round_trip() {
        for b in [0, 1, 1 << 20, 3 << 29, 16 << 30, 12_345] {
            assert_eq!(parse_quantity(&bytes(b)), Ok(b));
        }
        assert_eq!(bytes(16 << 30).0, "16Gi");
        assert_eq!(bytes(3 << 20).0, "3Mi");
    }
}
