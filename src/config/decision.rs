//! `[decision]`: the listener other proxies ask for decisions (Envoy's rate limit
//! service, forward auth, nginx `auth_request`), its token, its connection limits,
//! and the rules of Envoy descriptors: `[[decision.descriptors]]` naming sluice
//! policies, and envoyproxy/ratelimit's own YAML files (`envoy_config`), read here
//! so that a bad file is a config error with its file and line like any other.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::descriptors::{DescriptorRules, yaml};
use super::diagnostic::{Diagnostic, Diagnostics};
use super::policies::{Plans, Policies};
use super::settings::{
    DEFAULT_H2_MAX_STREAMS, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_HEADER_BYTES,
    int, secret,
};
use super::tls::compile_tls;
use super::values::{duration_of, int_in, socket_addr};
use super::{PlanId, PolicyId, ServerStartup, raw};

/// Descriptors one RLS request may carry by default: Envoy's rate limit actions
/// make a handful per request; thousands are an abuse, not a configuration.
const DEFAULT_MAX_DESCRIPTORS: i64 = 64;
/// Distinct descriptor `limit` overrides by default: a proxy's rate limit actions
/// state a few fixed limits; ever-new ones are a client growing our memory.
const DEFAULT_MAX_OVERRIDES: i64 = 1_024;
/// A decision listener's connections are Envoy's, nginx's and Traefik's pools: a
/// few hundred at most.
const DEFAULT_DECISION_CONNECTIONS: i64 = 1_024;
/// The decision listener's drain: its answers take microseconds.
const DECISION_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// `[decision]`, compiled.
#[derive(Debug, Clone)]
pub struct DecisionConfig {
    /// `listen`: gRPC (h2c, or TLS with `[decision.tls]`) and HTTP/1.1 on one port.
    pub listen: SocketAddr,
    /// `token` (`"env:NAME"` already read): callers send it as `sluice-token`.
    pub token: Option<String>,
    /// The listener's connection limits, timeouts and TLS, as `[server]`'s are.
    pub connections: ServerStartup,
    /// `rate_headers` (default true): RateLimit headers in RLS answers.
    pub rate_headers: bool,
    /// `max_descriptors` (default 64): descriptors one RLS request may carry.
    pub max_descriptors: usize,
    /// `max_overrides` (default 1 024): distinct descriptor `limit` overrides
    /// (domain, unit, requests_per_unit) counted since start, each its own counters.
    pub max_overrides: usize,
    /// `[[decision.descriptors]]`, tried before the YAML rules.
    pub descriptors: Vec<PolicyDescriptor>,
    /// `envoy_config` as written (paths or `dir/*.yaml` patterns).
    pub envoy_config: Vec<String>,
    /// The YAML files `envoy_config` named when the config was read.
    pub envoy_files: Vec<PathBuf>,
    /// Their rules.
    pub rules: Arc<DescriptorRules>,
}

/// `[[decision.descriptors]]`: descriptors of `domain` whose keys are `entries`, in
/// order, counted by `policy` for callers of `plan`.
#[derive(Debug, Clone)]
pub struct PolicyDescriptor {
    /// The domain of the RLS request.
    pub domain: String,
    /// Each entry's key and what its value must be.
    pub entries: Vec<EntryPattern>,
    /// The policy whose limits apply.
    pub policy: PolicyId,
    /// The plan the policy decides as.
    pub plan: PlanId,
}

/// One entry of a `[[decision.descriptors]]`: its key and what its value may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPattern {
    /// The entry's key.
    pub key: String,
    /// What its value must be.
    pub value: ValuePattern,
}

/// What an entry's value must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePattern {
    /// `key`: any value; the values of such entries are the budget.
    Any,
    /// `key=value`.
    Exact(String),
    /// `key=prefix*`: any value starting with the prefix (part of the budget).
    Prefix(String),
}

impl ValuePattern {
    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValuePattern::Any => true,
            ValuePattern::Exact(exact) => exact == value,
            ValuePattern::Prefix(prefix) => value.starts_with(prefix.as_str()),
        }
    }
}

