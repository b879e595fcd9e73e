//! `[identity] consumers_file`: consumers by the hundred thousand, one JSON object a
//! line, beside `gateway.toml`.
//!
//! Each line holds the fields of a `[[consumers]]` entry: `name`, `plan` (default
//! `registered`), `key_sha256` (never a plain key: the file is meant to be
//! generated, by `sluice hash-key --batch` or the owner's own tooling), and the
//! optional `limits` and `disabled`. Blank lines and lines starting with `#` are
//! skipped. The file is read as part of the config, so it is validated, swapped and
//! kept exactly like it: a bad line makes the whole config invalid (reported with
//! the file, the line and the reason) and the old one keeps serving.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::ConsumerConfig;
use super::diagnostic::{Diagnostic, Diagnostics, Severity};
use super::policies::{DEFAULT_PLAN, Plans};
use crate::limit::{Quota, Window};

/// Errors reported at most; a file generated wrong would otherwise flood the log.
const MAX_ERRORS: usize = 20;

/// One line of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    name: String,
    plan: Option<String>,
    key_sha256: String,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    disabled: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    per_second: Option<u32>,
    per_minute: Option<u32>,
    per_hour: Option<u32>,
    per_day: Option<u32>,
}

/// Reads the consumers of `path` after `existing` (the config's own), reporting
/// problems into `d` against `path` and the line.
pub(super) fn load(
    d: &mut Diagnostics,
    path: &Path,
    plans: &mut Plans,
    existing: &[ConsumerConfig],
) -> Vec<ConsumerConfig> {
    // Read a line at a time: a million consumers' file is over 100 MB of text.
    let file = match std::fs::File::open(path) {
        Ok(file) => std::io::BufReader::with_capacity(1 << 16, file),
        Err(err) => {
            let reason = format!("cannot read consumers file: {err}");
            d.list.push(Diagnostic::whole_file(path, "", reason));
            return Vec::new();
        }
    };
    let names: HashSet<&str> = existing.iter().map(|c| c.name.as_str()).collect();
    let mut keys: HashMap<[u8; 32], usize> = existing
        .iter()
        .enumerate()
        .map(|(i, c)| (c.key_sha256, i))
        .collect();
    let mut out: Vec<ConsumerConfig> = Vec::new();
    let mut errors = 0;
    let mut error = |d: &mut Diagnostics, line: usize, text: &str, key: &str, reason: String| {
        errors += 1;
        if errors <= MAX_ERRORS {
            // The line as written (its start, for a long one), for the caret.
            let shown: String = text.trim_end().chars().take(160).collect();
            let width = shown.len().max(1);
            d.list.push(Diagnostic {
                severity: Severity::Error,
                file: path.to_path_buf(),
                line,
                key: key.to_string(),
                reason,
                help: None,
                source: Some((shown, 0..width)),
            });
        }
    };
    // Lines are parsed in one pass; names are checked against those kept so far, by
    // a 128-bit digest (a million names kept twice would cost tens of MB).
    let mut file_names: HashSet<[u8; 16]> = HashSet::new();
    for (index, raw) in std::io::BufRead::lines(file).enumerate() {
        let number = index + 1;
        let raw = match raw {
            Ok(raw) => raw,
            Err(err) => {
                error(d, number, "", "", format!("cannot read the line: {err}"));
                break;
            }
        };
        let raw = raw.trim();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let line: Line = match serde_json::from_str(raw) {
            Ok(line) => line,
            Err(err) => {
                error(d, number, raw, "", format!("not a consumer: {err}"));
                continue;
            }
        };
        let mut hash = [0u8; 32];
        if hex::decode_to_slice(line.key_sha256.trim(), &mut hash).is_err() {
            error(d, number, raw, "key_sha256", "must be 64 hex digits".into());
            continue;
        }
        if line.name.is_empty() {
            error(d, number, raw, "name", "must not be empty".into());
            continue;
        }
        let plan = line.plan.as_deref().unwrap_or(DEFAULT_PLAN);
        if matches!(
            plan,
            "anonymous" | "total" | "concurrency" | "key" | "on_missing" | ""
        ) {
            error(
                d,
                number,
                raw,
                "plan",
                format!("\"{plan}\" cannot be a consumer's plan"),
            );
            continue;
        }
        let digest: [u8; 32] = Sha256::digest(line.name.as_bytes()).into();
        let name_digest: [u8; 16] = digest[..16].try_into().unwrap_or_default();
        if names.contains(line.name.as_str()) || file_names.contains(&name_digest) {
            error(
                d,
                number,
                raw,
                "name",
                format!("duplicate consumer \"{}\"", line.name),
            );
            continue;
        }
        let limits = match quotas(&line.limits) {
            Ok(limits) => limits,
            Err(window) => {
                error(
                    d,
                    number,
                    raw,
                    &format!("limits.{window}"),
                    "must be at least 1".into(),
                );
                continue;
            }
        };
        if let Some(&other) = keys.get(&hash) {
            let other = existing
                .get(other)
                .or_else(|| out.get(other - existing.len()))
                .map_or("", |c| c.name.as_str());
            error(
                d,
                number,
                raw,
                "key_sha256",
                format!("the same key as consumer \"{other}\""),
            );
            continue;
        }
        keys.insert(hash, existing.len() + out.len());
        file_names.insert(name_digest);
        out.push(ConsumerConfig {
            name: line.name,
            plan: plans.intern(plan),
            key_sha256: hash,
            limits,
            disabled: line.disabled,
        });
    }
    if errors > MAX_ERRORS {
        let reason = format!("{} more errors not shown", errors - MAX_ERRORS);
        d.list.push(Diagnostic::whole_file(path, "", reason));
    }
    out
}

/// The windows a line's `limits` sets; `Err` names one set to 0.
fn quotas(limits: &Limits) -> Result<Vec<Quota>, &'static str> {
    let windows = [
        (Window::Second, limits.per_second),
        (Window::Minute, limits.per_minute),
        (Window::Hour, limits.per_hour),
        (Window::Day, limits.per_day),
    ];
    let mut out = Vec::new();
    for (window, value) in windows {
        let Some(value) = value else { continue };
        let limit = NonZeroU32::new(value).ok_or(window.key())?;
        out.push(Quota { window, limit });
    }
    Ok(out)
}
