//! `compile`: raw sections -> [`Config`], collecting every diagnostic.
//!
//! Each top-level section (and each route, consumer, upstream and policy) is
//! deserialised on its own, so one typo does not hide the errors after it. Cross
//! checks (unknown names, plans missing from a policy, duplicate or shadowed routes)
//! run once every section has been read.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::diagnostic::Diagnostics;
use super::{
    AccessConfig, AdminConfig, Backend, Config, ConfigError, ConsumerConfig, DayMode,
    IdentityConfig, PlanId, PlanRule, PolicyConfig, RouteConfig, RouteTarget, ServerConfig,
    StoreConfig, UpstreamConfig, duration, raw,
};
use crate::limit::{Quota, Window};

// Defaults, with the reason beside each.
/// Long enough for a slow mobile client to send its headers, short enough to cut slowloris.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive connections idle longer than this are closed (nginx uses 75 s, Envoy 1 h).
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's large_client_header_buffers default (4 x 8 KiB) is in the same range.
const DEFAULT_MAX_HEADER_BYTES: i64 = 16_384;
const DEFAULT_MAX_CONNECTIONS: i64 = 10_000;
/// About 100 MB of counters at most for a typical two-limit policy.
const DEFAULT_MAX_KEYS: i64 = 1_000_000;
/// IPv6 end sites usually get a /64: keying finer lets one host rotate addresses freely.
const DEFAULT_IPV6_PREFIX: i64 = 64;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
const DEFAULT_API_KEY_HEADER: &str = "x-api-key";

pub(crate) fn compile(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let mut d = Diagnostics::new(path, text);
    let root = match DeTable::parse(text) {
        Ok(root) => root.into_inner(),
        Err(err) => {
            d.toml("", &err);
            return Err(ConfigError {
                diagnostics: d.finish(),
            });
        }
    };
    let mut raw = RawFile::default();
    for (key, value) in root {
        let name = key.get_ref().as_ref();
        match name {
            "server" => raw.server = section(&mut d, name, value),
            "admin" => raw.admin = section(&mut d, name, value),
            "identity" => raw.identity = section(&mut d, name, value),
            "store" => raw.store = section(&mut d, name, value),
            "limits" => raw.limits = section(&mut d, name, value),
            "access" => raw.access = section(&mut d, name, value),
            "ban" => {
                let span = value.span();
                if let Some(ban) = section::<raw::Ban>(&mut d, name, value) {
                    check_ban(&mut d, &ban);
                    raw.ban = Some(span);
                }
            }
            "upstreams" => raw.upstreams = named_tables(&mut d, name, value),
            "policies" => raw.policies = named_values(&mut d, name, value),
            "consumers" => raw.consumers = array_of(&mut d, name, value),
            "routes" => raw.routes = array_of(&mut d, name, value),
            other => d.error(
                Some(key.span()),
                other,
                "unknown section (expected server, admin, identity, store, limits, access, \
                 ban, upstreams, policies, consumers or routes)",
            ),
        }
    }
    if let Some(span) = raw.ban.clone() {
        d.warn(
            Some(span),
            "ban",
            "automatic bans are not supported yet; this section is ignored",
        );
    }

    let server = compile_server(&mut d, raw.server.unwrap_or_default());
    let admin = compile_admin(&mut d, raw.admin.unwrap_or_default());
    let identity = compile_identity(&mut d, raw.identity.unwrap_or_default());
    let store = compile_store(&mut d, raw.store.unwrap_or_default());
    let day = compile_limits(&mut d, raw.limits.unwrap_or_default());
    let access = compile_access(&mut d, raw.access.unwrap_or_default());
    let upstreams = compile_upstreams(&mut d, raw.upstreams);
    let mut plans = Plans::default();
    let consumers = compile_consumers(&mut d, &mut plans, raw.consumers);
    let policies = compile_policies(&mut d, &mut plans, raw.policies);
    let routes = compile_routes(&mut d, &upstreams, &policies, raw.routes);
    check_consumer_plans(&mut d, &plans, &consumers, &policies.list, &routes);

    let has_errors = d.has_errors();
    let diagnostics = d.finish();
    if has_errors {
        return Err(ConfigError { diagnostics });
    }
    Ok(Config {
        file: path.to_path_buf(),
        server,
        admin,
        identity,
        store,
        day,
        access,
        upstreams: upstreams.list,
        plans: plans.names,
        policies: policies.list.into_iter().map(|(_, p)| p).collect(),
        consumers,
        routes: routes.into_iter().map(|(_, r)| r).collect(),
        warnings: diagnostics,
    })
}

