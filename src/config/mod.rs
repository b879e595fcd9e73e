//! Configuration: `gateway.toml` read, validated and compiled into runtime types.
//!
//! The pipeline is file text -> `raw` serde structs (unknown keys are errors) ->
//! `compile` -> [`Config`], whose fields cannot hold invalid values: durations are
//! `Duration`, limits `NonZeroU32`, references to upstreams and policies are indices.
//! Every problem is collected with its file, line, TOML key and reason
//! ([`Diagnostic`]); nothing after start-up parses a string that should have been a
//! number. Certificate, key and CA files are loaded through [`crate::pki`] as the
//! config is, so one that does not load is a diagnostic too. This module does not
//! watch the file or swap configs (`reload` does that), and it depends only on
//! leaves (`limit`, `route`, `path`, `pki`), never on the runtime that uses it.

mod compile;
mod diagnostic;
mod duration;
mod policies;
mod raw;
mod recover;
mod routes;
mod server;
mod settings;
mod values;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;

pub use diagnostic::{ConfigError, Diagnostic, Severity};
pub(crate) use duration::parse as parse_duration;
#[cfg(test)]
pub(crate) use server::one_change_each;
pub use server::{ServerConfig, ServerLive, ServerStartup};

use crate::limit::Quota;
use crate::route::Route;

/// Where the gateway looks for its config when `-c` and `$SLUICE_CONFIG` are absent.
pub const DEFAULT_PATH: &str = "gateway.toml";

/// A validated, compiled `gateway.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub identity: IdentityConfig,
    pub store: StoreConfig,
    pub day: DayMode,
    pub access: AccessConfig,
    pub ban: BanConfig,
    pub log: LogConfig,
    pub upstreams: Vec<UpstreamConfig>,
    /// Plan names; a [`PlanId`] indexes this list. `anonymous` is always plan 0.
    pub plans: Vec<Arc<str>>,
    pub policies: Vec<PolicyConfig>,
    pub consumers: Vec<ConsumerConfig>,
    pub routes: Vec<Route>,
    /// Non-fatal findings (plain-text keys, shadowed routes, settings not yet supported).
    pub warnings: Vec<Diagnostic>,
}

/// `[server.tls]`: a TLS listener and its certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub listen: Vec<SocketAddr>,
    /// The default certificate chain and key (PEM), for clients whose SNI name no
    /// `sni` certificate covers.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// More certificates, each chosen for the names it covers.
    pub sni: Vec<(PathBuf, PathBuf)>,
    /// TLS 1.3 only, instead of 1.2 and 1.3.
    pub tls13_only: bool,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token: Option<String>,
}

/// `[log]`: the access log and request ids.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub access: AccessLog,
    /// Kept when a well-formed one arrives, else generated; sent upstream, returned
    /// to the client, logged.
    pub request_id_header: HeaderName,
}

/// The access log's format on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLog {
    Json,
    Text,
    Off,
}

#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub api_key_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    pub ipv6_prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Memory,
    /// One limit shared by every replica through Redis.
    Redis {
        url: String,
        on_error: OnError,
        /// Longest wait for one Redis answer.
        timeout: Duration,
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

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub backend: Backend,
    pub max_keys: usize,
    /// Where the memory store keeps its counters across restarts.
    pub state_file: Option<PathBuf>,
}

/// How `per_day` is counted.
#[derive(Debug, Clone)]
pub enum DayMode {
    /// A sliding 24 h window, like every other window.
    Sliding,
    /// Reset at local midnight of this time zone (23 or 25 h days across DST).
    Calendar(jiff::tz::TimeZone),
}

#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    pub deny: Vec<IpNet>,
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
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    pub targets: Vec<http::Uri>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// https targets: trust only this CA bundle (PEM) instead of the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// Index into [`Config::plans`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(pub u16);

impl PlanId {
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

#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub name: String,
    /// Indexed by [`PlanId`]; `None` where the policy does not mention the plan.
    pub plans: Vec<Option<PlanRule>>,
    /// Limits over every caller of the policy together.
    pub total: Vec<Quota>,
    /// The cap on requests of the policy's routes being served at once.
    pub concurrency: Option<ConcurrencyConfig>,
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
    pub fn rule(&self, plan: PlanId) -> Option<&PlanRule> {
        self.plans.get(usize::from(plan.0)).and_then(Option::as_ref)
    }
}

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub name: String,
    pub plan: PlanId,
    pub key_sha256: [u8; 32],
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

    pub fn plan_name(&self, plan: PlanId) -> &str {
        &self.plans[usize::from(plan.0)]
    }
}

#[cfg(test)]
mod tests;
