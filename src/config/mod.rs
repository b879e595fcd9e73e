//! Configuration: `gateway.toml` read, validated and compiled into runtime types.
//!
//! The pipeline is file text -> `raw` serde structs (unknown keys are errors) ->
//! `compile` -> [`Config`], whose fields cannot hold invalid values: durations are
//! `Duration`, limits `NonZeroU32`, references to upstreams, policies, consumers
//! and routes are typed ids ([`RouteId`], [`PolicyId`], ...).
//! Every problem is collected with its file, line, TOML key and reason
//! ([`Diagnostic`]); nothing after start-up parses a string that should have been a
//! number. Certificate, key and CA files are loaded through [`crate::tls::pki`] as the
//! config is, so one that does not load is a diagnostic too. The route table
//! (`route`) is compiled here. This module does not watch the file or swap configs
//! (`crate::admin::reload` does that), and it depends only on the foundations
//! (`limit`, `http`, `tls`), never on the runtime that uses it
//! (`scripts/check-layers`).

mod compile;
pub(crate) mod consumer_index;
mod consumers;
mod consumers_file;
mod cors;
mod cost;
mod decision;
pub mod descriptors;
mod diagnostic;
mod duration;
mod identity;
mod ids;
mod jwt;
mod limit_key;
mod policies;
mod raw;
mod recover;
pub mod route;
mod routes;
mod server;
mod settings;
mod store;
mod tls;
mod values;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;

pub use crate::limit::calendar::DayMode;
pub use crate::tls::certificates::TlsConfig;
pub(crate) use consumers::{MAX_NAME_BYTES, is_caller_name};
pub use decision::{DecisionConfig, EntryPattern, PolicyDescriptor, ValuePattern};
pub use diagnostic::{ConfigError, Diagnostic, Severity};
pub(crate) use duration::parse as parse_duration;
pub use identity::IdentityConfig;
pub use ids::{ConsumerId, PolicyId, RouteId, UpstreamId};
pub(crate) use jwt::MIN_REFRESH as JWKS_MIN_REFRESH;
pub use jwt::{JwksConfig, JwtConfig, JwtKey};
pub use limit_key::{KeyPart, LimitKey, OnMissing};
pub(crate) use policies::DEFAULT_PLAN;
#[cfg(test)]
pub(crate) use server::one_change_each;
pub use server::{ServerConfig, ServerLive, ServerStartup};

use crate::config::route::Route;
use crate::limit::{Anchor, Quota};

/// Where the gateway looks for its config when `-c` and `$SLUICE_CONFIG` are absent.
pub const DEFAULT_PATH: &str = "gateway.toml";

/// A validated, compiled `gateway.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file the config was read from; relative paths in it (certificates, CA
    /// files, `state_file`) are resolved against its directory.
    pub file: PathBuf,
    /// `[server]`: the client-facing listeners, their limits and timeouts.
    pub server: ServerConfig,
    /// `[admin]`: the admin listener and its token (a change takes a restart).
    pub admin: AdminConfig,
    /// `[decision]`: the listener other proxies ask for decisions, and the rules of
    /// Envoy descriptors; `None` without the section (its listener is a restart-only
    /// setting; its rules reload).
    pub decision: Option<DecisionConfig>,
    /// `[identity]`: how a request's caller is found (API key header, trusted
    /// proxies, IPv6 prefix).
    pub identity: IdentityConfig,
    /// `[store]`: where the counters live (a change takes a restart).
    pub store: StoreConfig,
    /// `[limits] day` and `timezone`: whether `per_day` slides or resets at local
    /// midnight.
    pub day: DayMode,
    /// `[limits] timezone` (UTC unless set): where calendar days and the billing
    /// periods of `per_month` and `per_year` start at local midnight.
    pub timezone: jiff::tz::TimeZone,
    /// `[access]`: client networks refused with 403, and those never limited.
    pub access: AccessConfig,
    /// `[ban]`: automatic bans and the size of the ban table.
    pub ban: BanConfig,
    /// `[log]`: the access log's format and the request id header.
    pub log: LogConfig,
    /// Every `[upstreams.NAME]`; a route's `upstream` is an index into this list.
    pub upstreams: Vec<UpstreamConfig>,
    /// Plan names; a [`PlanId`] indexes this list. `anonymous` is always plan 0.
    pub plans: Vec<Arc<str>>,
    /// Every `[policies.NAME]`; a route's `policy` is an index into this list.
    pub policies: Vec<PolicyConfig>,
    /// Every `[[consumers]]` entry, in file order, then the consumers file's.
    pub consumers: Arc<Vec<ConsumerConfig>>,
    /// `consumers` by key and by name, built while they were read (checking for
    /// duplicates), shared with the identifier.
    pub(crate) consumer_index: Arc<consumer_index::ConsumerIndex>,
    /// How many of `consumers` (the last ones) came from `consumers_file`.
    pub consumers_from_file: usize,
    /// Every `[[routes]]` entry, in file order, which is the order they are matched in.
    pub routes: Vec<Route>,
    /// Non-fatal findings (plain-text keys, shadowed routes, settings not yet supported).
    pub warnings: Vec<Diagnostic>,
}