#[derive(Default)]
struct RawFile<'a> {
    server: Option<raw::Server>,
    admin: Option<raw::Admin>,
    identity: Option<raw::Identity>,
    store: Option<raw::Store>,
    limits: Option<raw::Limits>,
    access: Option<raw::Access>,
    ban: Option<std::ops::Range<usize>>,
    upstreams: Vec<(Spanned<String>, raw::Upstream)>,
    policies: Vec<(Spanned<String>, Value<'a>)>,
    consumers: Vec<(String, raw::Consumer)>,
    routes: Vec<(String, raw::Route)>,
}

type Value<'a> = Spanned<DeValue<'a>>;

/// Deserialises one section; a failure becomes a diagnostic and `None`.
fn section<T: DeserializeOwned>(d: &mut Diagnostics, key: &str, value: Value) -> Option<T> {
    match T::deserialize(ValueDeserializer::from(value)) {
        Ok(parsed) => Some(parsed),
        Err(err) => {
            d.toml(key, &err);
            None
        }
    }
}

fn array_of<T: DeserializeOwned>(d: &mut Diagnostics, key: &str, value: Value) -> Vec<(String, T)> {
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

fn table_entries<'a>(
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

fn named_tables<T: DeserializeOwned>(
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

fn named_values<'a>(
    d: &mut Diagnostics,
    key: &str,
    value: Value<'a>,
) -> Vec<(Spanned<String>, Value<'a>)> {
    table_entries(d, key, value)
}

// ---- scalar helpers ---------------------------------------------------------

fn int_in(d: &mut Diagnostics, key: &str, value: &Spanned<i64>, min: i64, max: i64) -> Option<i64> {
    let v = *value.get_ref();
    if v < min || v > max {
        d.error(
            Some(value.span()),
            key,
            format!("must be between {min} and {max}, got {v}"),
        );
        return None;
    }
    Some(v)
}

fn duration_of(
    d: &mut Diagnostics,
    key: &str,
    value: Option<&Spanned<String>>,
    default: Duration,
) -> Duration {
    match value {
        None => default,
        Some(v) => duration::parse(v.get_ref()).unwrap_or_else(|reason| {
            d.error(Some(v.span()), key, reason);
            default
        }),
    }
}

fn socket_addr(d: &mut Diagnostics, key: &str, value: &Spanned<String>) -> Option<SocketAddr> {
    value
        .get_ref()
        .parse()
        .map_err(|_| {
            d.error(
                Some(value.span()),
                key,
                format!(
                    "\"{}\" is not an address:port such as \"0.0.0.0:8080\"",
                    value.get_ref()
                ),
            )
        })
        .ok()
}

fn cidr(d: &mut Diagnostics, key: &str, value: &Spanned<String>) -> Option<IpNet> {
    let text = value.get_ref().trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| {
            d.error(
                Some(value.span()),
                key,
                format!("\"{text}\" is not a CIDR such as \"10.0.0.0/8\" or an IP address"),
            )
        })
        .ok()
}

fn cidrs(d: &mut Diagnostics, key: &str, values: Option<Vec<Spanned<String>>>) -> Vec<IpNet> {
    values
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, v)| cidr(d, &format!("{key}[{i}]"), v))
        .collect()
}

// ---- sections ---------------------------------------------------------------

