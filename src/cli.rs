//! The domains of numeric command-line settings, checked once where the flag is parsed, in the
//! user's terms. Each is a parser clap takes as a `value_parser`: an impossible value is refused
//! before any work with the flag and the value as typed (`invalid value '-5' for
//! '--temperature <TEMPERATURE>': must be a finite number ≥ 0`), never passed on to turn into
//! NaN, a panic or a silent clamp. Give such an argument `allow_negative_numbers = true`, so
//! that `--temperature -5` reaches the parser instead of reading as an unknown flag `-5`.
//!
//! ```
//! assert_eq!(kiln::cli::positive("0.5"), Ok(0.5));
//! assert_eq!(kiln::cli::positive("0").unwrap_err().to_string(), "must be a finite number > 0");
//! assert!(kiln::cli::non_negative("nan").unwrap_err().domain.contains("finite"));
//! assert!(kiln::cli::probability("1.5").is_err());
//! assert_eq!(kiln::cli::count("3"), Ok(3));
//! assert_eq!(kiln::cli::count("0").unwrap_err().domain, "at least 1");
//! ```

/// A value outside its flag's domain: `must be {domain}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be {domain}")]
pub struct OutOfDomain {
    /// What the value must be: `a finite number > 0`, `at most 100 fs`.
    pub domain: String,
}

fn outside(domain: impl Into<String>) -> OutOfDomain {
    OutOfDomain {
        domain: domain.into(),
    }
}

/// A finite number.
fn finite(text: &str) -> Result<f64, OutOfDomain> {
    let value: f64 = text.trim().parse().map_err(|_| outside("a number"))?;
    if !value.is_finite() {
        return Err(outside("a finite number"));
    }
    Ok(value)
}

/// A finite number > 0 (a time step, a learning rate, a cutoff radius).
pub fn positive(text: &str) -> Result<f64, OutOfDomain> {
    finite(text)
        .ok()
        .filter(|value| *value > 0.0)
        .ok_or_else(|| outside("a finite number > 0"))
}

/// A finite number ≥ 0 (a temperature in K, a loss weight, a skin).
pub fn non_negative(text: &str) -> Result<f64, OutOfDomain> {
    finite(text)
        .ok()
        .filter(|value| *value >= 0.0)
        .ok_or_else(|| outside("a finite number ≥ 0"))
}

/// A probability mass in (0, 1] (nucleus sampling's top-p).
pub fn probability(text: &str) -> Result<f64, OutOfDomain> {
    finite(text)
        .ok()
        .filter(|value| *value > 0.0 && *value <= 1.0)
        .ok_or_else(|| outside("a number in (0, 1]"))
}

/// A whole number ≥ 1 (a batch size, a step count, an interval).
pub fn count(text: &str) -> Result<usize, OutOfDomain> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err(outside("at least 1")),
        Ok(value) => Ok(value),
        Err(_) => Err(outside("a whole number ≥ 1")),
    }
}

/// A whole number from 1 to `MOST`: a size flag's stated domain (streams, pixels, layers), so
/// that a typo such as `--size 100000` is refused as it is parsed, not by running out of memory
/// or by a cast that wraps.
///
/// ```
/// let streams = kiln::cli::count_up_to::<256>;
/// assert_eq!(streams("8"), Ok(8));
/// assert_eq!(streams("1000000").unwrap_err().to_string(), "must be a whole number from 1 to 256");
/// assert!(streams("0").is_err());
/// ```
pub fn count_up_to<const MOST: usize>(text: &str) -> Result<usize, OutOfDomain> {
    count(text)
        .ok()
        .filter(|&value| value <= MOST)
        .ok_or_else(|| outside(format!("a whole number from 1 to {MOST}")))
}

/// `value`, read by one of the parsers above, when it is at most `most` (in `unit`): a stated
/// limit beyond which a setting means nothing, such as an MD time step of a microsecond.
///
/// ```
/// let timestep = |t: &str| kiln::cli::at_most(kiln::cli::positive(t)?, 100.0, "fs");
/// assert_eq!(timestep("0.5"), Ok(0.5));
/// assert_eq!(timestep("1e300").unwrap_err().to_string(), "must be at most 100 fs");
/// ```
pub fn at_most(value: f64, most: f64, unit: &str) -> Result<f64, OutOfDomain> {
    if value <= most {
        Ok(value)
    } else {
        Err(outside(format!("at most {most} {unit}")))
    }
}

/// A whole number ≥ 1 counted in steps or epochs.
pub fn count_u64(text: &str) -> Result<u64, OutOfDomain> {
    count(text).map(|value| value as u64)
}
