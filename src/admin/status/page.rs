//! The status page: one HTML document made from a [`Status`], readable as it is
//! (no script needed), with its CSS and a small script inline. The script reads
//! `GET /admin/status` every 2 s and redraws the same tables from it; it sets
//! text only (`textContent`), never markup, so a caller's name is never HTML.
//!
//! The answer's `Content-Security-Policy` lets nothing run or load but that one
//! style and script (by a nonce made for this answer) and requests to this
//! listener: no external asset, no inline handler, no `eval`.

use std::fmt::Write;

use super::{Callers, NearCaller, Status};
use crate::observe::hitters::RefusedBy;

const CSS: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The `Content-Security-Policy` of a page whose style and script carry `nonce`.
pub(crate) fn policy(nonce: &str) -> String {
    format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; \
         frame-ancestors 'none'"
    )
}

/// The page showing `status`; `csrf` is the session's token for the lift buttons.
pub(crate) fn render(status: &Status, nonce: &str, csrf: Option<&str>) -> String {
    let mut html = String::with_capacity(16 * 1024);
    let csrf = csrf.map_or(String::new(), |token| {
        format!("<meta name=\"csrf-token\" content=\"{}\">", esc(token))
    });
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">{csrf}\
         <title>sluice status</title><style nonce=\"{nonce}\">{CSS}</style></head><body>\
         <header><h1>sluice status</h1>\
         <p id=\"summary\" role=\"status\" aria-live=\"polite\">{}</p>\
         <noscript><p>This is a snapshot: reload the page to update it. Lifting a ban \
         needs JavaScript (or <code>DELETE /admin/bans?caller=...</code>).</p></noscript>\
         </header><main>",
        esc(&summary(status))
    );
    routes(&mut html, status);
    super::decisions::render(&mut html, &status.decisions);
    refused(&mut html, &status.refused);
    near(&mut html, &status.near_limit, status.scope.near_limit);
    bans(&mut html, status);
    concurrency(&mut html, status);
    facts(&mut html, status);
    let _ = writeln!(
        html,
        "</main><script nonce=\"{nonce}\">{SCRIPT}</script></body></html>"
    );
    html
}

/// The line a screen reader hears when the figures change.
fn summary(status: &Status) -> String {
    format!(
        "Refusals in the last minute: {} · refused callers: {} · near a limit: {} · bans: {} · config generation: {}",
        status.refused.top.total,
        status.refused.top.callers.len(),
        status.near_limit.top.callers.len(),
        status.bans.len(),
        status.config.generation
    )
}

/// A table: its id, caption, column headers, and rows of cells (already escaped).
pub(super) fn table(
    html: &mut String,
    id: &str,
    title: &str,
    note: &str,
    heads: &[&str],
    rows: Vec<String>,
) {
    let _ = write!(
        html,
        "<section aria-labelledby=\"{id}-title\"><h2 id=\"{id}-title\">{title}</h2>\
         <table id=\"{id}\"><caption>{note}</caption><thead><tr>"
    );
    for head in heads {
        let _ = write!(html, "<th scope=\"col\">{head}</th>");
    }
    let _ = write!(html, "</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(html, "<tr><td colspan=\"{}\">none</td></tr>", heads.len());
    }
    for row in rows {
        let _ = write!(html, "<tr>{row}</tr>");
    }
    html.push_str("</tbody></table></section>");
}

fn routes(html: &mut String, status: &Status) {
    let rows = status.routes.iter().map(|r| {
        let s = &r.series;
        format!(
            "<th scope=\"row\">{}</th>{}{}{}{}<td>{}</td>{}",
            esc(&r.route),
            rate(r.admitted_per_s, &s.admitted, "admitted"),
            rate(r.limited_per_s, &s.limited, "limited"),
            rate(r.refused_per_s, &s.refused, "refused"),
            rate(
                r.upstream_errors_per_s,
                &s.upstream_errors,
                "upstream errors"
            ),
            ms(r.p50_ms),
            rate_ms(r.p99_ms, &s.p99_ms),
        )
    });
    let heads = [
        "Route",
        "Admitted/s",
        "Limited/s",
        "Refused/s",
        "Upstream errors/s",
        "p50",
        "p99",
    ];
    let note = "This replica, last 5 minutes. Refusals before routing (bans, access lists, no route) are under “none”.";
    table(
        html,
        "routes",
        "Traffic per route",
        note,
        &heads,
        rows.collect(),
    );
}

fn rate(value: f64, series: &[f64], what: &str) -> String {
    format!("<td>{}{}</td>", number(value), spark(series, what))
}

