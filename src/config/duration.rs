//! Duration strings: `"500ms"`, `"2s"`, `"1m"`, `"24h"`, `"1h30m"`.
//!
//! Parsing is jiff's friendly duration format; this module only adds the rule that
//! a config duration is positive, written with a unit, and at most [`LONGEST`].

use std::time::Duration;

/// The longest duration a config may set: a year (366 days). Nothing sluice times
/// needs more, and a longer one (a typo's `99999999999h`) would overflow the timers
/// that wait it out (tokio's reach about 2 years).
pub(crate) const LONGEST: Duration = Duration::from_secs(366 * 86_400);

/// Parses a config duration; the error is a reason fit for a diagnostic.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "duration \"{text}\" needs a unit, e.g. \"{trimmed}s\" or \"{trimmed}ms\""
        ));
    }
    let signed: jiff::SignedDuration = trimmed.parse().map_err(|_| {
        format!("invalid duration \"{text}\" (examples: \"500ms\", \"2s\", \"1m\", \"24h\")")
    })?;
    if signed.as_secs() > LONGEST.as_secs() as i64 {
        return Err(format!(
            "duration \"{text}\" is longer than a year (366 days), the longest a config may set"
        ));
    }
    let duration = Duration::try_from(signed)
        .map_err(|_| format!("duration \"{text}\" must not be negative"))?;
    if duration.is_zero() {
        return Err(format!("duration \"{text}\" must be greater than zero"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
    }

    #[test]
    fn rejects_bare_numbers_garbage_and_zero() {
        assert!(parse("30").unwrap_err().contains("needs a unit"));
        assert!(parse("soon").unwrap_err().contains("invalid duration"));
        assert!(parse("0s").unwrap_err().contains("greater than zero"));
        assert!(parse("-2s").is_err());
    }

    #[test]
    fn rejects_durations_past_a_year() {
        assert_eq!(parse("8784h"), Ok(LONGEST));
        for long in ["99999999999h", "8785h", "527041m", "8784h1s"] {
            let err = parse(long).unwrap_err();
            assert!(err.contains("longer than a year"), "{long}: {err}");
        }
    }
}
