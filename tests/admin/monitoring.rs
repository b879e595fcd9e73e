//! The dashboard and alert rules in `monitoring/`: the rules pass `promtool check
//! rules` and their unit tests (`promtool test rules`), every dashboard query is valid
//! PromQL, and every metric name they use is one a running gateway exports.

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{Req, Toml, UpstreamOptions, live, route, upstream_with};

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring")
}

/// Runs promtool with `args` in `dir`; fails the test with its output if it fails.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool cannot run ({e}): install the Debian package `prometheus`; \
                 the test script installs it"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every PromQL expression of the dashboard, with Grafana's variables replaced by
/// what Prometheus itself accepts.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(monitoring().join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queries = Vec::new();
    for panel in panels {
        let targets = panel["targets"]
            .as_array()
            .expect("every panel has queries");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            queries.push(
                expr.replace("$__rate_interval", "5m")
                    .replace("$instance", ".*")
                    .replace("$route", ".*"),
            );
        }
    }
    queries
}

fn alert_rules() -> String {
    std::fs::read_to_string(monitoring().join("alerts.yml")).unwrap()
}

/// `sluice_*` and `process_*` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word && (rest.starts_with("sluice_") || rest.starts_with("process_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            names.insert(rest[..len].to_string());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let checked = promtool(&monitoring(), &["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&monitoring(), &["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    for alert in [
        "SluiceStoreFallback",
        "SluiceReloadFailed",
        "SluiceHigh5xxRatio",
        "SluiceQueueSaturated",
        "SluiceLimiterTableNearFull",
        "SluiceShadowWouldRefuse",
    ] {
        let tests = std::fs::read_to_string(monitoring().join("alerts.test.yml")).unwrap();
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no unit test"
        );
    }
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    // promtool parses each as a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in dashboard_queries().iter().enumerate() {
        let quoted = serde_json::to_string(query).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {quoted}\n"
        ));
    }
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    promtool(dir.path(), &["check", "rules", "dashboard.yml"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_use_is_exported() {
    let failing = upstream_with(UpstreamOptions {
        status: 500,
        ..UpstreamOptions::default()
    })
    .await;
    let shop = |name: &str, prefix: &str, policy: &str| {
        route(name, prefix).upstream("shop").policy(policy)
    };
    let live = live(
        &Toml::new()
            .upstream("shop", &[failing.url()])
            .policy(
                "flash",
                &[
                    ("anonymous", "{ per_minute = 1 }"),
                    ("concurrency", "{ max = 2, queue = 10 }"),
                ],
            )
            .policy(
                "trial",
                &[("anonymous", "{ per_minute = 1 }"), ("mode", "\"shadow\"")],
            )
            .policy("paid", &[("anonymous", "{ per_minute = 5 }")])
            .route(shop("orders", "/orders", "flash"))
            .route(shop("trial", "/trial", "trial"))
            .route(
                shop("metered", "/metered", "paid")
                    .with("cost_after = \"json:usage.total_tokens\"")
                    .with("default_cost = 3"),
            )
            .route(shop("refunded", "/refunded", "paid").with("refund_on = [500]"))
            .build(),
    )
    .await;
    // An upstream 5xx, then a 429, a shadow refusal and a refund: every lazily made
    // series exists.
    assert_eq!(live.get("/orders").await.status, 500);
    assert_eq!(live.get("/orders").await.status, 429);
    assert_eq!(live.get("/trial").await.status, 500);
    assert_eq!(live.get("/trial").await.status, 500, "shadow: served");
    assert_eq!(live.get("/refunded").await.status, 500);
    // Not JSON: default_cost, 2 more than admission counted, charged once it ends.
    assert_eq!(live.get("/metered").await.status, 500);
    let charged = "sluice_cost_charged_total{policy=\"paid\",route=\"metered\"} 2";
    let deadline = std::time::Instant::now() + support::WAIT;
    while std::time::Instant::now() < deadline {
        let text = live.admin(Req::get("/metrics")).await.text();
        if text.contains(charged) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let exported = live.admin(Req::get("/metrics")).await.text();
    let mut used = metric_names(&alert_rules());
    for query in dashboard_queries() {
        used.extend(metric_names(&query));
    }
    assert!(used.len() >= 20, "{used:?}");
    let missing: Vec<_> = used
        .iter()
        .filter(|name| {
            !exported
                .lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not in /metrics: {missing:?}\n{exported}"
    );
    live.stop().await;
}

/// The metric names the metric table defines (`src/observe/metrics/`: every
/// registered metric's name is a string literal there).
fn defined_metrics() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/observe/metrics");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in text.match_indices("\"sluice_") {
            let name = &text[at + 1..];
            names.insert(name[..name.find('"').unwrap()].to_string());
        }
    }
    names
}

/// The names in the metrics table of `docs/operations.md` (rows starting with a
/// metric name in backquotes).
fn documented_metrics() -> BTreeSet<String> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md");
    let text = std::fs::read_to_string(docs).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("| `sluice_"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| format!("sluice_{name}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_registered_metric_is_documented_and_every_documented_one_exists() {
    let live = live(
        &Toml::new()
            .policy("paid", &[("anonymous", "{ per_minute = 5 }")])
            .route(
                route("hello", "/hello")
                    .with("respond = { status = 200 }")
                    .policy("paid"),
            )
            .build(),
    )
    .await;
    assert_eq!(live.get("/hello").await.status, 200);
    let exported = live.admin(Req::get("/metrics")).await.text();
    live.stop().await;
    let exported: BTreeSet<String> = (exported.lines())
        .filter_map(|line| line.strip_prefix("# HELP "))
        .filter_map(|rest| rest.split(' ').next())
        .filter(|name| name.starts_with("sluice_"))
        .map(str::to_string)
        .collect();
    let defined = defined_metrics();
    assert!(
        exported.is_subset(&defined),
        "exported but not in the metric table: {:?}",
        exported.difference(&defined).collect::<Vec<_>>()
    );
    assert!(defined.len() >= 38, "{defined:?}");
    let documented = documented_metrics();
    let undocumented: Vec<_> = defined.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "registered but missing from docs/operations.md's metrics table: {undocumented:?}"
    );
    let stale: Vec<_> = documented.difference(&defined).collect();
    assert!(
        stale.is_empty(),
        "in docs/operations.md but registered nowhere: {stale:?}"
    );
}