fn rate_ms(value: Option<f64>, series: &[f64]) -> String {
    format!("<td>{}{}</td>", ms(value), spark(series, "p99 latency"))
}

fn refused(html: &mut String, callers: &Callers<RefusedBy>) {
    let rows = callers.top.callers.iter().map(|c| {
        format!(
            "<th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td>",
            esc(&c.tag.caller),
            esc(&c.tag.policy),
            esc(c.tag.limit),
            c.count
        )
    });
    let note = format!(
        "This replica, last {} s: {} refusals; counts within ±{} (Space-Saving summary).",
        callers.window_s, callers.top.total, callers.top.error_bound
    );
    let heads = ["Caller", "Policy", "Limit", "Refused"];
    table(
        html,
        "refused",
        "Callers refused most",
        &note,
        &heads,
        rows.collect(),
    );
}

fn near(html: &mut String, callers: &Callers<NearCaller>, scope: &str) {
    let rows = callers.top.callers.iter().map(|c| {
        let at = &c.tag.at;
        format!(
            "<th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{} of {}</td><td>{:.0} %</td><td>{}</td>",
            esc(&at.caller),
            esc(&at.policy),
            esc(at.window),
            at.used,
            at.limit,
            c.tag.ratio * 100.0,
            c.count
        )
    });
    let whose = match scope {
        "fleet" => "Every replica",
        _ => "This replica",
    };
    let note = format!(
        "{whose}, last {} s: callers whose requests found a window at 80 % or more.",
        callers.window_s
    );
    let heads = ["Caller", "Policy", "Window", "Used", "Share", "Requests"];
    table(
        html,
        "near",
        "Callers near a limit",
        &note,
        &heads,
        rows.collect(),
    );
}

fn bans(html: &mut String, status: &Status) {
    let rows = status.bans.iter().map(|b| {
        format!(
            "<th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td>\
             <td><button type=\"button\" class=\"lift\" data-caller=\"{}\">Lift ban on {}</button></td>",
            esc(&b.caller),
            esc(&b.reason),
            duration(b.remaining),
            b.refusals,
            esc(&b.caller),
            esc(&b.caller)
        )
    });
    let note = match status.scope.bans {
        "fleet" => "Every replica's (Redis).",
        _ => "This replica's.",
    };
    let heads = ["Caller", "Reason", "Time left", "Refusals", "Action"];
    table(html, "bans", "Bans in force", note, &heads, rows.collect());
}

fn concurrency(html: &mut String, status: &Status) {
    let rows = status.concurrency.iter().map(|c| {
        format!(
            "<th scope=\"row\">{}</th><td>{} of {}</td><td>{} of {}</td>",
            esc(&c.policy),
            c.in_use,
            c.max,
            c.queued,
            c.queue
        )
    });
    let heads = ["Policy", "In use", "Queued"];
    let note = "Policies with a concurrency cap, this replica.";
    table(
        html,
        "concurrency",
        "Concurrency",
        note,
        &heads,
        rows.collect(),
    );
}

/// The store, identity, config and process, as term and value.
fn facts(html: &mut String, status: &Status) {
    let store = &status.store;
    let ping = match (store.reachable, store.ping_ms) {
        (None, _) => "in this process".to_string(),
        (Some(true), Some(ms)) => format!("answers, {ms:.2} ms"),
        _ => "does not answer".to_string(),
    };
    let reload = last_reload(status);
    let jwks = jwks(status);
    let rss = status
        .process
        .rss_bytes
        .map_or("unknown".to_string(), bytes);
    let items = [
        ("store-backend", "Store", store.backend.to_string()),
        ("store-nodes", "Nodes", store.nodes.join(", ")),
        ("store-ping", "Store now", ping),
        ("store-errors", "Store errors", store.errors.to_string()),
        (
            "store-fallback",
            "Fallback (on_error)",
            on_off(store.fallback),
        ),
        (
            "store-tracked",
            "Callers tracked",
            format!("{} of {}", store.tracked_callers, store.max_keys),
        ),
        (
            "consumers",
            "Consumers",
            format!(
                "{} in the config, {} from the file",
                status.identity.consumers_config, status.identity.consumers_file
            ),
        ),
        ("jwks", "JWKS", jwks),
        (
            "generation",
            "Config generation",
            status.config.generation.to_string(),
        ),
        ("reload", "Last reload", reload),
        ("version", "Version", status.process.version.to_string()),
        ("uptime", "Uptime", duration(status.process.uptime_s)),
        ("rss", "Resident memory", rss),
        (
            "connections",
            "Connections",
            connections(&status.process.connections),
        ),
        (
            "summary-bytes",
            "Summaries' memory (at most)",
            bytes(status.process.summary_bytes as u64),
        ),
    ];
    html.push_str("<section aria-labelledby=\"facts-title\"><h2 id=\"facts-title\">Store, identity, config, process</h2><dl id=\"facts\">");
    for (id, term, value) in items {
        let _ = write!(html, "<dt>{term}</dt><dd id=\"{id}\">{}</dd>", esc(&value));
    }
    html.push_str("</dl></section>");
}