fn compile_server(d: &mut Diagnostics, raw: raw::Server) -> ServerConfig {
    let listen = match raw.listen {
        None => vec![
            DEFAULT_LISTEN
                .parse()
                .expect("default listen address parses"),
        ],
        Some(listen) => {
            let span = listen.span();
            let addrs: Vec<_> = listen
                .into_inner()
                .into_vec()
                .into_iter()
                .filter_map(|a| socket_addr(d, "server.listen", &Spanned::new(span.clone(), a)))
                .collect();
            if addrs.is_empty() {
                d.error(Some(span), "server.listen", "needs at least one address");
            }
            addrs
        }
    };
    if let Some(tls) = &raw.tls {
        let raw::Tls { cert, key } = tls.get_ref();
        d.error(
            Some(tls.span()),
            "server.tls",
            format!("TLS termination (cert {cert}, key {key}) is not supported yet; terminate TLS in front of sluice"),
        );
    }
    let int = |d: &mut Diagnostics, key, v: &Option<Spanned<i64>>, min, max, default| {
        v.as_ref()
            .and_then(|v| int_in(d, key, v, min, max))
            .unwrap_or(default) as usize
    };
    ServerConfig {
        listen,
        header_timeout: duration_of(
            d,
            "server.header_timeout",
            raw.header_timeout.as_ref(),
            DEFAULT_HEADER_TIMEOUT,
        ),
        idle_timeout: duration_of(
            d,
            "server.idle_timeout",
            raw.idle_timeout.as_ref(),
            DEFAULT_IDLE_TIMEOUT,
        ),
        max_header_bytes: int(
            d,
            "server.max_header_bytes",
            &raw.max_header_bytes,
            1024,
            1 << 20,
            DEFAULT_MAX_HEADER_BYTES,
        ),
        max_connections: int(
            d,
            "server.max_connections",
            &raw.max_connections,
            1,
            10_000_000,
            DEFAULT_MAX_CONNECTIONS,
        ),
        worker_threads: int(d, "server.worker_threads", &raw.worker_threads, 0, 1024, 0),
    }
}

/// `[ban]` is validated so that mistakes surface now, though bans are not enforced yet.
fn check_ban(d: &mut Diagnostics, ban: &raw::Ban) {
    if let Some(after) = &ban.after {
        int_in(d, "ban.after", after, 1, 1_000_000_000);
    }
    duration_of(d, "ban.within", ban.within.as_ref(), Duration::ZERO);
    duration_of(d, "ban.duration", ban.duration.as_ref(), Duration::ZERO);
}

fn compile_admin(d: &mut Diagnostics, raw: raw::Admin) -> AdminConfig {
    let listen = raw
        .listen
        .as_ref()
        .and_then(|l| socket_addr(d, "admin.listen", l))
        .unwrap_or_else(|| {
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("default admin address parses")
        });
    let token = raw.token.and_then(|token| {
        let text = token.get_ref();
        match text.strip_prefix("env:") {
            None if text.is_empty() => {
                d.error(Some(token.span()), "admin.token", "must not be empty");
                None
            }
            None => Some(text.clone()),
            Some(var) => match std::env::var(var) {
                Ok(value) if !value.is_empty() => Some(value),
                _ => {
                    d.error(
                        Some(token.span()),
                        "admin.token",
                        format!("environment variable {var} is not set or empty"),
                    );
                    None
                }
            },
        }
    });
    AdminConfig { listen, token }
}

fn compile_identity(d: &mut Diagnostics, raw: raw::Identity) -> IdentityConfig {
    let api_key_header = match &raw.api_key_header {
        None => HeaderName::from_static(DEFAULT_API_KEY_HEADER),
        Some(h) => HeaderName::try_from(h.get_ref().to_ascii_lowercase()).unwrap_or_else(|_| {
            d.error(
                Some(h.span()),
                "identity.api_key_header",
                format!("\"{}\" is not a valid header name", h.get_ref()),
            );
            HeaderName::from_static(DEFAULT_API_KEY_HEADER)
        }),
    };
    let ipv6_prefix = raw
        .ipv6_prefix
        .as_ref()
        .and_then(|p| int_in(d, "identity.ipv6_prefix", p, 1, 128))
        .unwrap_or(DEFAULT_IPV6_PREFIX) as u8;
    IdentityConfig {
        api_key_header,
        trusted_proxies: cidrs(d, "identity.trusted_proxies", raw.trusted_proxies),
        ipv6_prefix,
    }
}

fn compile_store(d: &mut Diagnostics, raw: raw::Store) -> StoreConfig {
    let backend = match &raw.backend {
        None => Backend::Memory,
        Some(b) if b.get_ref() == "memory" => Backend::Memory,
        Some(b) if b.get_ref() == "redis" => {
            d.error(
                Some(b.span()),
                "store.backend",
                "the redis backend is not supported yet; use \"memory\"",
            );
            Backend::Memory
        }
        Some(b) => {
            d.error(
                Some(b.span()),
                "store.backend",
                format!(
                    "unknown backend \"{}\" (expected \"memory\" or \"redis\")",
                    b.get_ref()
                ),
            );
            Backend::Memory
        }
    };
    for (key, value) in [("store.url", &raw.url), ("store.on_error", &raw.on_error)] {
        if let Some(v) = value {
            d.warn(
                Some(v.span()),
                key,
                "only used by the redis backend; ignored",
            );
        }
    }
    if let Some(v) = &raw.state_file {
        d.warn(
            Some(v.span()),
            "store.state_file",
            "state files are not supported yet; counters start empty after a restart",
        );
    }
    let max_keys = raw
        .max_keys
        .as_ref()
        .and_then(|m| int_in(d, "store.max_keys", m, 1, 1 << 32))
        .unwrap_or(DEFAULT_MAX_KEYS) as usize;
    StoreConfig { backend, max_keys }
}

