//! Reading the file's sections, each so that one bad key does not hide the others.
//!
//! serde stops at the first problem of a struct. To report every problem of a file
//! in one pass, a section that fails is read again without the offending entry,
//! until it reads or no entry can be blamed. Each problem is reported with the full
//! key path (`server.idle_timout`), in plain words rather than serde's, and an
//! unknown key with the nearest valid one.

use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeValue, ValueDeserializer};

use super::diagnostic::Diagnostics;

/// A value of the file, with where it is.
pub(super) type Value<'a> = Spanned<DeValue<'a>>;

/// At most this many problems are reported per section.
const MAX_PROBLEMS: usize = 32;

/// Deserialises the section at `key`, reporting every entry that does not fit.
/// Returns what is left once the bad entries are dropped (errors were reported, so
/// the file will not load, but the rest of the section is still checked), or
/// `None` if the section cannot be read at all.
pub(super) fn section<T: DeserializeOwned>(
    d: &mut Diagnostics,
    key: &str,
    mut value: Value,
) -> Option<T> {
    let mut dropped: Vec<String> = Vec::new();
    for _ in 0..MAX_PROBLEMS {
        let err = match T::deserialize(ValueDeserializer::from(value.clone())) {
            Ok(parsed) => return Some(parsed),
            Err(err) => err,
        };
        let message = err.message().trim();
        let span = err.span();
        if let Some(field) = between(message, "missing field `", "`") {
            // A required key we dropped ourselves was reported already.
            if !dropped.iter().any(|name| name == field) {
                d.error(span, key, format!("missing required key `{field}`"));
            }
            return None;
        }
        let Some(span) = span else {
            d.error(None, key, plain(message));
            return None;
        };
        let mut path = String::new();
        if !remove_at(value.get_mut(), &span, &mut path) {
            d.error(Some(span), key, plain(message));
            return None;
        }
        let full = format!("{key}{path}");
        let name = path.rsplit(['.', '[']).next().unwrap_or("").to_string();
        match between(message, "unknown field `", "`") {
            Some(field) => {
                let help = suggestion(field, expected_fields(message));
                d.error_with_help(Some(span), &full, format!("unknown key `{field}`"), help);
            }
            None => d.error(Some(span), &full, plain(message)),
        }
        dropped.push(name);
    }
    None
}

/// The text between `open` and the next `close` in `message`.
fn between<'a>(message: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let rest = &message[message.find(open)? + open.len()..];
    Some(&rest[..rest.find(close)?])
}

/// The valid keys serde listed in an unknown-field message.
fn expected_fields(message: &str) -> Vec<&str> {
    let Some(at) = message.find("expected") else {
        return Vec::new();
    };
    message[at..].split('`').skip(1).step_by(2).collect()
}

/// "did you mean `idle_timeout`?" for the nearest valid key, if one is close.
pub(super) fn suggestion(unknown: &str, valid: Vec<&str>) -> Option<String> {
    let best = valid
        .iter()
        .map(|v| (strsim::jaro_winkler(unknown, v), *v))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, name)) if score >= 0.8 => Some(format!("did you mean `{name}`?")),
        _ if !valid.is_empty() => Some(format!("valid keys: {}", valid.join(", "))),
        _ => None,
    }
}

/// Finds the table entry (or array element) whose key or value is at `span`,
/// removes it, and writes its path relative to `value` (`.tls.cert`, `[2]`).
fn remove_at(value: &mut DeValue, span: &Range<usize>, path: &mut String) -> bool {
    let contains = |outer: Range<usize>| outer.start <= span.start && span.end <= outer.end;
    match value {
        DeValue::Table(table) => {
            let hit = table
                .iter()
                .find(|(k, v)| k.span() == *span || v.span() == *span)
                .map(|(k, _)| k.clone());
            if let Some(k) = hit {
                path.push('.');
                path.push_str(k.get_ref());
                table.remove(&k);
                return true;
            }
            for (k, v) in table.iter_mut() {
                if contains(v.span()) {
                    path.push('.');
                    path.push_str(k.get_ref());
                    return remove_at(v.get_mut(), span, path);
                }
            }
            false
        }
        DeValue::Array(items) => {
            if let Some(i) = items.iter().position(|v| v.span() == *span) {
                path.push_str(&format!("[{i}]"));
                let kept = std::mem::replace(items, toml::de::DeArray::new());
                *items = kept
                    .into_iter()
                    .enumerate()
                    .filter_map(|(j, v)| (j != i).then_some(v))
                    .collect();
                return true;
            }
            for (i, v) in items.iter_mut().enumerate() {
                if contains(v.span()) {
                    path.push_str(&format!("[{i}]"));
                    return remove_at(v.get_mut(), span, path);
                }
            }
            false
        }
        _ => false,
    }
}

