//! Input checks shared by the use cases. Each failure names the offending field.

use cairn_core::{Error, Result};
use chrono::{DateTime, Utc};

/// Trims `text` and checks it is non-empty and at most `max_chars` characters.
pub fn text(field: &str, text: &str, max_chars: usize) -> Result<String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    let length = trimmed.chars().count();
    if length > max_chars {
        return Err(Error::invalid(
            field,
            format!("is {length} characters long; the limit is {max_chars}"),
        ));
    }
    Ok(trimmed.to_owned())
}

/// Playbook steps: 1 to [`MAX_STEPS`], each a text of at most `max_chars` characters
/// (`field` names the list, `field[i]` a step).
pub fn steps(field: &str, steps: &[String], max_chars: usize) -> Result<Vec<String>> {
    if steps.is_empty() || steps.len() > MAX_STEPS {
        return Err(Error::invalid(field, format!("must hold 1-{MAX_STEPS} steps")));
    }
    steps
        .iter()
        .enumerate()
        .map(|(index, step)| text(&format!("{field}[{index}]"), step, max_chars))
        .collect()
}

/// The most steps a playbook holds.
pub const MAX_STEPS: usize = 50;

/// An optional identifier-like value (session id): 1–128 printable characters.
pub fn label(field: &str, value: Option<&str>) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(value) if (1..=128).contains(&value.len()) && !value.chars().any(char::is_control) => {
            Ok(Some(value.to_owned()))
        }
        Some(_) => Err(Error::invalid(field, "must be 1-128 printable characters")),
    }
}

pub fn interval(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Result<()> {
    match (from, to) {
        (Some(from), Some(to)) if from >= to => {
            Err(Error::invalid("valid_to", "must be later than valid_from"))
        }
        _ => Ok(()),
    }
}

pub fn confidence(value: Option<f32>) -> Result<f32> {
    match value {
        None => Ok(1.0),
        // -0.0 compares equal to 0.0 but is written as a negative number, below the
        // documented minimum: refused like any other negative value.
        Some(value) if (0.0..=1.0).contains(&value) && value.is_sign_positive() => Ok(value),
        Some(_) => Err(Error::invalid("confidence", "must be between 0 and 1")),
    }
}