fn compile_limits(d: &mut Diagnostics, raw: raw::Limits) -> DayMode {
    let zone = raw.timezone.as_ref().and_then(|tz| {
        jiff::tz::TimeZone::get(tz.get_ref())
            .map_err(|_| {
                d.error(
                    Some(tz.span()),
                    "limits.timezone",
                    format!("unknown IANA time zone \"{}\"", tz.get_ref()),
                )
            })
            .ok()
    });
    match raw.day.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        None | Some(("sliding", _)) => {
            if let Some(tz) = &raw.timezone {
                d.warn(
                    Some(tz.span()),
                    "limits.timezone",
                    "only used with day = \"calendar\"; ignored",
                );
            }
            DayMode::Sliding
        }
        Some(("calendar", _)) => DayMode::Calendar(zone.unwrap_or(jiff::tz::TimeZone::UTC)),
        Some((other, span)) => {
            d.error(
                Some(span),
                "limits.day",
                format!("unknown day mode \"{other}\" (expected \"sliding\" or \"calendar\")"),
            );
            DayMode::Sliding
        }
    }
}

fn compile_access(d: &mut Diagnostics, raw: raw::Access) -> AccessConfig {
    AccessConfig {
        deny: cidrs(d, "access.deny", raw.deny),
        exempt: cidrs(d, "access.exempt", raw.exempt),
    }
}

struct Upstreams {
    list: Vec<UpstreamConfig>,
    by_name: HashMap<String, usize>,
}

fn compile_upstreams(d: &mut Diagnostics, raw: Vec<(Spanned<String>, raw::Upstream)>) -> Upstreams {
    let mut list = Vec::new();
    let mut by_name = HashMap::new();
    for (name, upstream) in raw {
        let key = format!("upstreams.{}", name.get_ref());
        let mut targets = Vec::new();
        for (i, target) in upstream.targets.get_ref().iter().enumerate() {
            match parse_target(target.get_ref()) {
                Ok(uri) => targets.push(uri),
                Err(reason) => d.error(Some(target.span()), &format!("{key}.targets[{i}]"), reason),
            }
        }
        if upstream.targets.get_ref().is_empty() {
            d.error(
                Some(upstream.targets.span()),
                &format!("{key}.targets"),
                "needs at least one target",
            );
        }
        let connect_timeout = duration_of(
            d,
            &format!("{key}.connect_timeout"),
            upstream.connect_timeout.as_ref(),
            DEFAULT_CONNECT_TIMEOUT,
        );
        let timeout = duration_of(
            d,
            &format!("{key}.timeout"),
            upstream.timeout.as_ref(),
            DEFAULT_UPSTREAM_TIMEOUT,
        );
        by_name.insert(name.get_ref().clone(), list.len());
        list.push(UpstreamConfig {
            name: name.into_inner(),
            targets,
            connect_timeout,
            timeout,
        });
    }
    Upstreams { list, by_name }
}

/// An upstream target: `http://host:port` with an optional base path.
fn parse_target(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("\"{text}\" is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(format!("\"{text}\": https upstreams are not supported yet")),
        _ => return Err(format!("\"{text}\" must start with http://")),
    }
    if uri.authority().is_none() {
        return Err(format!("\"{text}\" has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("\"{text}\" must not have a query string"));
    }
    Ok(uri)
}

/// Plan names in first-seen order; `anonymous` is always [`PlanId::ANONYMOUS`].
struct Plans {
    names: Vec<Arc<str>>,
}

impl Default for Plans {
    fn default() -> Self {
        Plans {
            names: vec![Arc::from("anonymous")],
        }
    }
}

impl Plans {
    fn intern(&mut self, name: &str) -> PlanId {
        let index = match self.names.iter().position(|n| &**n == name) {
            Some(index) => index,
            None => {
                self.names.push(Arc::from(name));
                self.names.len() - 1
            }
        };
        PlanId(index as u16)
    }
}

