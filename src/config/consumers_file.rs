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

use std::borrow::Cow;
use std::num::NonZeroU32;
use std::path::Path;

use serde::Deserialize;

use super::ConsumerConfig;
use super::consumer_index::{ConsumerIndex, Duplicate, Field};
use super::consumers::billing_anchor;
use super::consumers::caller_name_problem;
use super::diagnostic::{Diagnostic, Diagnostics, Severity};
use super::policies::{DEFAULT_PLAN, Plans, is_plan_name};
use crate::limit::{Quota, Window};

/// Errors reported at most; a file generated wrong would otherwise flood the log.
const MAX_ERRORS: usize = 20;

/// Consumers the list is sized for at most before the first line is read.
const RESERVED_AT_MOST: usize = 1 << 22;

/// Consumers a config holds at most: their indexes are 32-bit.
const MAX_CONSUMERS: usize = u32::MAX as usize;

/// One line of the file; its strings borrowed from the line where they can be (a
/// string with an escape in it cannot), so parsing one allocates only the name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow)]
    plan: Option<Text<'a>>,
    #[serde(borrow)]
    key_sha256: Text<'a>,
    #[serde(default)]
    limits: OwnLimits,
    #[serde(default)]
    disabled: bool,
    #[serde(borrow)]
    billing_anchor: Option<Text<'a>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnLimits {
    per_second: Option<u32>,
    per_minute: Option<u32>,
    per_hour: Option<u32>,
    per_day: Option<u32>,
    per_month: Option<u32>,
    per_year: Option<u32>,
}

/// A string of a line: borrowed from it unless it holds an escape. (serde borrows
/// a `Cow` field, but not one inside an `Option`.)
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(text.to_string())))
            }
            fn visit_string<E>(self, text: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// The shortest line that names a consumer: `{"name":"x","key_sha256":"` and 64 hex
/// digits and `"}` (a bound on the consumers a file of a given size can hold).
const SHORTEST_LINE: u64 = 90;

/// Appends the consumers of `path` to `consumers` (the config's own), reporting
/// problems into `d` against `path` and the line; returns how many it appended, and
/// the index of them all (which the identifier uses as it is).
///
/// Each line goes straight into the list, sized once from the file's length so it
/// is never copied while it grows (the pages it does not fill are never touched);
/// duplicate names and keys are found once all are read, by building the index
/// (which holds only positions in the list), and reported at their lines.
pub(super) fn load(
    d: &mut Diagnostics,
    path: &Path,
    plans: &mut Plans,
    consumers: &mut Vec<ConsumerConfig>,
) -> (usize, ConsumerIndex) {
    // Read a line at a time: a million consumers' file is over 100 MB of text.
    let opened = std::fs::File::open(path).and_then(|file| Ok((file.metadata()?.len(), file)));
    let (length, file) = match opened {
        Ok((length, file)) => (length, std::io::BufReader::with_capacity(1 << 16, file)),
        Err(err) => {
            let reason = format!("cannot read consumers file: {err}");
            d.list.push(Diagnostic::whole_file(path, "", reason));
            return (0, ConsumerIndex::new(consumers));
        }
    };
    let existing = consumers.len();
    // Capped, and only if it can be had: a huge file of anything else must not
    // make the gateway ask for memory it cannot get (the list then grows as usual).
    let most = usize::try_from(length / SHORTEST_LINE + 1).unwrap_or(usize::MAX);
    let _ = consumers.try_reserve_exact(most.min(RESERVED_AT_MOST));
    // The line of each consumer read, for the duplicates found once all are read.
    let mut lines: Vec<u32> = Vec::new();
    let mut errors = Errors::default();
    // One buffer for every line, so reading one allocates nothing.
    let mut file = file;
    let mut buffer = Vec::with_capacity(256);
    for number in 1.. {
        buffer.clear();
        match std::io::BufRead::read_until(&mut file, b'\n', &mut buffer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) => {
                errors.add(path, number, "", "", format!("cannot read the line: {err}"));
                break;
            }
        }
        let raw = match std::str::from_utf8(&buffer) {
            Ok(raw) => raw.trim(),
            Err(_) => {
                let shown = String::from_utf8_lossy(&buffer);
                errors.add(path, number, &shown, "", "not UTF-8 text".into());
                continue;
            }
        };
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        match consumer(raw, plans) {
            Ok(_) if consumers.len() >= MAX_CONSUMERS => {
                let reason = "more consumers than a config holds".into();
                errors.add(path, number, raw, "", reason);
                break;
            }
            Ok(consumer) => {
                consumers.push(consumer);
                lines.push(u32::try_from(number).unwrap_or(u32::MAX));
            }
            Err((key, reason)) => errors.add(path, number, raw, key, reason),
        }
    }
    let (index, duplicates) = ConsumerIndex::build(consumers);
    let read = Read {
        existing,
        lines: &lines,
    };
    report_duplicates(path, consumers, &duplicates, read, &mut errors);
    errors.report(d, path);
    (consumers.len() - existing, index)
}

/// Where the file's consumers are: after the `existing` ones of `[[consumers]]`, each
/// from its line of the file.
#[derive(Clone, Copy)]
struct Read<'a> {
    existing: usize,
    lines: &'a [u32],
}

