//! The file as written: serde structs that mirror `gateway.toml` one to one.
//!
//! Every struct denies unknown keys, so a typo is an error rather than a silently
//! disabled limit. Values stay close to their TOML form here (strings for durations,
//! addresses and CIDRs); `compile` turns them into runtime types and reports every
//! problem with its location. Policies are not a serde struct: their keys are plan
//! names, so `compile` walks them by hand.

use serde::Deserialize;
use toml::Spanned;

/// A value that may be written once or as a list: `listen = "a"` or `listen = ["a", "b"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            OneOrMany::One(one) => std::slice::from_ref(one),
            OneOrMany::Many(many) => many,
        }
    }

    pub(crate) fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Server {
    pub listen: Option<Spanned<OneOrMany<String>>>,
    pub tls: Option<Spanned<Tls>>,
    pub header_timeout: Option<Spanned<String>>,
    pub idle_timeout: Option<Spanned<String>>,
    pub max_header_bytes: Option<Spanned<i64>>,
    pub max_uri_bytes: Option<Spanned<i64>>,
    pub body_timeout: Option<Spanned<String>>,
    pub min_body_rate: Option<Spanned<i64>>,
    pub max_body_bytes: Option<Spanned<i64>>,
    pub h2_max_streams: Option<Spanned<i64>>,
    pub max_connections: Option<Spanned<i64>>,
    pub worker_threads: Option<Spanned<i64>>,
    pub drain_timeout: Option<Spanned<String>>,
    pub tunnel_idle_timeout: Option<Spanned<String>>,
    pub cors: Option<Spanned<Cors>>,
}

