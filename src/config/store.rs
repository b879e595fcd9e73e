//! `[store]`: where the counters live. The memory engine by default; with
//! `backend = "redis"`, exactly one of `url` (one server), `cluster` (seed nodes of a
//! Redis Cluster) and `sentinel = { master, nodes }` (a Sentinel-managed master), each
//! URL checked when the config loads, and `ca_file` for `rediss://`.

use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::values::{duration_of, int_in};
use super::{Backend, OnError, RedisTarget, StoreConfig, raw};

/// A Redis answer on a healthy LAN takes well under a millisecond; 50 ms means it is
/// not coming, and the request should not wait longer for a rate-limit decision.
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
/// About 100 MB of counters at most for a typical two-limit policy.
const DEFAULT_MAX_KEYS: i64 = 1_000_000;

pub(super) fn compile_store(d: &mut Diagnostics, raw: raw::Store, file: &Path) -> StoreConfig {
    let redis = match &raw.backend {
        None => false,
        Some(b) if b.get_ref() == "memory" => false,
        Some(b) if b.get_ref() == "redis" => true,
        Some(b) => {
            d.error(
                Some(b.span()),
                "store.backend",
                format!(
                    "unknown backend \"{}\" (expected \"memory\" or \"redis\")",
                    b.get_ref()
                ),
            );
            false
        }
    };
    let on_error = match raw
        .on_error
        .as_ref()
        .map(|v| (v.get_ref().as_str(), v.span()))
    {
        None | Some(("local", _)) => OnError::Local,
        Some(("allow", _)) => OnError::Allow,
        Some(("deny", _)) => OnError::Deny,
        Some((other, span)) => {
            d.error(
                Some(span),
                "store.on_error",
                format!("unknown mode \"{other}\" (expected \"local\", \"allow\" or \"deny\")"),
            );
            OnError::Local
        }
    };
    let timeout = duration_of(
        d,
        "store.timeout",
        raw.timeout.as_ref(),
        DEFAULT_STORE_TIMEOUT,
    );
    let dir = file.parent().unwrap_or(Path::new(""));
    let backend = match redis {
        true => compile_redis(d, &raw, dir, on_error, timeout),
        false => {
            unused_by_memory(d, &raw);
            Backend::Memory
        }
    };
    let state_file = raw.state_file.as_ref().and_then(|v| {
        if v.get_ref().trim().is_empty() {
            d.error(Some(v.span()), "store.state_file", "must not be empty");
            return None;
        }
        // Relative paths are relative to the config file, like every path in it.
        Some(dir.join(v.get_ref()))
    });
    let max_keys = raw
        .max_keys
        .as_ref()
        .and_then(|m| int_in(d, "store.max_keys", m, 1, 1 << 32))
        .unwrap_or(DEFAULT_MAX_KEYS) as usize;
    StoreConfig {
        backend,
        max_keys,
        state_file,
    }
}

/// The redis backend: its target, `on_error`, `timeout`, `ca_file` and
/// `wait_replicas` (the memory engine when the target is unusable: the file does
/// not load anyway).
fn compile_redis(
    d: &mut Diagnostics,
    raw: &raw::Store,
    dir: &Path,
    on_error: OnError,
    timeout: Duration,
) -> Backend {
    let ca_file = raw.ca_file.as_ref().map(|ca| {
        let path = dir.join(ca.get_ref());
        if let Err(reason) = crate::tls::pki::roots_from(&path) {
            d.error(Some(ca.span()), "store.ca_file", reason.to_string());
        }
        path
    });
    let wait_replicas = raw
        .wait_replicas
        .as_ref()
        .and_then(|n| int_in(d, "store.wait_replicas", n, 0, 16))
        .unwrap_or(0) as u32;
    match target(d, raw) {
        Some(target) => Backend::Redis {
            target,
            on_error,
            timeout,
            ca_file,
            wait_replicas,
        },
        None => Backend::Memory,
    }
}