impl PolicyDescriptor {
    /// Whether a descriptor of `domain` with these entries is this one's.
    pub fn matches(&self, domain: &str, entries: &[(&str, &str)]) -> bool {
        self.domain == domain
            && self.entries.len() == entries.len()
            && (self.entries.iter().zip(entries))
                .all(|(pattern, (key, value))| pattern.key == *key && pattern.value.matches(value))
    }
}

/// What `[decision]` compiles with: the config file (relative paths), the plans
/// and the policies.
pub(super) struct Known<'a> {
    pub file: &'a Path,
    pub plans: &'a Plans,
    pub policies: &'a Policies,
}

pub(super) fn compile_decision(
    d: &mut Diagnostics,
    known: &Known<'_>,
    mut raw: raw::Decision,
) -> Option<DecisionConfig> {
    let Some(listen) = raw.listen.as_ref() else {
        let reason = "the decision listener needs an address, e.g. \"127.0.0.1:8081\"";
        d.error(None, "decision.listen", reason);
        return None;
    };
    let listen = socket_addr(d, "decision.listen", listen)?;
    let token = secret(d, "decision.token", raw.token.take());
    let connections = connections(d, known.file, listen, &mut raw);
    let max_descriptors = raw
        .max_descriptors
        .as_ref()
        .and_then(|m| int_in(d, "decision.max_descriptors", m, 1, 10_000))
        .unwrap_or(DEFAULT_MAX_DESCRIPTORS) as usize;
    let max_overrides = (raw.max_overrides.as_ref())
        .and_then(|m| int_in(d, "decision.max_overrides", m, 1, 1_000_000))
        .unwrap_or(DEFAULT_MAX_OVERRIDES) as usize;
    let descriptors = (raw.descriptors.iter().enumerate())
        .filter_map(|(i, entry)| policy_descriptor(d, known, i, entry.get_ref()))
        .collect();
    let envoy_config: Vec<String> = raw
        .envoy_config
        .map(|c| c.into_inner().into_vec())
        .unwrap_or_default();
    let (envoy_files, rules) = read_rules(d, known.file, &envoy_config);
    Some(DecisionConfig {
        listen,
        token,
        connections,
        rate_headers: raw.rate_headers.unwrap_or(true),
        max_descriptors,
        max_overrides,
        descriptors,
        envoy_config,
        envoy_files,
        rules: Arc::new(rules),
    })
}

/// The decision listener's connections: its one address, TLS if any, and its own
/// connection cap, timeouts and sizes.
fn connections(
    d: &mut Diagnostics,
    file: &Path,
    listen: SocketAddr,
    raw: &mut raw::Decision,
) -> ServerStartup {
    let tls = raw.tls.take().map(|tls| {
        if let Some(addrs) = &tls.get_ref().listen {
            let reason = "the decision listener serves TLS on decision.listen";
            d.error(Some(addrs.span()), "decision.tls.listen", reason);
        }
        compile_tls(d, file, tls.into_inner(), "decision.tls")
    });
    let header_timeout = raw.header_timeout.as_ref();
    let idle_timeout = raw.idle_timeout.as_ref();
    ServerStartup {
        listen: vec![listen],
        worker_threads: 1,
        max_connections: int(
            d,
            "decision.max_connections",
            &raw.max_connections,
            1..=10_000_000,
            DEFAULT_DECISION_CONNECTIONS,
        ),
        header_timeout: duration_of(
            d,
            "decision.header_timeout",
            header_timeout,
            DEFAULT_HEADER_TIMEOUT,
        ),
        idle_timeout: duration_of(
            d,
            "decision.idle_timeout",
            idle_timeout,
            DEFAULT_IDLE_TIMEOUT,
        ),
        max_header_bytes: int(
            d,
            "decision.max_header_bytes",
            &raw.max_header_bytes,
            256..=(1 << 20),
            DEFAULT_MAX_HEADER_BYTES,
        ),
        tls,
        h2_max_streams: int(
            d,
            "decision.h2_max_streams",
            &raw.h2_max_streams,
            1..=10_000,
            DEFAULT_H2_MAX_STREAMS,
        ) as u32,
        drain_timeout: DECISION_DRAIN,
    }
}

