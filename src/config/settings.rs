//! The global sections: `[server]`, `[admin]`, `[limits]`,
//! `[access]`, `[ban]` and `[log]`, each with its defaults and the reason for them.

use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use jiff::tz::TimeZone;
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::tls::compile_tls;
use super::values::{cidrs, duration_of, int_in, socket_addr};
use super::{
    AccessConfig, AccessLogFormat, AdminConfig, AutoBan, BanConfig, DayMode, LogConfig, RefusedLog,
    ServerConfig, ServerLive, ServerStartup, raw,
};

/// An open WebSocket with no traffic either way is closed after this long: long
/// enough for an application's own pings (every 30-60 s), short enough that a
/// vanished client's socket does not hold its concurrency slot for hours.
const DEFAULT_TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
// Defaults, with the reason beside each.
/// Long enough for a slow mobile client to send its headers, short enough to cut slowloris.
pub(super) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive connections idle longer than this are closed (nginx uses 75 s, Envoy 1 h).
pub(super) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's large_client_header_buffers default (4 x 8 KiB) is in the same range.
pub(super) const DEFAULT_MAX_HEADER_BYTES: i64 = 16_384;
const DEFAULT_MAX_URI_BYTES: i64 = 8_192;
/// 10 MiB: API payloads, not uploads.
const DEFAULT_MAX_BODY_BYTES: i64 = 10_485_760;
pub(super) const DEFAULT_H2_MAX_STREAMS: i64 = 100;
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_MIN_BODY_RATE: i64 = 1024;
const DEFAULT_MAX_CONNECTIONS: i64 = 10_000;
/// Kubernetes' default terminationGracePeriodSeconds is 30 s too.
const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The de facto standard name (Heroku, nginx's $request_id users, Envoy's
/// x-request-id), so ids flow through other proxies unchanged.
const DEFAULT_REQUEST_ID_HEADER: &str = "x-request-id";
const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";

pub(super) fn compile_server(
    d: &mut Diagnostics,
    file: &Path,
    mut raw: raw::Server,
) -> ServerConfig {
    ServerConfig {
        startup: compile_startup(d, file, &mut raw),
        live: compile_live(d, &raw),
    }
}

/// An integer setting within `range`, `default` when absent.
pub(super) fn int(
    d: &mut Diagnostics,
    key: &str,
    v: &Option<Spanned<i64>>,
    range: std::ops::RangeInclusive<i64>,
    default: i64,
) -> usize {
    v.as_ref()
        .and_then(|v| int_in(d, key, v, *range.start(), *range.end()))
        .unwrap_or(default) as usize
}

/// `[server]`'s start-up settings.
fn compile_startup(d: &mut Diagnostics, file: &Path, raw: &mut raw::Server) -> ServerStartup {
    let listen = match raw.listen.take() {
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
    let tls = (raw.tls.take()).map(|tls| compile_tls(d, file, tls.into_inner(), "server.tls"));
    ServerStartup {
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
            256..=(1 << 20),
            DEFAULT_MAX_HEADER_BYTES,
        ),
        h2_max_streams: int(
            d,
            "server.h2_max_streams",
            &raw.h2_max_streams,
            1..=10_000,
            DEFAULT_H2_MAX_STREAMS,
        ) as u32,
        max_connections: int(
            d,
            "server.max_connections",
            &raw.max_connections,
            1..=10_000_000,
            DEFAULT_MAX_CONNECTIONS,
        ),
        tls,
        worker_threads: int(d, "server.worker_threads", &raw.worker_threads, 0..=1024, 0),
        drain_timeout: duration_of(
            d,
            "server.drain_timeout",
            raw.drain_timeout.as_ref(),
            DEFAULT_DRAIN_TIMEOUT,
        ),
    }
}

/// `[server]`'s live settings.
fn compile_live(d: &mut Diagnostics, raw: &raw::Server) -> ServerLive {
    ServerLive {
        max_uri_bytes: int(
            d,
            "server.max_uri_bytes",
            &raw.max_uri_bytes,
            64..=(1 << 20),
            DEFAULT_MAX_URI_BYTES,
        ),
        max_body_bytes: int(
            d,
            "server.max_body_bytes",
            &raw.max_body_bytes,
            0..=i64::MAX,
            DEFAULT_MAX_BODY_BYTES,
        ) as u64,
        body_timeout: duration_of(
            d,
            "server.body_timeout",
            raw.body_timeout.as_ref(),
            DEFAULT_BODY_TIMEOUT,
        ),
        min_body_rate: int(
            d,
            "server.min_body_rate",
            &raw.min_body_rate,
            0..=i64::MAX,
            DEFAULT_MIN_BODY_RATE,
        ) as u64,
        tunnel_idle_timeout: duration_of(
            d,
            "server.tunnel_idle_timeout",
            raw.tunnel_idle_timeout.as_ref(),
            DEFAULT_TUNNEL_IDLE_TIMEOUT,
        ),
        cors: (raw.cors.as_ref())
            .and_then(|cors| super::cors::compile_cors(d, "server.cors", cors.get_ref(), None)),
    }
}

/// Refusals that earn a ban: enough to tell hammering from a client that honours a
/// few Retry-Afters late.
const DEFAULT_BAN_AFTER: i64 = 50;
const DEFAULT_BAN_WITHIN: Duration = Duration::from_secs(60);
/// Long enough to stop a script, short enough that a mistake heals by itself.
const DEFAULT_BAN_DURATION: Duration = Duration::from_secs(600);
/// About 100 bytes a caller: 10 MB at most.
const DEFAULT_MAX_BANS: i64 = 100_000;
/// The longest ban `escalate` reaches.
pub(crate) const MAX_BAN: Duration = Duration::from_secs(86_400);

/// `[ban]`: automatic bans when the section is present (with these defaults), and
/// the table's bound, which manual bans respect too.
pub(super) fn compile_ban(d: &mut Diagnostics, raw: Option<raw::Ban>) -> BanConfig {
    let max = |d: &mut Diagnostics, raw: Option<&Spanned<i64>>| {
        raw.and_then(|m| int_in(d, "ban.max_bans", m, 1, 100_000_000))
            .unwrap_or(DEFAULT_MAX_BANS) as usize
    };
    let Some(raw) = raw else {
        return BanConfig {
            automatic: None,
            max_bans: max(d, None),
        };
    };
    let after = raw
        .after
        .as_ref()
        .and_then(|a| int_in(d, "ban.after", a, 1, 1_000_000_000))
        .unwrap_or(DEFAULT_BAN_AFTER);
    let within = duration_of(d, "ban.within", raw.within.as_ref(), DEFAULT_BAN_WITHIN);
    let mut duration = duration_of(
        d,
        "ban.duration",
        raw.duration.as_ref(),
        DEFAULT_BAN_DURATION,
    );
    if duration > MAX_BAN {
        d.error(
            raw.duration.as_ref().map(|v| v.span()),
            "ban.duration",
            "must be at most 24h",
        );
        duration = MAX_BAN;
    }
    let shadow = match raw.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("enforce", _)) => false,
        Some(("shadow", _)) => true,
        Some((_, span)) => {
            d.error(Some(span), "ban.mode", "expected \"enforce\" or \"shadow\"");
            false
        }
    };
    BanConfig {
        automatic: Some(AutoBan {
            after: std::num::NonZeroU32::new(after as u32).unwrap_or(std::num::NonZeroU32::MIN),
            within,
            duration,
            escalate: raw.escalate.unwrap_or(true),
            shadow,
        }),
        max_bans: max(d, raw.max_bans.as_ref()),
    }
}