/// `cors = { ... }` of a route or of `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Cors {
    pub origins: Spanned<Vec<String>>,
    pub methods: Option<Vec<Spanned<String>>>,
    pub headers: Option<Vec<Spanned<String>>>,
    pub expose: Option<Vec<Spanned<String>>>,
    pub credentials: Option<bool>,
    pub max_age: Option<Spanned<String>>,
    pub preflight: Option<Spanned<String>>,
    pub preflight_limit: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tls {
    pub listen: Option<Spanned<OneOrMany<String>>>,
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
    #[serde(default)]
    pub sni: Vec<Spanned<CertPair>>,
    pub min_version: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CertPair {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Admin {
    pub listen: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
}

/// `[decision]`: the listener other proxies ask (Envoy's rate limit service, forward
/// auth), its connection limits and its rules.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    pub listen: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
    pub tls: Option<Spanned<Tls>>,
    pub envoy_config: Option<Spanned<OneOrMany<String>>>,
    pub rate_headers: Option<bool>,
    pub max_descriptors: Option<Spanned<i64>>,
    pub max_overrides: Option<Spanned<i64>>,
    pub header_timeout: Option<Spanned<String>>,
    pub idle_timeout: Option<Spanned<String>>,
    pub max_header_bytes: Option<Spanned<i64>>,
    pub h2_max_streams: Option<Spanned<i64>>,
    pub max_connections: Option<Spanned<i64>>,
    #[serde(default)]
    pub descriptors: Vec<Spanned<DecisionDescriptor>>,
}

/// `[[decision.descriptors]]`: an Envoy descriptor counted by a sluice policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionDescriptor {
    pub domain: Spanned<String>,
    pub entries: Spanned<Vec<Spanned<String>>>,
    pub policy: Spanned<String>,
    pub plan: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Log {
    pub access: Option<Spanned<String>>,
    pub request_id_header: Option<Spanned<String>>,
    pub refused: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Identity {
    pub api_key_header: Option<Spanned<String>>,
    pub trusted_proxies: Option<Vec<Spanned<String>>>,
    pub ipv6_prefix: Option<Spanned<i64>>,
    pub consumers_file: Option<Spanned<String>>,
    pub consumer_header: Option<Spanned<String>>,
    pub plan_header: Option<Spanned<String>>,
    pub jwt: Option<Spanned<Jwt>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Jwt {
    pub jwks_url: Option<Spanned<String>>,
    pub refresh: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub keys: Option<Vec<Spanned<String>>>,
    pub secret: Option<Spanned<String>>,
    pub issuer: Option<Spanned<OneOrMany<String>>>,
    pub audience: Option<Spanned<OneOrMany<String>>>,
    pub algorithms: Option<Vec<Spanned<String>>>,
    pub leeway: Option<Spanned<String>>,
    pub consumer_claim: Option<Spanned<String>>,
    pub plan_claim: Option<Spanned<String>>,
    pub default_plan: Option<Spanned<String>>,
    pub forward: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Store {
    pub backend: Option<Spanned<String>>,
    pub url: Option<Spanned<String>>,
    pub on_error: Option<Spanned<String>>,
    pub state_file: Option<Spanned<String>>,
    pub max_keys: Option<Spanned<i64>>,
    pub timeout: Option<Spanned<String>>,
    pub cluster: Option<Spanned<Vec<Spanned<String>>>>,
    pub sentinel: Option<Spanned<Sentinel>>,
    pub ca_file: Option<Spanned<String>>,
    pub wait_replicas: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Sentinel {
    // Both required; optional here so a missing one is reported under its own key.
    pub master: Option<Spanned<String>>,
    pub nodes: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limits {
    pub day: Option<Spanned<String>>,
    pub timezone: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Access {
    pub deny: Option<Vec<Spanned<String>>>,
    pub exempt: Option<Vec<Spanned<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ban {
    pub after: Option<Spanned<i64>>,
    pub within: Option<Spanned<String>>,
    pub duration: Option<Spanned<String>>,
    pub escalate: Option<bool>,
    pub max_bans: Option<Spanned<i64>>,
    pub mode: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Upstream {
    pub targets: Spanned<Vec<Spanned<String>>>,
    pub connect_timeout: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub protocol: Option<Spanned<String>>,
}

/// The windows of one plan (or of `total`): `{ per_minute = 100, per_day = 100_000 }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Windows {
    pub per_second: Option<Spanned<i64>>,
    pub per_minute: Option<Spanned<i64>>,
    pub per_hour: Option<Spanned<i64>>,
    pub per_day: Option<Spanned<i64>>,
    pub per_month: Option<Spanned<i64>>,
    pub per_year: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Concurrency {
    pub max: Spanned<i64>,
    pub queue: Option<Spanned<i64>>,
    pub queue_timeout: Option<Spanned<String>>,
    pub per_caller: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Consumer {
    pub name: Spanned<String>,
    pub plan: Option<Spanned<String>>,
    pub key_sha256: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    pub limits: Option<Spanned<Windows>>,
    pub disabled: Option<bool>,
    pub billing_anchor: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Route {
    pub name: Spanned<String>,
    pub host: Option<Spanned<String>>,
    pub path_prefix: Spanned<String>,
    pub methods: Option<Vec<Spanned<String>>>,
    pub upstream: Option<Spanned<String>>,
    pub policy: Option<Spanned<OneOrMany<String>>>,
    pub strip_prefix: Option<bool>,
    pub path_parameters: Option<bool>,
    pub respond: Option<Spanned<Respond>>,
    pub cost: Option<Spanned<i64>>,
    pub refund_on: Option<Vec<Spanned<i64>>>,
    pub cost_after: Option<Spanned<String>>,
    pub default_cost: Option<Spanned<i64>>,
    pub max_cost: Option<Spanned<i64>>,
    pub reserve: Option<Spanned<Reserve>>,
    pub websocket: Option<bool>,
    pub cors: Option<Spanned<Cors>>,
}

/// `reserve`: a number of units, or a name (`"average"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Reserve {
    Units(i64),
    Named(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Respond {
    pub status: Spanned<i64>,
    pub body: Option<String>,
    pub content_type: Option<Spanned<String>>,
}