fn policy_descriptor(
    d: &mut Diagnostics,
    known: &Known<'_>,
    index: usize,
    raw: &raw::DecisionDescriptor,
) -> Option<PolicyDescriptor> {
    let at = format!("decision.descriptors[{index}]");
    let Some(&policy) = known.policies.by_name.get(raw.policy.get_ref()) else {
        let unknown = format!("unknown policy \"{}\"", raw.policy.get_ref());
        d.error(Some(raw.policy.span()), &format!("{at}.policy"), unknown);
        return None;
    };
    let plan = match &raw.plan {
        None => PlanId::ANONYMOUS,
        Some(name) => match known
            .plans
            .names
            .iter()
            .position(|p| **p == **name.get_ref())
        {
            Some(plan) => PlanId(plan as u16),
            None => {
                let unknown = format!("unknown plan \"{}\"", name.get_ref());
                d.error(Some(name.span()), &format!("{at}.plan"), unknown);
                return None;
            }
        },
    };
    if raw.entries.get_ref().is_empty() {
        let reason = "needs at least one entry";
        d.error(Some(raw.entries.span()), &format!("{at}.entries"), reason);
        return None;
    }
    let entries = (raw.entries.get_ref().iter())
        .map(|entry| {
            let (key, value) = match entry.get_ref().split_once('=') {
                None => (entry.get_ref().as_str(), ValuePattern::Any),
                Some((key, value)) => match value.strip_suffix('*') {
                    Some(prefix) => (key, ValuePattern::Prefix(prefix.to_string())),
                    None => (key, ValuePattern::Exact(value.to_string())),
                },
            };
            if key.is_empty() {
                let reason = "an entry is `key` or `key=value`";
                d.error(Some(entry.span()), &format!("{at}.entries"), reason);
            }
            EntryPattern {
                key: key.to_string(),
                value,
            }
        })
        .collect();
    Some(PolicyDescriptor {
        domain: raw.domain.get_ref().clone(),
        entries,
        policy: PolicyId::new(policy),
        plan,
    })
}

/// The files `patterns` name (relative to the config file's directory; `*` in a
/// file name matches any text), and their rules; every problem of every file is a
/// diagnostic with its own file and line.
fn read_rules(
    d: &mut Diagnostics,
    config: &Path,
    patterns: &[String],
) -> (Vec<PathBuf>, DescriptorRules) {
    let dir = config.parent().unwrap_or(Path::new(""));
    let mut files = Vec::new();
    for pattern in patterns {
        match expand(&dir.join(pattern)) {
            Ok(found) if found.is_empty() => {
                let reason = format!("\"{pattern}\" names no file");
                d.warn(None, "decision.envoy_config", reason);
            }
            Ok(found) => files.extend(found),
            Err(reason) => d.error(None, "decision.envoy_config", reason),
        }
    }
    files.dedup();
    let mut texts = Vec::new();
    for file in &files {
        match std::fs::read_to_string(file) {
            Ok(text) => texts.push((file.clone(), text)),
            Err(err) => {
                let reason = format!("cannot read descriptor file: {err}");
                d.list.push(Diagnostic::whole_file(file, "", reason));
            }
        }
    }
    match yaml::read(&texts) {
        Ok(rules) => (files, rules),
        Err(problems) => {
            d.list.extend(problems);
            (files, DescriptorRules::default())
        }
    }
}

/// The files a path names: itself, or with `*` in its file name, the files of its
/// directory that match, sorted.
fn expand(path: &Path) -> Result<Vec<PathBuf>, String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.contains('*') {
        return Ok(vec![path.to_path_buf()]);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let entries =
        std::fs::read_dir(dir).map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_str().is_some_and(|n| wildcard(name, n)))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// Whether `text` matches `pattern`, whose `*`s match any run of characters.
fn wildcard(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| wildcard(rest, &tail[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wildcard;

    #[test]
    fn file_name_patterns_match_like_a_shell() {
        assert!(wildcard("*.yaml", "a.yaml"));
        assert!(wildcard("*.yaml", ".yaml"));
        assert!(!wildcard("*.yaml", "a.yml"));
        assert!(wildcard("rl-*-*.yaml", "rl-a-b.yaml"));
        assert!(!wildcard("rl-*.yaml", "x-a.yaml"));
        assert!(wildcard("exact.yaml", "exact.yaml"));
    }
}