fn compile_consumers(
    d: &mut Diagnostics,
    plans: &mut Plans,
    raw: Vec<(String, raw::Consumer)>,
) -> Vec<ConsumerConfig> {
    let mut seen_names = HashSet::new();
    let mut seen_keys: HashMap<[u8; 32], String> = HashMap::new();
    let mut out = Vec::new();
    for (key, consumer) in raw {
        let name = consumer.name.get_ref().clone();
        if name.is_empty() {
            d.error(
                Some(consumer.name.span()),
                &format!("{key}.name"),
                "must not be empty",
            );
        } else if !seen_names.insert(name.clone()) {
            d.error(
                Some(consumer.name.span()),
                &format!("{key}.name"),
                format!("duplicate consumer \"{name}\""),
            );
        }
        let plan = match &consumer.plan {
            Some(p) if p.get_ref() == "anonymous" => {
                d.error(
                    Some(p.span()),
                    &format!("{key}.plan"),
                    "\"anonymous\" is the plan of callers without a key; pick another name",
                );
                continue;
            }
            Some(p) if matches!(p.get_ref().as_str(), "total" | "concurrency" | "") => {
                d.error(
                    Some(p.span()),
                    &format!("{key}.plan"),
                    format!(
                        "\"{}\" is a reserved policy key, not a plan name",
                        p.get_ref()
                    ),
                );
                continue;
            }
            Some(p) => plans.intern(p.get_ref()),
            None => plans.intern("registered"),
        };
        let hash = match (&consumer.key_sha256, &consumer.key) {
            (Some(hex_key), None) => {
                let mut hash = [0u8; 32];
                if hex::decode_to_slice(hex_key.get_ref().trim(), &mut hash).is_err() {
                    d.error(
                        Some(hex_key.span()),
                        &format!("{key}.key_sha256"),
                        "must be 64 hex digits (see `sluice hash-key KEY`)",
                    );
                    continue;
                }
                hash
            }
            (None, Some(plain)) => {
                if plain.get_ref().is_empty() {
                    d.error(
                        Some(plain.span()),
                        &format!("{key}.key"),
                        "must not be empty",
                    );
                    continue;
                }
                d.warn(Some(plain.span()), &format!("{key}.key"), "plain-text key in the config; store key_sha256 instead (`sluice hash-key KEY`)");
                Sha256::digest(plain.get_ref().as_bytes()).into()
            }
            (Some(_), Some(plain)) => {
                d.error(
                    Some(plain.span()),
                    &format!("{key}.key"),
                    "set key_sha256 or key, not both",
                );
                continue;
            }
            (None, None) => {
                d.error(
                    Some(consumer.name.span()),
                    &key,
                    "needs key_sha256 (or key for demos)",
                );
                continue;
            }
        };
        if let Some(other) = seen_keys.insert(hash, name.clone()) {
            d.error(
                Some(consumer.name.span()),
                &key,
                format!("has the same key as consumer \"{other}\""),
            );
        }
        out.push(ConsumerConfig {
            name,
            plan,
            key_sha256: hash,
        });
    }
    out
}

struct Policies {
    /// With the span of each policy's name, for cross-check diagnostics.
    list: Vec<(std::ops::Range<usize>, PolicyConfig)>,
    by_name: HashMap<String, usize>,
}