/// The last reload as the page writes it: its result and generation, and its
/// errors.
fn last_reload(status: &Status) -> String {
    status
        .config
        .last_reload
        .as_ref()
        .map_or("none since start".to_string(), |last| {
            let mut text = format!("{} (generation {})", last.result, last.generation);
            for error in &last.errors {
                text.push_str("; ");
                text.push_str(error);
            }
            text
        })
}

/// The JWKS as the page writes it: keys, where from, how old, errors.
fn jwks(status: &Status) -> String {
    status
        .identity
        .jwks
        .as_ref()
        .map_or("not used".to_string(), |j| {
            let age = j.state.age_s.map_or("never fetched".to_string(), |s| {
                format!("fetched {s} s ago")
            });
            format!(
                "{} keys from {}, {age}, {} errors",
                j.state.keys, j.url, j.state.errors
            )
        })
}

/// The open connections as the page writes them (page.js writes them the same way).
fn connections(open: &super::Connections) -> String {
    format!(
        "{} HTTP/1, {} HTTP/2, {} WebSocket",
        open.http1, open.http2, open.websocket
    )
}

/// An inline sparkline of `series` (oldest first), scaled to its largest value.
fn spark(series: &[f64], what: &str) -> String {
    if series.len() < 2 {
        return String::new();
    }
    let top = series
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let step = 60.0 / (series.len() - 1) as f64;
    let mut points = String::new();
    for (i, value) in series.iter().enumerate() {
        let y = 15.0 - 14.0 * value / top;
        let _ = write!(points, "{:.1},{:.1} ", i as f64 * step, y);
    }
    format!(
        "<svg class=\"spark\" viewBox=\"0 0 60 16\" width=\"60\" height=\"16\" role=\"img\" \
         aria-label=\"{what}, last 5 minutes\"><polyline points=\"{}\"/></svg>",
        points.trim_end()
    )
}

pub(super) fn number(value: f64) -> String {
    match value {
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

fn ms(value: Option<f64>) -> String {
    value.map_or("–".to_string(), |ms| format!("{} ms", number(ms)))
}

fn duration(secs: u64) -> String {
    match secs {
        s if s >= 86_400 => format!("{}d {}h", s / 86_400, s % 86_400 / 3_600),
        s if s >= 3_600 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        s if s >= 60 => format!("{}m {}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n => format!("{:.0} KiB", n as f64 / 1024.0),
    }
}

fn on_off(on: bool) -> String {
    if on { "on" } else { "off" }.to_string()
}

/// `text` as HTML text or attribute value.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page a browser without a session gets (with a 401): the login form.
pub(crate) fn login(nonce: &str, failed: bool) -> String {
    let error = match failed {
        true => "<p id=\"login-error\" role=\"alert\">That token is not the admin token.</p>",
        false => "",
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <title>sluice status: log in</title><style nonce=\"{nonce}\">{CSS}</style></head>\
         <body><main><h1>sluice status</h1>{error}\
         <form method=\"post\" action=\"/login\" class=\"login\">\
         <label for=\"token\">Admin token</label>\
         <input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"current-password\" required>\
         <button type=\"submit\">Log in</button></form>\
         <p>Or send <code>Authorization: Bearer &lt;token&gt;</code>. The token is \
         <code>[admin] token</code> in the config.</p></main></body></html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::{duration, esc, spark};

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            esc("<script>\"x\"&'"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;"
        );
    }

    #[test]
    fn sparklines_scale_to_their_top() {
        let svg = spark(&[0.0, 5.0, 10.0], "admitted");
        assert!(
            svg.contains("points=\"0.0,15.0 30.0,8.0 60.0,1.0\""),
            "{svg}"
        );
        assert!(svg.contains("aria-label=\"admitted, last 5 minutes\""));
        assert_eq!(spark(&[1.0], "one point"), "");
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(600), "10m 0s");
        assert_eq!(duration(90_000), "1d 1h");
    }
}