/// `[admin]`: the listener of `/metrics`, `/healthz`, `/readyz`, `/admin/*` and
/// `/v1/check`.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// `listen` (default `127.0.0.1:9090`): the address the admin API is served on.
    pub listen: SocketAddr,
    /// The bearer token `/admin/*` and `/v1/check` require (`"env:NAME"` already
    /// read); `None`: no token, and off loopback only the metrics and probes answer.
    pub token: Option<String>,
}

/// `[log]`: the access log and request ids.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `access` (default `json`): the access log's format on stdout, or `off`.
    pub access: AccessLogFormat,
    /// Kept when a well-formed one arrives, else generated; sent upstream, returned
    /// to the client, logged.
    pub request_id_header: HeaderName,
    /// `refused` (default `summary`): whether a refusal flood is logged a line a
    /// second per caller, route and outcome, or a line a refusal.
    pub refused: RefusedLog,
}

/// `[log] refused`: how refusals are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedLog {
    /// Per caller, route and outcome, the first refusal of each second; the rest are
    /// counted in the `repeated` field of that key's next line (the default: a flood
    /// of refusals cannot fill a disk).
    Summary,
    /// Every refusal, a line each.
    All,
}

/// The access log's format on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object a line (the default), what log shippers read without a pattern.
    Json,
    /// One plain-text line a request, for a person reading a terminal.
    Text,
    /// No access log.
    Off,
}

/// `[store] backend`: where the counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// In this process (the default): each replica enforces the limits alone.
    Memory,
    /// One limit shared by every replica through Redis.
    Redis {
        /// Which Redis: one server, a Cluster or a Sentinel-managed master.
        target: RedisTarget,
        /// `on_error` (default `local`): what decides while Redis cannot be reached.
        on_error: OnError,
        /// Longest wait for one Redis answer.
        timeout: Duration,
        /// `ca_file`: with `rediss://`, trust this CA (default: the system's roots).
        ca_file: Option<PathBuf>,
        /// `wait_replicas` (default 0): a decision is answered only once this many
        /// replicas have its counts (`WAIT`), so a failover loses none of them.
        wait_replicas: u32,
    },
}

/// Where the Redis store's counters live: exactly one of `url`, `cluster` and
/// `sentinel`. Every URL is `redis://` or `rediss://` (TLS), checked when the config
/// loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `url`: one server (or a primary whose replicas nobody promotes for us).
    Server(String),
    /// `cluster`: seed nodes of a Redis Cluster; the rest is discovered.
    Cluster(Vec<String>),
    /// `sentinel = { master, nodes }`: the master the sentinels name, followed
    /// across failovers.
    Sentinel {
        /// The name the sentinels monitor the master under.
        master: String,
        /// The sentinels' URLs.
        nodes: Vec<String>,
    },
}

/// What the Redis store does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Count in this replica's memory (each replica enforces the limits alone).
    Local,
    /// Admit (fail open).
    Allow,
    /// Refuse with 503 (fail closed).
    Deny,
}

/// `[store]`: where the counters live and how many callers they may hold.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `backend` (default `memory`), with its Redis settings.
    pub backend: Backend,
    /// `max_keys` (default 1 000 000): callers tracked in memory at once; when full, a
    /// new caller evicts an idle or cold one.
    pub max_keys: usize,
    /// Where the memory store keeps its counters across restarts.
    pub state_file: Option<PathBuf>,
}