/// serde's wording in plain words: "expected an integer, found the string \"5s\"".
fn plain(message: &str) -> String {
    if message.contains("did not match any variant of untagged enum OneOrMany") {
        return "expected a string or an array of strings".to_string();
    }
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    match rest.and_then(|rest| rest.split_once(", expected ")) {
        Some((found, expected)) => {
            format!("expected {}, found {}", kind(expected), found_kind(found))
        }
        None => message.to_string(),
    }
}

/// What serde expected, as a person would say it.
fn kind(expected: &str) -> &str {
    match expected {
        "i64" | "i32" | "u64" | "u32" | "u16" | "u8" | "usize" | "an integer" => "an integer",
        "a boolean" | "bool" => "true or false",
        "a string" | "string" => "a string",
        "a sequence" => "an array",
        e if e.starts_with("struct ") || e == "a map" => "a table",
        other => other,
    }
}

/// What the file held, as a person would say it.
fn found_kind(found: &str) -> String {
    let (kind, value) = found.split_once(' ').unwrap_or((found, ""));
    let value = value.trim_matches('`');
    match kind {
        "string" => format!("the string {value}"),
        "integer" => format!("the integer {value}"),
        "floating" => format!("the number {}", value.trim_start_matches("point ")),
        "boolean" => value.to_string(),
        "sequence" => "an array".to_string(),
        "map" => "a table".to_string(),
        _ => found.to_string(),
    }
}

/// The tables of the array at `key` (`[[routes]]`), each read on its own and named
/// by its path (`routes[2]`).
pub(super) fn array_of<T: DeserializeOwned>(
    d: &mut Diagnostics,
    key: &str,
    value: Value,
) -> Vec<(String, T)> {
    let span = value.span();
    let DeValue::Array(items) = value.into_inner() else {
        d.error(
            Some(span),
            key,
            format!("expected an array of tables ([[{key}]])"),
        );
        return Vec::new();
    };
    items
        .into_iter()
        .enumerate()
        .filter_map(|(i, item)| {
            let path = format!("{key}[{i}]");
            section(d, &path, item).map(|parsed| (path, parsed))
        })
        .collect()
}

/// The entries of the table at `key`, each with its name and where the name is.
pub(super) fn table_entries<'a>(
    d: &mut Diagnostics,
    key: &str,
    value: Value<'a>,
) -> Vec<(Spanned<String>, Value<'a>)> {
    let span = value.span();
    let DeValue::Table(table) = value.into_inner() else {
        d.error(Some(span), key, "expected a table");
        return Vec::new();
    };
    table
        .into_iter()
        .map(|(k, v)| {
            let name = Spanned::new(k.span(), k.get_ref().to_string());
            (name, v)
        })
        .collect()
}

/// The tables of the table at `key` (`[upstreams.NAME]`), each read on its own.
pub(super) fn named_tables<T: DeserializeOwned>(
    d: &mut Diagnostics,
    key: &str,
    value: Value,
) -> Vec<(Spanned<String>, T)> {
    table_entries(d, key, value)
        .into_iter()
        .filter_map(|(name, v)| {
            let path = format!("{key}.{}", name.get_ref());
            section(d, &path, v).map(|parsed| (name, parsed))
        })
        .collect()
}

/// The entries of the table at `key`, unread (a policy's keys are plan names).
pub(super) fn named_values<'a>(
    d: &mut Diagnostics,
    key: &str,
    value: Value<'a>,
) -> Vec<(Spanned<String>, Value<'a>)> {
    table_entries(d, key, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_wording_becomes_plain() {
        assert_eq!(
            plain("invalid type: string \"5s\", expected i64"),
            "expected an integer, found the string \"5s\""
        );
        assert_eq!(
            plain("invalid type: integer `5`, expected a string"),
            "expected a string, found the integer 5"
        );
        assert_eq!(
            plain("invalid type: string \"yes\", expected a boolean"),
            "expected true or false, found the string \"yes\""
        );
    }

    #[test]
    fn the_nearest_key_is_suggested() {
        let valid = vec!["idle_timeout", "header_timeout", "listen"];
        assert_eq!(
            suggestion("idle_timout", valid.clone()).as_deref(),
            Some("did you mean `idle_timeout`?")
        );
        assert_eq!(
            suggestion("zzz", valid).as_deref(),
            Some("valid keys: idle_timeout, header_timeout, listen")
        );
    }
}
