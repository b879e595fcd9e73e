//! What a new user trips over at the command line: `sluice check` names every error
//! of every route and suggests the name meant, refuses durations no timer can wait,
//! shows cost, concurrency caps and bans in its table; `sluice man` is a whole page;
//! the Kubernetes example says what its check needs.

use std::path::Path;
use std::process::{Command, Output};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

fn sluice(dir: &Path, args: &[&str]) -> Output {
    Command::new(SLUICE)
        .args(args)
        .current_dir(dir)
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const MANY_ERRORS: &str = r#"
[upstreams.orders]
targets = ["http://127.0.0.1:3000"]
timeout = "99999999999h"

[policies.standard]
anonymous = { per_minute = 10 }

[[routes]]
name = "one"
path_prefix = "/one"
upstream = "ordrs"
policy = "standrd"
cost = 0

[[routes]]
name = "two"
path_prefix = "/two"
upstream = "nowhere-near-anything"
policy = "standard"
"#;

#[test]
fn check_names_every_error_of_every_route_with_the_name_meant() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.toml"), MANY_ERRORS).unwrap();
    let out = sluice(dir.path(), &["check"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for (key, words) in [
        (
            "upstreams.orders.timeout",
            &["99999999999h", "longer than a year"][..],
        ),
        (
            "routes[0].upstream",
            &["unknown upstream \"ordrs\"", "did you mean `orders`?"],
        ),
        (
            "routes[0].policy",
            &["unknown policy \"standrd\"", "did you mean `standard`?"],
        ),
        ("routes[0].cost", &[][..]),
        (
            "routes[1].upstream",
            &["unknown upstream", "upstreams defined: orders"],
        ),
    ] {
        let block = (stderr.split("\n\n"))
            .find(|b| b.contains(&format!("error: {key}: ")))
            .unwrap_or_else(|| panic!("no error for {key} in:\n{stderr}"));
        for word in words {
            assert!(block.contains(word), "{block:?} should mention {word:?}");
        }
    }
    assert!(stderr.contains("5 error(s)"), "{stderr}");
}

const TABLE: &str = r#"
[upstreams.llm]
targets = ["http://127.0.0.1:3000"]

[policies.tokens]
registered = { per_minute = 1_000 }
anonymous = "deny"
concurrency = { max = 10, queue = 5, queue_timeout = "2s", per_caller = 2 }

[ban]
after = 20
within = "1m"
duration = "5m"

[[consumers]]
name = "acme"
key = "demo-key-acme"

[[routes]]
name = "chat"
path_prefix = "/chat"
upstream = "llm"
policy = "tokens"
cost = 2
cost_after = "json:usage.total_tokens"
default_cost = 7
"#;

#[test]
fn the_check_table_shows_cost_concurrency_and_bans() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.toml"), TABLE).unwrap();
    let out = sluice(dir.path(), &["check"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let header = stdout.lines().next().unwrap();
    for column in ["COST", "CONCURRENCY"] {
        assert!(header.contains(column), "{header}");
    }
    let chat = stdout.lines().find(|l| l.starts_with("chat ")).unwrap();
    for cell in [
        "2 + after json:usage.total_tokens (default 7)",
        "10 at once, queue 5 for 2s, 2 per caller",
    ] {
        assert!(chat.contains(cell), "{cell:?} not in {chat}");
    }
    let bans = stdout.lines().find(|l| l.starts_with("bans: ")).unwrap();
    assert!(
        bans.contains("20 429s") && bans.contains("within 60s") && bans.contains("for 300s"),
        "{bans}"
    );
}

#[test]
fn the_kubernetes_example_says_what_its_check_needs() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes/gateway.toml");
    let dir = tempfile::tempdir().unwrap();
    let path = example.to_str().unwrap();
    // As shipped, without the Secret's variable: the error names it...
    let out = sluice(dir.path(), &["check", "-c", path]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("SLUICE_ADMIN_TOKEN"), "{stderr}");
    // ... and the file says to set it, which is all the check needs.
    let file = std::fs::read_to_string(&example).unwrap();
    assert!(
        file.contains("SLUICE_ADMIN_TOKEN=x sluice check -c gateway.toml"),
        "{file}"
    );
    let set = Command::new(SLUICE)
        .args(["check", "-c", path])
        .env("SLUICE_ADMIN_TOKEN", "x")
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", text(&set.stderr));
}

#[test]
fn the_man_page_documents_every_command_and_what_the_command_line_cannot_tell() {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice(dir.path(), &["man"]);
    assert!(out.status.success());
    let page = text(&out.stdout);
    for section in [
        ".TH sluice",
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH COMMANDS",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH SIGNALS",
        ".SH \"EXIT STATUS\"",
        ".SH \"SEE ALSO\"",
    ] {
        assert!(page.contains(section), "{section} missing:\n{page}");
    }
    for command in ["run", "check", "hash-key", "health", "completions", "man"] {
        assert!(
            page.contains(&format!(".SS \"sluice {command}\"")),
            "{command}:\n{page}"
        );
    }
    for detail in [
        r"\-\-batch",
        r"\-\-admin",
        "SLUICE_CONFIG",
        "SIGHUP",
        "drain_timeout",
        "bash, ",
    ] {
        assert!(page.contains(detail), "{detail} missing:\n{page}");
    }
    // roff: no text line starts with a control character by accident.
    for line in page.lines() {
        assert!(!line.starts_with('\''), "{line}");
    }
}

const MESSAGE_LIMITS: &str = r#"
[upstreams.chat]
targets = ["http://127.0.0.1:3000"]

[policies.plain]
anonymous = { per_minute = 100 }
messages = { per_second = 20 }

[policies.sockets]
anonymous = { per_minute = 100 }
messages = { per_second = 20 }

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "chat"
policy = "plain"

[[routes]]
name = "ws"
path_prefix = "/ws"
upstream = "chat"
policy = "sockets"
websocket = true
"#;

#[test]
fn check_warns_of_a_message_limit_no_websocket_route_uses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.toml"), MESSAGE_LIMITS).unwrap();
    let out = sluice(dir.path(), &["check"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = (stderr.lines())
        .filter(|l| l.starts_with("warning: "))
        .collect();
    // Policy sockets, on the WebSocket route, is not warned of.
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains(" policies.plain.messages: ")
            && warnings[0].contains("no route with websocket = true uses it"),
        "{stderr}"
    );
}