/// `[access]`: client networks refused outright, and those never limited.
#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    /// `deny`: client addresses (after trusted proxies) refused with 403 before they
    /// are identified.
    pub deny: Vec<IpNet>,
    /// `exempt`: client addresses never rate-limited, capped or banned (still
    /// identified: an unknown key or a `"deny"` plan is still a 401).
    pub exempt: Vec<IpNet>,
}

/// `[ban]`: automatic bans (when the section is present) and the table's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanConfig {
    /// Automatic bans; `None` without a `[ban]` section (manual bans still work).
    pub automatic: Option<AutoBan>,
    /// Callers held in the ban table at once at most (bans and refusal counts).
    pub max_bans: usize,
}

/// When a caller is banned automatically, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoBan {
    /// This many 429s (or unknown-key 401s from one IP) ...
    pub after: NonZeroU32,
    /// ... inside this window ...
    pub within: Duration,
    /// ... ban the caller for this long.
    pub duration: Duration,
    /// A repeat offender's next ban lasts twice as long as its last, up to a day.
    pub escalate: bool,
    /// `mode = "shadow"`: would-be bans are logged and counted, nobody is banned.
    pub shadow: bool,
}

/// `[upstreams.NAME]`: where a route forwards, and how long it waits.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The `NAME` of `[upstreams.NAME]`, which a route's `upstream` names.
    pub name: String,
    /// `targets`: `http://` or `https://` URLs, each with an optional base path, used
    /// round robin.
    pub targets: Vec<http::Uri>,
    /// `connect_timeout` (default 2 s): the longest a TCP connect (and a TLS
    /// handshake) to a target may take; then 502.
    pub connect_timeout: Duration,
    /// `timeout` (default 30 s): the longest a request waits for the upstream's
    /// response headers, connecting included; then 504.
    pub timeout: Duration,
    /// https targets: trust only this CA bundle (PEM) instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// `protocol` (default `"http1"`): the HTTP version spoken to the targets.
    pub protocol: UpstreamProtocol,
}

/// `[upstreams.NAME] protocol`: the HTTP version sluice speaks to the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UpstreamProtocol {
    /// `"http1"`: pooled keep-alive HTTP/1.1 connections.
    #[default]
    Http1,
    /// `"h2"`: HTTP/2, prior knowledge on `http://` (h2c), ALPN `h2` on `https://`;
    /// requests multiplexed on one connection per target and worker thread.
    H2,
    /// `"auto"`: on `https://`, whatever ALPN settles (`h2` offered first); on
    /// `http://`, HTTP/1.1.
    Auto,
}

impl UpstreamProtocol {
    /// The setting's name in `gateway.toml`.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::H2 => "h2",
            UpstreamProtocol::Auto => "auto",
        }
    }

    /// Whether a request sent under this setting to a target of `scheme` may travel
    /// as HTTP/2 (what a gRPC call needs).
    pub fn may_speak_h2(self, scheme: Option<&str>) -> bool {
        match self {
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::H2 => true,
            UpstreamProtocol::Auto => scheme == Some("https"),
        }
    }
}

/// Index into [`Config::plans`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(pub u16);

impl PlanId {
    /// `anonymous`, the plan of callers without an API key.
    pub const ANONYMOUS: PlanId = PlanId(0);
}

/// What a policy does with the callers of one plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanRule {
    /// 401: this plan may not use routes of the policy.
    Deny,
    /// These limits, all or nothing (may be empty: not limited).
    Limits(Vec<Quota>),
}

/// `[policies.NAME]`: the limits of the routes that name the policy.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// The `NAME` of `[policies.NAME]`; counters are kept under it, so a reload that
    /// keeps the name keeps the callers' history.
    pub name: String,
    /// Indexed by [`PlanId`]; `None` where the policy does not mention the plan.
    pub plans: Vec<Option<PlanRule>>,
    /// Limits over every caller of the policy together.
    pub total: Vec<Quota>,
    /// The cap on requests of the policy's routes being served at once.
    pub concurrency: Option<ConcurrencyConfig>,
    /// `messages`: the WebSocket messages a caller may send upstream over all its
    /// sockets on the policy's routes (empty: not limited).
    pub messages: Vec<Quota>,
    /// `mode` and `shadow_headers`: enforce the limits, or only report them.
    pub mode: PolicyMode,
    /// `key` and `on_missing`: what one budget belongs to; `None`, the caller.
    pub key: Option<LimitKey>,
}

