//! Envoy's rate limit service, called by Envoy's own generated client
//! (`RateLimitServiceStub` from `xds-protos`, over `grpcio`) against the `sluice`
//! binary serving the reference service's descriptor files
//! (`examples/proxies/ratelimit/`): every field of the answers, all or nothing
//! across descriptors, `hits_addend`, overrides, the token, and bad input.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

pub(super) use super::support::rls::rls;
use super::support::{blocking_request, free_port};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// `sluice run` of `examples/proxies`' gateway.toml and descriptor files (with
/// free ports and `extra` appended to `[decision]`), until dropped.
struct Sluice {
    child: Child,
    decision: String,
    admin: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &str) -> Sluice {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/proxies");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ratelimit")).unwrap();
    for file in ["messaging.yaml", "edge.yaml"] {
        let from = examples.join("ratelimit").join(file);
        std::fs::copy(from, dir.path().join("ratelimit").join(file)).unwrap();
    }
    let (port, decision, admin) = (free_port(), free_port(), free_port());
    let config = std::fs::read_to_string(examples.join("gateway.toml"))
        .unwrap()
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
        .replace(
            "listen = \"127.0.0.1:8081\"",
            &format!("listen = \"127.0.0.1:{decision}\"\n{extra}"),
        )
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(SLUICE)
        .args(["run", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sluice runs");
    let sluice = Sluice {
        child,
        decision: format!("127.0.0.1:{decision}"),
        admin,
        _dir: dir,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(&sluice.decision).is_err() {
        assert!(std::time::Instant::now() < deadline, "sluice did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sluice
}

/// A call of one descriptor with these entries.
fn one(domain: &str, entries: &[(&str, &str)]) -> Value {
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
}

#[test]
fn the_reference_services_examples_answer_every_field() {
    let sluice = start("");
    let marketing = one(
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2061111111")],
    );
    let mut calls: Vec<Value> = (0..6).map(|_| marketing.clone()).collect();
    calls.push(one("messaging", &[("to_number", "2061111111")]));
    calls.push(one("nobody", &[("any", "thing")]));
    calls.push(one("edge", &[("ldap", "cn=svc")]));
    let answers = rls(&sluice.decision, &json!(calls));

    for (i, answer) in answers[..5].iter().enumerate() {
        assert_eq!(answer["grpc"], "OK", "{answer}");
        assert_eq!(answer["overall_code"], "OK");
        let status = &answer["statuses"][0];
        assert_eq!(status["code"], "OK");
        assert_eq!(
            status["current_limit"],
            json!({"name": "", "requests_per_unit": 5, "unit": "DAY"})
        );
        assert_eq!(status["limit_remaining"], 4 - i as u64);
        let reset = status["duration_until_reset"].as_f64().unwrap();
        assert!(reset > 86_000.0 && reset <= 86_400.0, "{reset}");
        // RateLimit headers of the descriptor: what is left of the day.
        let headers = answer["headers"].as_array().unwrap();
        let state = headers.iter().find(|h| h[0] == "ratelimit").unwrap();
        assert_eq!(state[1], format!("\"day\";r={};t=86400", 4 - i));
    }
    let over = &answers[5];
    assert_eq!(over["overall_code"], "OVER_LIMIT", "{over}");
    assert_eq!(over["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(over["statuses"][0]["limit_remaining"], 0);
    let retry = over["statuses"][0]["duration_until_reset"]
        .as_f64()
        .unwrap();
    assert!(
        retry > 86_000.0,
        "a sliding day frees its first request a day later: {retry}"
    );
    let headers = over["headers"].as_array().unwrap();
    assert!(headers.iter().any(|h| h[0] == "retry-after"), "{headers:?}");
    // The number's own descriptor is counted apart: 100 a day.
    let number = &answers[6]["statuses"][0];
    assert_eq!(number["current_limit"]["requests_per_unit"], 100);
    assert_eq!(number["limit_remaining"], 99);
    // No rule for the domain: OK, no limit, as the reference service answers.
    assert_eq!(answers[7]["overall_code"], "OK");
    let unruled = &answers[7]["statuses"][0];
    assert_eq!(unruled["current_limit"], Value::Null);
    assert_eq!(unruled["limit_remaining"], 0);
    assert_eq!(answers[7]["headers"], json!([]));
    let unlimited = &answers[8]["statuses"][0];
    assert_eq!(unlimited["code"], "OK");
    assert_eq!(unlimited["current_limit"], Value::Null);
    assert_eq!(unlimited["limit_remaining"], u64::from(u32::MAX));

    let (_, metrics) = blocking_request(sluice.admin, "GET", "/metrics").unwrap();
    let line = r#"sluice_rls_descriptors_total{code="ok",descriptor="none"} 1"#;
    assert!(metrics.contains(line), "{metrics}");
    let line = r#"sluice_decisions_total{outcome="limited",via="rls"} 1"#;
    assert!(metrics.contains(line), "{metrics}");
}

#[test]
fn wildcards_replaces_shadow_mode_and_a_blocked_value() {
    let sluice = start("");
    let calls = json!([
        one("edge", &[("path", "/api/v2")]),
        one("edge", &[("path", "/api/v1")]),
        {"domain": "edge", "descriptors": [
            {"entries": [["client_id", "c1"]]},
            {"entries": [["client_id", "c1"], ["uri", "/foo/bar"]]},
        ]},
        one("edge", &[("service", "auth")]),
        one("edge", &[("service", "auth")]),
        one("edge", &[("service", "auth")]),
        one("edge", &[("service", "auth")]),
        one("edge", &[("remote_address", "50.0.0.5")]),
        one("edge", &[("remote_address", "50.0.0.6")]),
    ]);
    let answers = rls(&sluice.decision, &calls);
    let limit = |answer: &Value, i: usize| answer["statuses"][i]["current_limit"].clone();
    assert_eq!(
        limit(&answers[0], 0)["requests_per_unit"],
        20,
        "{}",
        answers[0]
    );
    assert_eq!(
        limit(&answers[1], 0)["requests_per_unit"],
        5,
        "exact before prefix"
    );
    // The /foo/bar limit replaces client_id_limit in the same request.
    let replaced = &answers[2];
    assert_eq!(
        replaced["statuses"][0]["current_limit"],
        Value::Null,
        "{replaced}"
    );
    assert_eq!(limit(replaced, 1)["requests_per_unit"], 20);
    assert_eq!(replaced["statuses"][1]["limit_remaining"], 19);
    // Shadow mode: the fourth is over 3 an hour, and still OK.
    for answer in &answers[3..7] {
        assert_eq!(answer["overall_code"], "OK", "{answer}");
    }
    assert_eq!(answers[6]["statuses"][0]["limit_remaining"], 0);
    assert_eq!(
        answers[7]["overall_code"], "OVER_LIMIT",
        "requests_per_unit: 0"
    );
    assert_eq!(limit(&answers[7], 0)["requests_per_unit"], 0);
    assert_eq!(answers[8]["overall_code"], "OK");
    assert_eq!(limit(&answers[8], 0)["requests_per_unit"], 10);
}

#[test]
fn descriptors_are_all_or_nothing_and_hits_addend_counts_as_envoy_means() {
    let sluice = start("");
    let both = |first: (&str, &str), second: (&str, &str)| {
        json!({"domain": "edge", "descriptors": [
            {"entries": [[first.0, first.1]]},
            {"entries": [[second.0, second.1]]},
        ]})
    };
    let calls = json!([
        both(("tight", "t"), ("loose", "l")),
        both(("tight", "t"), ("loose", "l")),
        both(("loose", "l"), ("tight", "t")),
        one("edge", &[("loose", "l")]),
        // hits_addend: the request's 0 is 1, 3 is 3; a descriptor's own 0 looks.
        {"domain": "edge", "hits_addend": 3, "descriptors": [{"entries": [["path", "/api/x"]]}]},
        {"domain": "edge", "hits_addend": 0, "descriptors": [{"entries": [["path", "/api/x"]]}]},
        {"domain": "edge", "descriptors": [{"entries": [["path", "/api/x"]], "hits_addend": 0}]},
        {"domain": "edge", "hits_addend": 5, "descriptors": [
            {"entries": [["path", "/api/x"]], "hits_addend": 2}]},
        // A descriptor's own limit overrides (and needs no rule).
        {"domain": "any", "descriptors": [{"entries": [["k", "v"]],
            "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]},
        {"domain": "any", "descriptors": [{"entries": [["k", "v"]],
            "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]},
        {"domain": "any", "descriptors": [{"entries": [["k", "v"]],
            "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]},
    ]);
    let answers = rls(&sluice.decision, &calls);
    let remaining = |a: &Value, i: usize| a["statuses"][i]["limit_remaining"].as_u64().unwrap();
    let code = |a: &Value, i: usize| a["statuses"][i]["code"].as_str().unwrap().to_string();
    assert_eq!(answers[0]["overall_code"], "OK");
    assert_eq!(
        (remaining(&answers[0], 0), remaining(&answers[0], 1)),
        (0, 4)
    );
    // Refused by `tight`: `loose` is not charged.
    assert_eq!(answers[1]["overall_code"], "OVER_LIMIT");
    assert_eq!(
        (code(&answers[1], 0).as_str(), code(&answers[1], 1).as_str()),
        ("OVER_LIMIT", "OK")
    );
    assert_eq!(remaining(&answers[1], 1), 4);
    // `loose` first: charged, then given back when `tight` refuses.
    assert_eq!(answers[2]["overall_code"], "OVER_LIMIT");
    assert_eq!(remaining(&answers[2], 0), 4);
    assert_eq!(
        remaining(&answers[3], 0),
        3,
        "only the lone request counted"
    );
    assert_eq!(remaining(&answers[4], 0), 17);
    assert_eq!(remaining(&answers[5], 0), 16);
    assert_eq!(remaining(&answers[6], 0), 16, "a probe counts nothing");
    assert_eq!(
        remaining(&answers[7], 0),
        14,
        "the descriptor's own hits_addend"
    );
    assert_eq!(remaining(&answers[8], 0), 1);
    assert_eq!(answers[9]["overall_code"], "OK");
    assert_eq!(answers[10]["overall_code"], "OVER_LIMIT");
    let limit = &answers[10]["statuses"][0]["current_limit"];
    assert_eq!(limit["requests_per_unit"], 2);
    assert_eq!(limit["unit"], "MINUTE");
}

#[test]
fn negative_hits_give_back_only_when_the_request_admits_and_never_below_zero() {
    let sluice = start("");
    let loose = |hits: Option<u32>, negative: bool| json!({"entries": [["loose", "l"]], "hits_addend": hits, "negative": negative});
    let alone = |d: Value| json!({"domain": "edge", "descriptors": [d]});
    let tight = json!({"entries": [["tight", "t"]]});
    let address = |hits: u32, negative: bool| {
        json!({"domain": "sluice", "descriptors": [{"entries": [["remote_address", "10.9.0.1"]],
            "hits_addend": hits, "negative": negative}]})
    };
    let calls = json!([
        {"domain": "edge", "hits_addend": 3, "descriptors": [{"entries": [["loose", "l"]]}]},
        alone(loose(Some(2), true)),
        alone(tight.clone()),
        // `tight` refuses: the negative descriptor gives nothing back.
        {"domain": "edge", "descriptors": [loose(Some(4), true), tight]},
        alone(loose(Some(0), false)),
        alone(loose(Some(100), true)),
        alone(loose(Some(5), false)),
        alone(loose(None, false)),
        // A [[decision.descriptors]] policy's budget: 60 a minute.
        address(10, false),
        address(4, true),
    ]);
    let answers = rls(&sluice.decision, &calls);
    let remaining = |a: &Value| a["statuses"][0]["limit_remaining"].as_u64().unwrap();
    assert_eq!(remaining(&answers[0]), 2, "{}", answers[0]);
    assert_eq!(answers[1]["overall_code"], "OK", "{}", answers[1]);
    assert_eq!(answers[1]["statuses"][0]["code"], "OK");
    assert_eq!(remaining(&answers[1]), 4, "two of three given back");
    assert_eq!(answers[2]["overall_code"], "OK");
    assert_eq!(answers[3]["overall_code"], "OVER_LIMIT", "{}", answers[3]);
    assert_eq!(answers[3]["statuses"][0]["code"], "OK");
    assert_eq!(answers[3]["statuses"][1]["code"], "OVER_LIMIT");
    assert_eq!(
        remaining(&answers[4]),
        4,
        "a refused request gives nothing back"
    );
    assert_eq!(remaining(&answers[5]), 5, "never below zero");
    assert_eq!(answers[6]["overall_code"], "OK");
    assert_eq!(remaining(&answers[6]), 0, "exactly the limit fits again");
    assert_eq!(answers[7]["overall_code"], "OVER_LIMIT");
    assert_eq!(remaining(&answers[8]), 50, "{}", answers[8]);
    assert_eq!(remaining(&answers[9]), 54, "{}", answers[9]);
}

/// A limit of 0 refuses what a descriptor counts, but one that counts nothing (hits
/// given back, or an explicit `hits_addend` 0) fits it: OK, and counted `ok`, not
/// as a refusal.
#[test]
fn a_limit_of_zero_refuses_counting_but_not_giving_back_or_looking() {
    let sluice = start("");
    let zero = |hits: u32, negative: bool| {
        json!({"domain": "edge", "descriptors": [{"entries": [["zero", "z"]],
            "hits_addend": hits, "negative": negative,
            "limit": {"requests_per_unit": 0, "unit": "MINUTE"}}]})
    };
    let answers = rls(
        &sluice.decision,
        &json!([zero(2, true), zero(0, false), zero(1, false)]),
    );
    let codes: Vec<_> = (answers.iter())
        .map(|a| {
            (
                a["overall_code"].as_str(),
                a["statuses"][0]["code"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            (Some("OK"), Some("OK")),
            (Some("OK"), Some("OK")),
            (Some("OVER_LIMIT"), Some("OVER_LIMIT"))
        ],
        "{answers:#?}"
    );
    let (_, metrics) = blocking_request(sluice.admin, "GET", "/metrics").unwrap();
    for line in [
        r#"sluice_rls_descriptors_total{code="ok",descriptor="override"} 2"#,
        r#"sluice_rls_descriptors_total{code="over_limit",descriptor="override"} 1"#,
        r#"sluice_requests_total{outcome="allowed",plan="rls",route="override"} 2"#,
        r#"sluice_requests_total{outcome="limited",plan="rls",route="override"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[test]
fn without_the_token_nothing_is_counted() {
    let sluice = start("token = \"s3cret\"");
    let call = one("messaging", &[("to_number", "1")]);
    let with = |token: &str| {
        let mut call = call.clone();
        call["metadata"] = json!([["sluice-token", token]]);
        call
    };
    let answers = rls(
        &sluice.decision,
        &json!([call, with("wrong"), with("s3cret")]),
    );
    assert_eq!(answers[0]["grpc"], "UNAUTHENTICATED", "{}", answers[0]);
    assert_eq!(answers[1]["grpc"], "UNAUTHENTICATED");
    assert_eq!(answers[2]["grpc"], "OK");
    assert_eq!(answers[2]["statuses"][0]["limit_remaining"], 99);
}

/// Protobuf's varint.
fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Field `tag` (length-delimited) holding `bytes`.
fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(tag << 3) | 2];
    varint(bytes.len(), &mut out);
    out.extend_from_slice(bytes);
    out
}

/// A `RateLimitRequest` of `domain` with one descriptor of one entry, by hand (a
/// value no client library would send).
fn raw_request(domain: &str, key: &[u8], value: &[u8]) -> String {
    let entry = [field(1, key), field(2, value)].concat();
    let descriptor = field(1, &entry);
    let request = [field(1, domain.as_bytes()), field(2, &descriptor)].concat();
    const_hex::encode(request)
}

#[test]
fn bad_input_gets_a_clear_status_and_counts_nothing() {
    let sluice = start("");
    let every_byte: Vec<u8> = (0..=255).collect();
    let controls: Vec<u8> = (0..0x20).collect();
    let many: Vec<Value> = (0..10_000)
        .map(|i| json!({"entries": [["to_number", i.to_string()]]}))
        .collect();
    let huge = "9".repeat(1 << 20);
    let calls = json!([
        {"raw": "ffffffffff"},
        {"raw": "0a09"},
        {"raw": raw_request("messaging", b"to_number", &every_byte)},
        {"raw": raw_request("messaging", b"to_number", &controls)},
        {"domain": "messaging", "descriptors": many},
        {"domain": "messaging", "descriptors": [{"entries": [["to_number", huge]]}]},
        {"domain": "messaging", "descriptors": [{"entries": [["to_number", "9".repeat(9000)]]}]},
        {"domain": "messaging", "descriptors": []},
        {"domain": "", "descriptors": [{"entries": [["to_number", "1"]]}]},
        {"domain": "messaging", "descriptors": [{"entries": []}]},
        {"domain": "messaging", "descriptors": [{"entries": [["to_number", "1"]],
            "limit": {"requests_per_unit": 2, "unit": "UNKNOWN"}}]},
        one("messaging", &[("to_number", "1")]),
    ]);
    let answers = rls(&sluice.decision, &calls);
    let statuses: Vec<&str> = answers
        .iter()
        .map(|a| a["grpc"].as_str().unwrap())
        .collect();
    let expected = [
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "RESOURCE_EXHAUSTED",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "OK",
    ];
    assert_eq!(statuses, expected, "{answers:#?}");
    assert!(
        answers[4]["details"]
            .as_str()
            .unwrap()
            .contains("at most 64")
    );
    // Nothing was counted for number 1 before the last call.
    assert_eq!(answers[11]["statuses"][0]["limit_remaining"], 99);
    // And the process is still there.
    let (status, _) = blocking_request(sluice.admin, "GET", "/healthz").unwrap();
    assert_eq!(status, 200);
}

#[test]
fn limit_overrides_beyond_max_overrides_are_refused_and_the_others_keep_counting() {
    let sluice = start("max_overrides = 2");
    let own = |requests: u32| {
        json!({"entries": [["k", "v"]],
            "limit": {"requests_per_unit": requests, "unit": "MINUTE"}})
    };
    let calls = json!([
        {"domain": "any", "descriptors": [own(2)]},
        {"domain": "any", "descriptors": [own(3)]},
        // A third distinct override, beside one in use: refused whole.
        {"domain": "any", "descriptors": [own(2), own(4)]},
        // The same numbers in another domain are another override.
        {"domain": "other", "descriptors": [own(2)]},
        {"domain": "any", "descriptors": [own(2)]},
        {"domain": "any", "descriptors": [own(3), own(3)]},
    ]);
    let answers = rls(&sluice.decision, &calls);
    let remaining = |a: &Value| a["statuses"][0]["limit_remaining"].as_u64().unwrap();
    assert_eq!((remaining(&answers[0]), remaining(&answers[1])), (1, 2));
    for refused in [&answers[2], &answers[3]] {
        assert_eq!(refused["grpc"], "RESOURCE_EXHAUSTED", "{refused}");
        let details = refused["details"].as_str().unwrap();
        assert!(
            details.contains("at most 2 (decision.max_overrides)"),
            "{details}"
        );
    }
    // Nothing was counted by the refused call; the overrides in use still count.
    assert_eq!(answers[4]["overall_code"], "OK");
    assert_eq!(remaining(&answers[4]), 0);
    assert_eq!(answers[5]["overall_code"], "OK");
    assert_eq!(answers[5]["statuses"][1]["limit_remaining"], 0);

    let (_, metrics) = blocking_request(sluice.admin, "GET", "/metrics").unwrap();
    let line = r#"sluice_decisions_total{outcome="too_large",via="rls"} 2"#;
    assert!(metrics.contains(line), "{metrics}");
}
