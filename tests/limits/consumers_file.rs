//! End-to-end consumers file: consumers listed one JSON object a line beside
//! `gateway.toml`, read with the config, swapped when the file changes (a bad file
//! keeps the old set), validated by `sluice check`, written by `sluice hash-key
//! --batch`, and counted in `sluice_consumers{source}`.

use crate::support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::{Live, Req, Resp, live_at, metric};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

const CONFIG: &str = r#"
[identity]
consumers_file = "consumers.jsonl"
[policies.p]
anonymous = { per_minute = 1 }
registered = { per_minute = 3 }
gold = { per_minute = 6 }
[[consumers]]
name = "in-config"
key = "demo-key-config"
[[routes]]
name = "api"
path_prefix = "/api"
respond = { status = 200, body = "ok" }
policy = "p"
"#;

fn line(name: &str, plan: &str, key: &str, extra: &str) -> String {
    let hash = const_hex::encode(Sha256::digest(key.as_bytes()));
    format!(r#"{{"name": "{name}", "plan": "{plan}", "key_sha256": "{hash}"{extra}}}"#)
}

fn write(dir: &Path, lines: &[String]) {
    // Written whole and renamed over the old file, as a generator should.
    let tmp = dir.join("consumers.jsonl.tmp");
    std::fs::write(&tmp, lines.join("\n") + "\n").unwrap();
    std::fs::rename(tmp, dir.join("consumers.jsonl")).unwrap();
}

async fn start(lines: &[String]) -> Live {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), lines);
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, CONFIG).unwrap();
    live_at(dir, path).await
}

async fn get(gw: &Live, key: &str) -> Resp {
    Req::get("/api/x")
        .header("x-api-key", key)
        .send(gw.addr)
        .await
}