fn compile_policies(
    d: &mut Diagnostics,
    plans: &mut Plans,
    raw: Vec<(Spanned<String>, Value)>,
) -> Policies {
    let mut list = Vec::new();
    let mut by_name = HashMap::new();
    for (name, value) in raw {
        let key = format!("policies.{}", name.get_ref());
        let mut policy = PolicyConfig {
            name: name.get_ref().clone(),
            plans: Vec::new(),
            total: Vec::new(),
        };
        for (entry, v) in table_entries(d, &key, value) {
            let entry_key = format!("{key}.{}", entry.get_ref());
            match entry.get_ref().as_str() {
                "total" => {
                    if let Some(windows) = section::<raw::Windows>(d, &entry_key, v) {
                        policy.total = quotas(d, &entry_key, windows);
                    }
                }
                "concurrency" => {
                    let span = v.span();
                    if let Some(concurrency) = section::<raw::Concurrency>(d, &entry_key, v) {
                        int_in(
                            d,
                            &format!("{entry_key}.max"),
                            &concurrency.max,
                            1,
                            1_000_000,
                        );
                        if let Some(queue) = &concurrency.queue {
                            int_in(d, &format!("{entry_key}.queue"), queue, 0, 1_000_000);
                        }
                        duration_of(
                            d,
                            &format!("{entry_key}.queue_timeout"),
                            concurrency.queue_timeout.as_ref(),
                            Duration::ZERO,
                        );
                        d.warn(
                            Some(span),
                            &entry_key,
                            "concurrency caps are not supported yet; ignored",
                        );
                    }
                }
                plan_name => {
                    let rule = if v.get_ref().is_str() {
                        if v.get_ref().as_str() == Some("deny") {
                            Some(PlanRule::Deny)
                        } else {
                            d.error(Some(v.span()), &entry_key, "expected \"deny\" or a table of limits such as { per_minute = 10 }");
                            None
                        }
                    } else {
                        section::<raw::Windows>(d, &entry_key, v)
                            .map(|w| PlanRule::Limits(quotas(d, &entry_key, w)))
                    };
                    if let Some(rule) = rule {
                        let id = usize::from(plans.intern(plan_name).0);
                        if policy.plans.len() <= id {
                            policy.plans.resize(id + 1, None);
                        }
                        policy.plans[id] = Some(rule);
                    }
                }
            }
        }
        by_name.insert(policy.name.clone(), list.len());
        list.push((name.span(), policy));
    }
    for (_, policy) in &mut list {
        policy.plans.resize(plans.names.len(), None);
    }
    Policies { list, by_name }
}

fn quotas(d: &mut Diagnostics, key: &str, raw: raw::Windows) -> Vec<Quota> {
    let windows = [
        (Window::Second, "per_second", raw.per_second),
        (Window::Minute, "per_minute", raw.per_minute),
        (Window::Hour, "per_hour", raw.per_hour),
        (Window::Day, "per_day", raw.per_day),
    ];
    let mut out = Vec::new();
    for (window, name, value) in windows {
        let Some(value) = value else { continue };
        let limit = *value.get_ref();
        match u32::try_from(limit).ok().and_then(NonZeroU32::new) {
            Some(limit) => out.push(Quota { window, limit }),
            None => d.error(
                Some(value.span()),
                &format!("{key}.{name}"),
                format!(
                    "must be between 1 and {} (use \"deny\" to refuse a plan), got {limit}",
                    u32::MAX
                ),
            ),
        }
    }
    out
}

fn compile_routes(
    d: &mut Diagnostics,
    upstreams: &Upstreams,
    policies: &Policies,
    raw: Vec<(String, raw::Route)>,
) -> Vec<(std::ops::Range<usize>, RouteConfig)> {
    let mut names = HashSet::new();
    let mut out: Vec<(std::ops::Range<usize>, RouteConfig)> = Vec::new();
    for (key, route) in raw {
        let name = route.name.get_ref().clone();
        if !names.insert(name.clone()) {
            d.error(
                Some(route.name.span()),
                &format!("{key}.name"),
                format!("duplicate route name \"{name}\""),
            );
        }
        let prefix = route.path_prefix.get_ref();
        let path_prefix = match crate::path::normalize(prefix) {
            Ok(p) if p.len() > 1 => p.trim_end_matches('/').to_string(),
            Ok(p) => p.into_owned(),
            Err(err) => {
                d.error(
                    Some(route.path_prefix.span()),
                    &format!("{key}.path_prefix"),
                    format!("\"{prefix}\": {err}"),
                );
                continue;
            }
        };
        let host = route.host.as_ref().map(|h| {
            let host = h.get_ref().to_ascii_lowercase();
            match host.rsplit_once(':') {
                Some((name, port))
                    if port.chars().all(|c| c.is_ascii_digit()) && !name.contains(':') =>
                {
                    name.to_string()
                }
                _ => host,
            }
        });
        let methods = route.methods.as_ref().map(|methods| {
            methods
                .iter()
                .filter_map(|m| {
                    Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes())
                        .map_err(|_| {
                            d.error(
                                Some(m.span()),
                                &format!("{key}.methods"),
                                format!("\"{}\" is not an HTTP method", m.get_ref()),
                            )
                        })
                        .ok()
                })
                .collect::<Vec<_>>()
        });
        let target = match (&route.upstream, &route.respond) {
            (Some(up), None) => match upstreams.by_name.get(up.get_ref()) {
                Some(&index) => RouteTarget::Upstream(index),
                None => {
                    d.error(
                        Some(up.span()),
                        &format!("{key}.upstream"),
                        format!("unknown upstream \"{}\"", up.get_ref()),
                    );
                    continue;
                }
            },
            (None, Some(respond)) => match compile_respond(d, &key, respond) {
                Some(target) => target,
                None => continue,
            },
            (Some(up), Some(_)) => {
                d.error(Some(up.span()), &key, "set upstream or respond, not both");
                continue;
            }
            (None, None) => {
                d.error(
                    Some(route.name.span()),
                    &key,
                    "needs an upstream or a respond table",
                );
                continue;
            }
        };
        let policy = match &route.policy {
            None => None,
            Some(p) => match policies.by_name.get(p.get_ref()) {
                Some(&index) => Some(index),
                None => {
                    d.error(
                        Some(p.span()),
                        &format!("{key}.policy"),
                        format!("unknown policy \"{}\"", p.get_ref()),
                    );
                    continue;
                }
            },
        };
        let compiled = RouteConfig {
            name,
            host,
            path_prefix,
            methods,
            target,
            policy,
            strip_prefix: route.strip_prefix.unwrap_or(false),
        };
        if let Some((_, earlier)) = out.iter().find(|(_, earlier)| shadows(earlier, &compiled)) {
            d.warn(
                Some(route.name.span()),
                &format!("{key}.name"),
                format!("route \"{}\" is unreachable: route \"{}\" before it matches every request it would", compiled.name, earlier.name),
            );
        }
        out.push((route.name.span(), compiled));
    }
    out
}