pub(super) fn compile_admin(d: &mut Diagnostics, raw: raw::Admin) -> AdminConfig {
    let listen = raw
        .listen
        .as_ref()
        .and_then(|l| socket_addr(d, "admin.listen", l))
        .unwrap_or_else(|| {
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("default admin address parses")
        });
    let token = secret(d, "admin.token", raw.token);
    AdminConfig { listen, token }
}

/// A token or secret: the text, or `"env:NAME"`'s value; never empty.
pub(super) fn secret(
    d: &mut Diagnostics,
    key: &str,
    raw: Option<Spanned<String>>,
) -> Option<String> {
    raw.and_then(|token| {
        let text = token.get_ref();
        match text.strip_prefix("env:") {
            None if text.is_empty() => {
                d.error(Some(token.span()), key, "must not be empty");
                None
            }
            None => Some(text.clone()),
            Some(var) => match std::env::var(var) {
                Ok(value) if !value.is_empty() => Some(value),
                _ => {
                    d.error(
                        Some(token.span()),
                        key,
                        format!("environment variable {var} is not set or empty"),
                    );
                    None
                }
            },
        }
    })
}

/// `[limits]`: how `per_day` counts, and the time zone of calendar days and billing
/// periods (UTC unless set).
pub(super) fn compile_limits(d: &mut Diagnostics, raw: raw::Limits) -> (DayMode, TimeZone) {
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
    let zone = zone.unwrap_or(TimeZone::UTC);
    let day = match raw.day.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
        // The zone still counts per_month and per_year.
        None | Some(("sliding", _)) => DayMode::Sliding,
        Some(("calendar", _)) => DayMode::Calendar(zone.clone()),
        Some((other, span)) => {
            d.error(
                Some(span),
                "limits.day",
                format!("unknown day mode \"{other}\" (expected \"sliding\" or \"calendar\")"),
            );
            DayMode::Sliding
        }
    };
    (day, zone)
}

