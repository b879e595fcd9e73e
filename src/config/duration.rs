//! Duration strings: `"500ms"`, `"2s"`, `"1m"`, `"24h"`, `"1h30m"`.
//!
//! Parsing is jiff's friendly duration format; this module only adds the rule that
//! a config duration is positive and written with a unit.

use std::time::Duration;

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
}
