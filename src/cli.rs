//! The domains of numeric command-line settings, checked once where the flag is parsed, in the
//! user's terms. Each is a parser clap takes as a `value_parser`: an impossible value is refused
//! before any work with the flag and the value as typed (`invalid value '-5' for
//! '--temperature <TEMPERATURE>': must be a finite number ≥ 0`), never passed on to turn into
//! NaN, a panic or a silent clamp. Give such an argument `allow_negative_numbers = true`, so
//! that `--temperature -5` reaches the parser instead of reading as an unknown flag `-5`.
//!
//! ```
//! assert_eq!(kiln::cli::positive("0.5"), Ok(0.5));
//! assert!(kiln::cli::positive("0").unwrap_err().contains("> 0"));
//! assert!(kiln::cli::non_negative("nan").unwrap_err().contains("finite"));
//! assert!(kiln::cli::probability("1.5").is_err());
//! assert_eq!(kiln::cli::count("3"), Ok(3));
//! assert!(kiln::cli::count("0").unwrap_err().contains("at least 1"));
//! ```

/// A finite number.
fn finite(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| "must be a number".to_string())?;
    if !value.is_finite() {
        return Err("must be a finite number".into());
    }
    Ok(value)
}

/// A finite number > 0 (a time step, a learning rate, a cutoff radius).
pub fn positive(text: &str) -> Result<f64, String> {
    finite(text)
        .ok()
        .filter(|value| *value > 0.0)
        .ok_or_else(|| "must be a finite number > 0".into())
}

/// A finite number ≥ 0 (a temperature in K, a loss weight, a skin).
pub fn non_negative(text: &str) -> Result<f64, String> {
    finite(text)
        .ok()
        .filter(|value| *value >= 0.0)
        .ok_or_else(|| "must be a finite number ≥ 0".into())
}

/// A probability mass in (0, 1] (nucleus sampling's top-p).
pub fn probability(text: &str) -> Result<f64, String> {
    finite(text)
        .ok()
        .filter(|value| *value > 0.0 && *value <= 1.0)
        .ok_or_else(|| "must be a number in (0, 1]".into())
}

/// A whole number ≥ 1 (a batch size, a step count, an interval).
pub fn count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(value) => Ok(value),
        Err(_) => Err("must be a whole number ≥ 1".into()),
    }
}

/// `value`, read by one of the parsers above, when it is at most `most` (in `unit`): a stated
/// limit beyond which a setting means nothing, such as an MD time step of a microsecond.
///
/// ```
/// let timestep = |t: &str| kiln::cli::at_most(kiln::cli::positive(t)?, 100.0, "fs");
/// assert_eq!(timestep("0.5"), Ok(0.5));
/// assert_eq!(timestep("1e300").unwrap_err(), "must be at most 100 fs");
/// ```
pub fn at_most(value: f64, most: f64, unit: &str) -> Result<f64, String> {
    if value <= most {
        Ok(value)
    } else {
        Err(format!("must be at most {most} {unit}"))
    }
}

/// A whole number ≥ 1 counted in steps or epochs.
pub fn count_u64(text: &str) -> Result<u64, String> {
    count(text).map(|value| value as u64)
}