/// Warns of each redis setting a memory store ignores.
fn unused_by_memory(d: &mut Diagnostics, raw: &raw::Store) {
    for (key, span) in [
        ("store.url", raw.url.as_ref().map(Spanned::span)),
        ("store.cluster", raw.cluster.as_ref().map(Spanned::span)),
        ("store.sentinel", raw.sentinel.as_ref().map(Spanned::span)),
        ("store.ca_file", raw.ca_file.as_ref().map(Spanned::span)),
        (
            "store.wait_replicas",
            raw.wait_replicas.as_ref().map(Spanned::span),
        ),
        ("store.on_error", raw.on_error.as_ref().map(Spanned::span)),
        ("store.timeout", raw.timeout.as_ref().map(Spanned::span)),
    ] {
        if let Some(span) = span {
            d.warn(Some(span), key, "only used by the redis backend; ignored");
        }
    }
}

/// The one Redis target of a redis backend; `None` (with an error) when there is
/// none, more than one, or a URL the client cannot use.
fn target(d: &mut Diagnostics, raw: &raw::Store) -> Option<RedisTarget> {
    let given: Vec<(&str, std::ops::Range<usize>)> = [
        ("store.url", raw.url.as_ref().map(Spanned::span)),
        ("store.cluster", raw.cluster.as_ref().map(Spanned::span)),
        ("store.sentinel", raw.sentinel.as_ref().map(Spanned::span)),
    ]
    .into_iter()
    .filter_map(|(key, span)| Some((key, span?)))
    .collect();
    match given.as_slice() {
        [] => {
            let span = raw.backend.as_ref().map(|b| b.span());
            d.error_with_help(
                span,
                "store.url",
                "the redis backend needs url = \"redis://host:6379/0\"",
                Some(
                    "or cluster = [\"redis://host:7000\", ...] (seed nodes of a Redis \
                     Cluster), or sentinel = { master = \"name\", nodes = [...] }"
                        .to_string(),
                ),
            );
            return None;
        }
        [_] => {}
        [(first, _), rest @ ..] => {
            for (key, span) in rest {
                d.error(
                    Some(span.clone()),
                    key,
                    format!(
                        "give exactly one of url, cluster and sentinel ({} is already set)",
                        first.trim_start_matches("store.")
                    ),
                );
            }
            return None;
        }
    }
    if let Some(url) = &raw.url {
        return checked(d, "store.url", url).map(RedisTarget::Server);
    }
    if let Some(nodes) = &raw.cluster {
        return urls(d, "store.cluster", nodes).map(RedisTarget::Cluster);
    }
    let spanned = raw.sentinel.as_ref()?;
    let sentinel = spanned.get_ref();
    let master = match &sentinel.master {
        Some(master) if !master.get_ref().trim().is_empty() => {
            Some(master.get_ref().trim().to_string())
        }
        master => {
            let span = master.as_ref().map_or(spanned.span(), Spanned::span);
            d.error(
                Some(span),
                "store.sentinel.master",
                "must name the master the sentinels monitor",
            );
            None
        }
    };
    let Some(nodes) = &sentinel.nodes else {
        d.error(
            Some(spanned.span()),
            "store.sentinel.nodes",
            "must list the sentinels (\"redis://host:port\")",
        );
        return None;
    };
    let nodes = urls(d, "store.sentinel.nodes", nodes)?;
    Some(RedisTarget::Sentinel {
        master: master?,
        nodes,
    })
}

/// A non-empty list of usable URLs.
fn urls(
    d: &mut Diagnostics,
    key: &str,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Option<Vec<String>> {
    if list.get_ref().is_empty() {
        d.error(Some(list.span()), key, "needs at least one redis:// URL");
        return None;
    }
    let urls: Vec<Option<String>> = list
        .get_ref()
        .iter()
        .map(|url| checked(d, key, url))
        .collect();
    urls.into_iter().collect()
}

fn checked(d: &mut Diagnostics, key: &str, url: &Spanned<String>) -> Option<String> {
    match redis_url(url.get_ref()) {
        Ok(()) => Some(url.get_ref().clone()),
        Err(reason) => {
            d.error(Some(url.span()), key, reason);
            None
        }
    }
}

/// Whether the Redis client can use `url` (scheme, host, port, database number).
fn redis_url(url: &str) -> Result<(), String> {
    if redis::parse_redis_url(url).is_none() {
        return Err(format!("\"{url}\" is not a redis:// URL"));
    }
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(drop)
        .map_err(|err| format!("\"{url}\" cannot be used: {err}"))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
