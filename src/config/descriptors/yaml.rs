//! envoyproxy/ratelimit's descriptor files, read: `domain`, nested `descriptors`
//! (`key`, `value`, `rate_limit {unit, requests_per_unit, unlimited, name,
//! replaces}`, `shadow_mode`), every problem with its file, line and key path.
//!
//! The files are the reference service's own, so that a team moves to sluice
//! without rewriting them: the keys it accepts are accepted (`detailed_metric` and
//! `value_to_metric`, which only shape its statistics, are read and have no effect
//! here), and a key it does not know is an error, as a typo must never silently
//! disable a limit.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{DescriptorRule, DescriptorRules, Parent, RuleId, RuleLimit, limit_of, unit};
use crate::config::diagnostic::{Diagnostic, Severity};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    domain: Option<Spanned<String>>,
    #[serde(default)]
    descriptors: Vec<Spanned<Descriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    key: Option<Spanned<String>>,
    value: Option<Spanned<String>>,
    rate_limit: Option<Spanned<RateLimit>>,
    #[serde(default)]
    descriptors: Vec<Spanned<Descriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimit {
    unit: Option<Spanned<String>>,
    requests_per_unit: Option<Spanned<u32>>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Spanned<String>>,
    #[serde(default)]
    replaces: Vec<Spanned<Replace>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Replace {
    name: Spanned<String>,
}

/// Reads every `(file, text)` into one rule set; the problems of all of them, each
/// with its file and line, if any is wrong (a domain in two files is one).
pub(crate) fn read(files: &[(PathBuf, String)]) -> Result<DescriptorRules, Vec<Diagnostic>> {
    let mut rules = DescriptorRules::default();
    let mut problems = Vec::new();
    let mut domains: Vec<(String, PathBuf)> = Vec::new();
    for (path, text) in files {
        let mut reading = Reading {
            path,
            rules: &mut rules,
            problems: &mut problems,
            domain: String::new(),
        };
        let file: File = match serde_saphyr::from_str(text) {
            Ok(file) => file,
            Err(err) => {
                let line = err.location().map_or(0, |l| l.line() as usize);
                let reason = first_line(&err.without_snippet().to_string());
                reading.problem(line, "", reason);
                continue;
            }
        };
        let Some(domain) = file.domain.filter(|d| !d.value.is_empty()) else {
            reading.problem(1, "domain", "a descriptor file needs a domain".into());
            continue;
        };
        if let Some((_, other)) = domains.iter().find(|(d, _)| *d == domain.value) {
            let reason = format!(
                "domain {} is also defined in {}",
                domain.value,
                other.display()
            );
            reading.problem(domain.referenced.line() as usize, "domain", reason);
            continue;
        }
        domains.push((domain.value.clone(), path.clone()));
        reading.domain = domain.value.clone();
        let parent = Parent::Domain(&domain.value);
        reading.level(parent, "", "descriptors", &file.descriptors);
    }
    match problems.is_empty() {
        true => Ok(rules),
        false => Err(problems),
    }
}

/// One file being read into the rule set.
struct Reading<'a> {
    path: &'a Path,
    rules: &'a mut DescriptorRules,
    problems: &'a mut Vec<Diagnostic>,
    domain: String,
}

impl Reading<'_> {
    fn problem(&mut self, line: usize, key: &str, reason: String) {
        self.problems.push(Diagnostic {
            severity: Severity::Error,
            file: self.path.to_path_buf(),
            line,
            key: key.to_string(),
            reason,
            help: None,
            source: None,
        });
    }

    /// The descriptors of one level, under `parent`, whose rule path so far is
    /// `path` and whose key path in the file is `at`.
    fn level(&mut self, parent: Parent<'_>, path: &str, at: &str, list: &[Spanned<Descriptor>]) {
        for (i, spanned) in list.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let line = spanned.referenced.line() as usize;
            let descriptor = &spanned.value;
            let Some(key) = descriptor.key.as_ref().filter(|k| !k.value.is_empty()) else {
                self.problem(
                    line,
                    &format!("{at}.key"),
                    "a descriptor needs a key".into(),
                );
                continue;
            };
            let value = descriptor.value.as_ref().map(|v| v.value.as_str());
            let step = match value {
                Some(value) => format!("{}_{value}", key.value),
                None => key.value.clone(),
            };
            let path = match path {
                "" => step,
                _ => format!("{path}.{step}"),
            };
            let node = match self.rules.add(parent, &key.value, value) {
                Ok(node) => node,
                Err(reason) => {
                    self.problem(key.referenced.line() as usize, &at, reason.into());
                    continue;
                }
            };
            if let Some(rate_limit) = &descriptor.rate_limit {
                let read = self.rate_limit(&at, rate_limit);
                if let Some((limit, name, replaces)) = read {
                    let id = RuleId(self.rules.rules.len() as u32);
                    self.rules.rules.push(DescriptorRule {
                        domain: self.domain.clone(),
                        path: path.clone(),
                        name,
                        limit,
                        shadow: descriptor.shadow_mode,
                        replaces,
                        file: self.path.to_path_buf(),
                        line: rate_limit.referenced.line() as usize,
                    });
                    self.rules.nodes[node].rule = Some(id);
                }
            }
            let at = format!("{at}.descriptors");
            self.level(Parent::Node(node), &path, &at, &descriptor.descriptors);
        }
    }

    /// A `rate_limit`: what it allows, its name and what it replaces.
    fn rate_limit(
        &mut self,
        at: &str,
        spanned: &Spanned<RateLimit>,
    ) -> Option<(RuleLimit, Option<String>, Vec<String>)> {
        let raw = &spanned.value;
        let line = spanned.referenced.line() as usize;
        let at = format!("{at}.rate_limit");
        let name = raw.name.as_ref().map(|n| n.value.clone());
        let replaces = raw.replaces.iter().map(|r| r.value.name.value.clone());
        let replaces: Vec<String> = replaces.collect();
        if raw.unlimited {
            if raw.unit.is_some() || raw.requests_per_unit.is_some() {
                let reason = "unlimited: true takes no unit or requests_per_unit".into();
                self.problem(line, &at, reason);
                return None;
            }
            return Some((RuleLimit::Unlimited, name, replaces));
        }
        let Some(unit_name) = &raw.unit else {
            self.problem(
                line,
                &format!("{at}.unit"),
                "a rate_limit needs a unit".into(),
            );
            return None;
        };
        let window = match unit(&unit_name.value) {
            Ok(window) => window,
            Err(reason) => {
                let line = unit_name.referenced.line() as usize;
                self.problem(line, &format!("{at}.unit"), reason);
                return None;
            }
        };
        let requests = raw.requests_per_unit.as_ref().map_or(0, |r| r.value);
        Some((limit_of(requests, window), name, replaces))
    }
}

/// The first line of a parser's message (the rest repeats the source).
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}