fn compile_respond(
    d: &mut Diagnostics,
    key: &str,
    respond: &Spanned<raw::Respond>,
) -> Option<RouteTarget> {
    let r = respond.get_ref();
    let status = u16::try_from(*r.status.get_ref())
        .ok()
        .filter(|s| (200..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok());
    let Some(status) = status else {
        d.error(
            Some(r.status.span()),
            &format!("{key}.respond.status"),
            "must be an HTTP status between 200 and 599",
        );
        return None;
    };
    let content_type = match &r.content_type {
        None => HeaderValue::from_static("text/plain; charset=utf-8"),
        Some(ct) => match HeaderValue::try_from(ct.get_ref().as_str()) {
            Ok(v) => v,
            Err(_) => {
                d.error(
                    Some(ct.span()),
                    &format!("{key}.respond.content_type"),
                    "is not a valid header value",
                );
                return None;
            }
        },
    };
    Some(RouteTarget::Respond {
        status,
        body: Bytes::from(r.body.clone().unwrap_or_default()),
        content_type,
    })
}

/// Whether `earlier` matches every request that `later` matches.
fn shadows(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    let host = earlier.host.is_none() || earlier.host == later.host;
    let path = crate::route::prefix_matches(&earlier.path_prefix, &later.path_prefix);
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(l)) => l.iter().all(|m| e.contains(m)),
    };
    host && path && methods
}

/// Every plan a consumer can have must be covered by every policy a route uses,
/// and so must anonymous callers; otherwise the route has no rule for them.
fn check_consumer_plans(
    d: &mut Diagnostics,
    plans: &Plans,
    consumers: &[ConsumerConfig],
    policies: &[(std::ops::Range<usize>, PolicyConfig)],
    routes: &[(std::ops::Range<usize>, RouteConfig)],
) {
    let mut reported = HashSet::new();
    for (_, route) in routes {
        let Some(index) = route.policy else { continue };
        let (span, policy) = &policies[index];
        let needed = std::iter::once((PlanId::ANONYMOUS, None))
            .chain(consumers.iter().map(|c| (c.plan, Some(c.name.as_str()))));
        for (plan, consumer) in needed {
            if policy.rule(plan).is_some() || !reported.insert((index, plan)) {
                continue;
            }
            let plan_name = &plans.names[usize::from(plan.0)];
            let reason = match consumer {
                None => format!(
                    "no rule for plan \"anonymous\" (callers without a key on route \"{}\"); add anonymous = \"deny\" to require a key",
                    route.name
                ),
                Some(consumer) => format!(
                    "no rule for plan \"{plan_name}\" of consumer \"{consumer}\" (used by route \"{}\")",
                    route.name
                ),
            };
            d.error(
                Some(span.clone()),
                &format!("policies.{}", policy.name),
                reason,
            );
        }
    }
}