/// Waits (real time, at most 10 s) until `key` gets `status`.
async fn wait_for(gw: &Live, key: &str, status: u16) -> Duration {
    let started = Instant::now();
    loop {
        if get(gw, key).await.status == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{key} never got {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn gauge(gw: &Live, source: &str) -> f64 {
    let text = gw.admin(Req::get("/metrics")).await.text();
    metric(&text, &format!("sluice_consumers{{source=\"{source}\"}}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_from_the_file_are_identified_with_their_plans_and_limits() {
    let gw = start(&[
        "# generated".to_string(),
        line("a", "registered", "key-a", ""),
        String::new(),
        line("b", "gold", "key-b", r#", "limits": {"per_minute": 2}"#),
        line("c", "gold", "key-c", r#", "disabled": true"#),
    ])
    .await;
    assert_eq!(gauge(&gw, "file").await, 3.0);
    assert_eq!(gauge(&gw, "config").await, 1.0);
    for (key, budget) in [("key-a", 3), ("key-b", 2), ("demo-key-config", 3)] {
        for _ in 0..budget {
            assert_eq!(get(&gw, key).await.status, 200, "{key}");
        }
        get(&gw, key).await.problem(429);
    }
    get(&gw, "key-c").await.problem(401);
    let usage = gw
        .admin(Req::get("/admin/usage?caller=consumer:b"))
        .await
        .json();
    assert_eq!(usage["policies"][0]["plan"], "gold", "{usage}");
    assert_eq!(usage["policies"][0]["limits"][0]["limit"], 2, "{usage}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_swapped_and_a_bad_one_keeps_the_old_set() {
    let a = line("a", "registered", "key-a", "");
    let b = line("b", "registered", "key-b", "");
    let gw = start(&[a.clone(), b.clone()]).await;
    let dir = gw.path.parent().unwrap().to_path_buf();
    assert_eq!(get(&gw, "key-b").await.status, 200);
    // A bad line: the whole file is refused, the old set keeps serving.
    write(&dir, &[a.clone(), "{\"name\": \"x\"}".to_string()]);
    let started = Instant::now();
    loop {
        let text = gw.admin(Req::get("/metrics")).await.text();
        if metric(&text, "sluice_config_reloads_total{result=\"error\"}") == Some(1.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the bad file was not read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&gw, "key-b").await.status, 200);
    // b removed, c disabled: both refused soon after the change.
    let c = line("c", "registered", "key-c", r#", "disabled": true"#);
    write(&dir, &[a.clone(), c]);
    let took = wait_for(&gw, "key-b", 401).await;
    get(&gw, "key-c").await.problem(401);
    assert_eq!(get(&gw, "key-a").await.status, 200);
    assert_eq!(gauge(&gw, "file").await, 2.0);
    eprintln!("removed key refused after {took:?}");
    gw.stop().await;
}

async fn check(gw: &Live, body: &str) -> Resp {
    gw.admin(Req::post("/v1/check", body.to_string())).await
}

/// The decision API answers for a disabled consumer what its key gets when proxied:
/// not allowed (401's "unauthorized"), nothing counted; after a swap disables one,
/// from then on; a removed consumer is no longer known (its plan is not implied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api_refuses_a_disabled_consumer_like_its_key() {
    let a = line("a", "registered", "key-a", "");
    let b = line("b", "gold", "key-b", "");
    let off = line("off", "registered", "key-off", r#", "disabled": true"#);
    let gw = start(&[a.clone(), b.clone(), off]).await;
    let dir = gw.path.parent().unwrap().to_path_buf();
    for body in [
        r#"{"policy": "p", "caller": "consumer:off"}"#,
        r#"{"policy": "p", "caller": "consumer:off", "plan": "gold"}"#,
        r#"{"policy": "p", "caller": "consumer:off", "charge": 5}"#,
    ] {
        let answer = check(&gw, body).await;
        assert_eq!(answer.status, 200, "{body}: {}", answer.text());
        let answer = answer.json();
        assert_eq!(answer["allowed"], false, "{body}: {answer}");
        assert_eq!(answer["unauthorized"], true, "{body}: {answer}");
    }
    get(&gw, "key-off").await.problem(401);
    // Nothing was counted for it.
    let usage = gw
        .admin(Req::get("/admin/usage?caller=consumer:off"))
        .await
        .json();
    let used = &usage["policies"][0]["limits"][0]["used"];
    assert!(used.is_null() || *used == 0, "{usage}");
    // An enabled consumer is checked and counted as usual.
    let answer = check(&gw, r#"{"policy": "p", "caller": "consumer:b"}"#)
        .await
        .json();
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(answer.get("unauthorized").is_none(), "{answer}");
    assert_eq!(answer["limits"][0]["remaining"], 5, "{answer}");
    // a disabled, b removed by a new file: the check follows the swap.
    let a_off = line("a", "registered", "key-a", r#", "disabled": true"#);
    write(&dir, &[a_off]);
    wait_for(&gw, "key-b", 401).await;
    get(&gw, "key-a").await.problem(401);
    let answer = check(&gw, r#"{"policy": "p", "caller": "consumer:a"}"#)
        .await
        .json();
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["unauthorized"], true, "{answer}");
    // b is no consumer any more: its plan (gold) is not implied, so a check that does
    // not name one is refused as a caller of unknown plan.
    check(&gw, r#"{"policy": "p", "caller": "consumer:b"}"#)
        .await
        .problem(400);
    gw.stop().await;
}

#[test]
fn sluice_check_reports_the_file_the_line_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.toml"), CONFIG).unwrap();
    write(
        dir.path(),
        &[
            line("a", "registered", "key-a", ""),
            line("a", "registered", "key-a2", ""),
            r#"{"name": "z", "key_sha256": "nothex"}"#.to_string(),
            line("d", "registered", "key-a", ""),
            line("e", "anonymous", "key-e", ""),
            r#"{"name": "f", "key_sha256": "00", "colour": "red"}"#.to_string(),
            "not json".to_string(),
            // 64 characters, but a `0x` and 62 digits: not a key's hash.
            format!(r#"{{"name": "g", "key_sha256": "0x{}"}}"#, "ab".repeat(31)),
        ],
    );
    let out = Command::new(SLUICE)
        .args(["check"])
        .current_dir(dir.path())
        .env_remove("SLUICE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    for expected in [
        "name: duplicate consumer \"a\"",
        "consumers.jsonl:2:",
        "key_sha256: must be 64 hex digits",
        "consumers.jsonl:3:",
        "key_sha256: the same key as consumer \"a\"",
        "consumers.jsonl:4:",
        "plan: \"anonymous\" cannot be a consumer's plan",
        "consumers.jsonl:5:",
        "unknown field `colour`",
        "consumers.jsonl:6:",
        "not a consumer: expected",
        "consumers.jsonl:7:",
        "consumers.jsonl:8:",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    // Line 3's bad hash and line 8's `0x` one, each reported.
    assert_eq!(
        text.matches("key_sha256: must be 64 hex digits").count(),
        2,
        "{text}"
    );
    // In the order of the lines, though duplicates are found after all are read.
    let at = |line: usize| text.find(&format!("consumers.jsonl:{line}:")).unwrap();
    assert!((2..8).all(|line| at(line) < at(line + 1)), "{text}");
}

#[test]
fn hash_key_batch_writes_consumers_file_lines() {
    let mut child = Command::new(SLUICE)
        .args(["hash-key", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = "acme gold demo-key-acme\n\nbeta registered a key with spaces\n";
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["name"], "acme");
    assert_eq!(lines[0]["plan"], "gold");
    assert_eq!(lines[0]["key_sha256"], support::ACME_SHA256);
    let spaced = const_hex::encode(Sha256::digest(b"a key with spaces"));
    assert_eq!(lines[1]["key_sha256"], spaced.as_str());
    // A line without a key stops it with the line's number.
    let mut child = Command::new(SLUICE)
        .args(["hash-key", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"ok gold k\nbroken gold\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_consumers_load_and_any_key_is_found() {
    let lines: Vec<String> = (0..100_000)
        .map(|i| line(&format!("c{i}"), "registered", &format!("key-{i}"), ""))
        .collect();
    let gw = start(&lines).await;
    assert_eq!(gauge(&gw, "file").await, 100_000.0);
    for i in [0, 4_242, 99_999] {
        assert_eq!(get(&gw, &format!("key-{i}")).await.status, 200, "key-{i}");
    }
    get(&gw, "key-100000").await.problem(401);
    gw.stop().await;
}

/// A consumer's name follows the rule every caller name follows (1 to 256 bytes of
/// visible ASCII): a name with a newline, a space or 257 bytes is refused by `sluice
/// check` with the file, the line and the reason, in the consumers file and in
/// `[[consumers]]` alike.
#[test]
fn consumer_names_follow_the_caller_name_rule_in_sluice_check() {
    let dir = tempfile::tempdir().unwrap();
    let config = CONFIG.replace("name = \"in-config\"", "name = \"in config\"");
    std::fs::write(dir.path().join("gateway.toml"), config).unwrap();
    let longest = "n".repeat(256);
    write(
        dir.path(),
        &[
            line(
                r"evil\n2026-11-27T10:00:00.000Z 10.0.0.1",
                "registered",
                "key-a",
                "",
            ),
            line("two words", "registered", "key-b", ""),
            line(&"n".repeat(257), "registered", "key-c", ""),
            line(&longest, "registered", "key-d", ""),
            line(r"bell\u0007", "registered", "key-e", ""),
        ],
    );
    let out = Command::new(SLUICE)
        .args(["check"])
        .current_dir(dir.path())
        .env_remove("SLUICE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    for expected in [
        "consumers.jsonl:1:",
        "name: holds a newline at byte 4",
        "consumers.jsonl:2:",
        "name: holds a space at byte 3",
        "consumers.jsonl:3:",
        "name: is 257 bytes long; a caller name is at most 256",
        "consumers.jsonl:5:",
        "name: holds the control character '\\u{7}' at byte 4",
        "consumers[0].name",
        "gateway.toml:",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
    assert!(
        !text.contains("consumers.jsonl:4:"),
        "256 bytes is a name:\n{text}"
    );
    assert_eq!(
        text.matches("a caller name is visible ASCII").count(),
        4,
        "{text}"
    );
}

/// A swapped-in consumers file with such a name is refused whole, with the line and
/// the reason, and the old consumers keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumers_file_with_a_forging_name_is_not_swapped_in() {
    let a = line("a", "registered", "key-a", "");
    let gw = start(std::slice::from_ref(&a)).await;
    let dir = gw.path.parent().unwrap().to_path_buf();
    assert_eq!(get(&gw, "key-a").await.status, 200);
    write(
        &dir,
        &[a.clone(), line(r"b\nforged", "registered", "key-b", "")],
    );
    let reload = gw.admin(Req::post("/admin/reload", "")).await;
    assert_eq!(reload.status, 400, "{}", reload.text());
    let why = reload.text();
    assert!(
        why.contains("consumers.jsonl:2") && why.contains("holds a newline"),
        "{why}"
    );
    get(&gw, "key-b").await.problem(401);
    assert_eq!(get(&gw, "key-a").await.status, 200);
    gw.stop().await;
}