pub(super) fn compile_access(d: &mut Diagnostics, raw: raw::Access) -> AccessConfig {
    AccessConfig {
        deny: cidrs(d, "access.deny", raw.deny),
        exempt: cidrs(d, "access.exempt", raw.exempt),
    }
}

/// `[log]`: the access log's format and the request id header. The access log is on
/// by default, as nginx's is, in JSON: one object a line is what log shippers (Loki,
/// Elasticsearch, CloudWatch) parse without a pattern written for it.
pub(super) fn compile_log(d: &mut Diagnostics, raw: raw::Log) -> LogConfig {
    let access = match raw
        .access
        .as_ref()
        .map(|a| (a.get_ref().as_str(), a.span()))
    {
        None | Some(("json", _)) => AccessLogFormat::Json,
        Some(("text", _)) => AccessLogFormat::Text,
        Some(("off", _)) => AccessLogFormat::Off,
        Some((other, span)) => {
            d.error(
                Some(span),
                "log.access",
                format!("unknown format \"{other}\" (expected \"json\", \"text\" or \"off\")"),
            );
            AccessLogFormat::Json
        }
    };
    let request_id_header = match &raw.request_id_header {
        None => HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER),
        Some(h) => HeaderName::try_from(h.get_ref().to_ascii_lowercase()).unwrap_or_else(|_| {
            d.error(
                Some(h.span()),
                "log.request_id_header",
                format!("\"{}\" is not a valid header name", h.get_ref()),
            );
            HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER)
        }),
    };
    let refused = match raw
        .refused
        .as_ref()
        .map(|r| (r.get_ref().as_str(), r.span()))
    {
        None | Some(("summary", _)) => RefusedLog::Summary,
        Some(("all", _)) => RefusedLog::All,
        Some((other, span)) => {
            d.error(
                Some(span),
                "log.refused",
                format!("unknown value \"{other}\" (expected \"summary\" or \"all\")"),
            );
            RefusedLog::Summary
        }
    };
    LogConfig {
        access,
        request_id_header,
        refused,
    }
}