/// Reports each consumer of the file whose name or key an earlier one has, with its
/// line.
fn report_duplicates(
    path: &Path,
    consumers: &[ConsumerConfig],
    duplicates: &[Duplicate],
    read: Read<'_>,
    errors: &mut Errors,
) {
    let existing = read.existing;
    // Duplicates among `[[consumers]]` are the config's to report, not the file's.
    let duplicates: Vec<_> = duplicates.iter().filter(|dup| dup.at >= existing).collect();
    if !duplicates.is_empty() {
        let line_of = |i: usize| read.lines[i - existing] as usize;
        let wanted = duplicates
            .iter()
            .take(MAX_ERRORS)
            .map(|dup| line_of(dup.at));
        let texts = line_texts(path, wanted.collect());
        for dup in &duplicates {
            let (line, of) = (line_of(dup.at), &consumers[dup.of].name);
            let text = texts.get(&line).map_or("", String::as_str);
            match dup.field {
                Field::Name => errors.add(
                    path,
                    line,
                    text,
                    "name",
                    format!("duplicate consumer \"{of}\""),
                ),
                Field::Key => errors.add(
                    path,
                    line,
                    text,
                    "key_sha256",
                    format!("the same key as consumer \"{of}\""),
                ),
            }
        }
    }
}

/// The consumer a line describes, or the key at fault and why.
fn consumer(raw: &str, plans: &mut Plans) -> Result<ConsumerConfig, (&'static str, String)> {
    let line: Line =
        serde_json::from_str(raw).map_err(|err| ("", format!("not a consumer: {err}")))?;
    let hash = ConsumerConfig::key_hash(&line.key_sha256.0)
        .ok_or(("key_sha256", "must be 64 hex digits".to_string()))?;
    let name = line.name.0;
    if let Some(problem) = caller_name_problem(&name) {
        return Err(("name", problem));
    }
    let plan = line.plan.as_ref().map_or(DEFAULT_PLAN, |plan| &*plan.0);
    if !is_plan_name(plan) {
        return Err(("plan", format!("\"{plan}\" cannot be a consumer's plan")));
    }
    let limits =
        quotas(&line.limits).map_err(|window| (window, "must be at least 1".to_string()))?;
    let anchor = match &line.billing_anchor {
        Some(date) => Some(billing_anchor(&date.0).map_err(|why| ("billing_anchor", why))?),
        None => None,
    };
    Ok(ConsumerConfig {
        name: name.into_owned(),
        plan: plans.intern(plan),
        key_sha256: hash,
        limits,
        disabled: line.disabled,
        anchor,
    })
}

/// A file's errors: the first [`MAX_ERRORS`] by line are reported, then how many
/// more there were.
#[derive(Default)]
struct Errors {
    shown: Vec<Diagnostic>,
    count: usize,
}

impl Errors {
    fn add(&mut self, path: &Path, line: usize, text: &str, key: &str, reason: String) {
        self.count += 1;
        // Lines come in order, except the duplicates found after them all: only
        // the lowest lines can be among the first shown.
        if self.shown.len() >= MAX_ERRORS && self.shown.iter().all(|shown| shown.line < line) {
            return;
        }
        // The line as written (its start, for a long one), for the caret.
        let shown: String = text.trim_end().chars().take(160).collect();
        let width = shown.len().max(1);
        self.shown.push(Diagnostic {
            severity: Severity::Error,
            file: path.to_path_buf(),
            line,
            key: key.to_string(),
            reason,
            help: None,
            source: Some((shown, 0..width)),
        });
        if self.shown.len() > MAX_ERRORS {
            self.shown.sort_by_key(|shown| shown.line);
            self.shown.truncate(MAX_ERRORS);
        }
    }

    fn report(mut self, d: &mut Diagnostics, path: &Path) {
        self.shown.sort_by_key(|shown| shown.line);
        d.list.append(&mut self.shown);
        if self.count > MAX_ERRORS {
            let reason = format!("{} more errors not shown", self.count - MAX_ERRORS);
            d.list.push(Diagnostic::whole_file(path, "", reason));
        }
    }
}

/// The text of lines `wanted` of `path` (read again: only the lines of errors
/// found after reading them all need it).
fn line_texts(
    path: &Path,
    wanted: std::collections::BTreeSet<usize>,
) -> std::collections::HashMap<usize, String> {
    let mut texts = std::collections::HashMap::new();
    let Some(&last) = wanted.last() else {
        return texts;
    };
    let Ok(file) = std::fs::File::open(path) else {
        return texts;
    };
    let reader = std::io::BufRead::split(std::io::BufReader::new(file), b'\n');
    for (number, line) in (1..=last).zip(reader) {
        let Ok(line) = line else { break };
        if wanted.contains(&number) {
            texts.insert(number, String::from_utf8_lossy(&line).trim().to_string());
        }
    }
    texts
}

/// The windows a line's `limits` sets; `Err` names one set to 0.
fn quotas(limits: &OwnLimits) -> Result<Vec<Quota>, &'static str> {
    let windows = [
        (Window::Second, limits.per_second),
        (Window::Minute, limits.per_minute),
        (Window::Hour, limits.per_hour),
        (Window::Day, limits.per_day),
        (Window::Month, limits.per_month),
        (Window::Year, limits.per_year),
    ];
    let mut out = Vec::new();
    for (window, value) in windows {
        let Some(value) = value else { continue };
        let limit = NonZeroU32::new(value).ok_or(window.key())?;
        out.push(Quota { window, limit });
    }
    Ok(out)
}