/// `mode` of a policy: enforce its limits, or count as if enforced and refuse nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyMode {
    /// `mode = "enforce"` (the default).
    #[default]
    Enforce,
    /// `mode = "shadow"`: would-be refusals are logged and counted, not made.
    Shadow {
        /// `shadow_headers`: callers see the would-be RateLimit headers.
        headers: bool,
    },
}

/// `concurrency = { max, queue, queue_timeout, per_caller }` of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyConfig {
    /// Requests served at once at most (per replica).
    pub max: NonZeroU32,
    /// Requests that may wait, in arrival order, for one of the `max` to finish.
    pub queue: u32,
    /// The longest wait in the queue before a 503.
    pub queue_timeout: Duration,
    /// Requests of one caller served at once at most (429 above).
    pub per_caller: Option<NonZeroU32>,
}

impl PolicyConfig {
    /// What the policy does with callers of `plan`; `None` if it does not mention it.
    pub fn rule(&self, plan: PlanId) -> Option<&PlanRule> {
        self.plans.get(usize::from(plan.0)).and_then(Option::as_ref)
    }
}

/// `[[consumers]]`: a holder of an API key, and its plan.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// `name`, unique: the caller's name in the access log, and `consumer:NAME` in
    /// bans and the admin API.
    pub name: String,
    /// `plan` (default `registered`): the plan whose limits its requests count against.
    pub plan: PlanId,
    /// SHA-256 of its API key: `key_sha256` as written, or the hash of a plain `key`.
    pub key_sha256: [u8; 32],
    /// `limits`: these windows' values replace the plan's, for this consumer only
    /// (a window the plan does not limit under a policy stays unlimited there).
    pub limits: Vec<Quota>,
    /// `disabled`: its key (and its name in an identity header) is refused with 401,
    /// as if unknown.
    pub disabled: bool,
    /// `billing_anchor`: the day its `per_month` and `per_year` periods start on
    /// (`None`: the 1st, and January 1st).
    pub anchor: Option<Anchor>,
}

impl ConsumerConfig {
    /// The key hash `key_sha256` spells: exactly 64 hex digits (surrounding spaces
    /// aside), no `0x`. const-hex decodes with SIMD (the `hex` crate's decode was a
    /// quarter of a million-line consumers file's compile); the length refuses the
    /// `0x` it would otherwise accept.
    pub(crate) fn key_hash(digits: &str) -> Option<[u8; 32]> {
        let digits = digits.trim();
        let mut hash = [0u8; 32];
        let decoded = digits.len() == 64 && const_hex::decode_to_slice(digits, &mut hash).is_ok();
        decoded.then_some(hash)
    }

    /// The consumer's quotas where its plan has `plan_quotas`: each window's value
    /// replaced by the consumer's own, if it sets one.
    pub fn effective(&self, plan_quotas: &[Quota]) -> Vec<Quota> {
        plan_quotas
            .iter()
            .map(|q| {
                let own = self.limits.iter().find(|o| o.window == q.window);
                own.copied().unwrap_or(*q)
            })
            .collect()
    }
}

impl Config {
    /// Reads and compiles the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(path, &text),
            Err(err) => Err(ConfigError {
                diagnostics: vec![Diagnostic::whole_file(
                    path,
                    "",
                    format!("cannot read file: {err}"),
                )],
            }),
        }
    }

    /// Compiles `text`, reporting problems against `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        compile::compile(path, text)
    }

    /// The name of `plan`, as the config spells it.
    pub fn plan_name(&self, plan: PlanId) -> &str {
        &self.plans[usize::from(plan.0)]
    }

    /// Policy `id`.
    pub fn policy(&self, id: PolicyId) -> &PolicyConfig {
        &self.policies[id.index()]
    }

    /// Upstream `id`.
    pub fn upstream(&self, id: UpstreamId) -> &UpstreamConfig {
        &self.upstreams[id.index()]
    }

    /// Consumer `id`.
    pub fn consumer(&self, id: ConsumerId) -> &ConsumerConfig {
        &self.consumers[id.index()]
    }
}

#[cfg(test)]
mod tests;
