//! Property-based fuzzing of what attackers and operators feed sluice: raw request
//! heads through a running gateway (framing, header spellings, paths, identity
//! headers) and mutated config files through the compiler. Nothing may panic, the
//! gateway must answer every request with a well-formed status and keep serving,
//! and every config error must name the file and line. The path normaliser has its
//! own properties in `src/path.rs`. Failing cases are kept in `proptest-regressions/`
//! and replayed first on every run.

use crate::support;

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use support::{Toml, connect, gateway, route, upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Pieces a request head is assembled from, chosen to meet every parser decision.
fn method() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "GET", "POST", "post", "Get", "PURGE", "CONNECT", "OPTIONS", "G\tET", "", "GET GET",
    ])
    .prop_map(str::to_string)
}

fn target() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "/",
        "/orders",
        "//",
        "/..",
        "/.",
        "%2e",
        "%2F",
        "%c0%ae",
        "%3B",
        ";",
        "?",
        "#",
        "%",
        "%zz",
        "a",
        "\\",
        "%00",
        " ",
        "é",
        "*",
        "http://a/x",
        "%ff",
        "%C3%A9",
    ]);
    prop::collection::vec(pieces, 0..8).prop_map(|p| p.concat())
}

fn header() -> impl Strategy<Value = String> {
    let names = prop::sample::select(vec![
        "Host",
        "host",
        "HOST",
        "Content-Length",
        "Transfer-Encoding",
        "X-API-Key",
        "x_api_key",
        "Authorization",
        "X-Forwarded-For",
        "Forwarded",
        "Connection",
        "Expect",
        "Upgrade",
        "TE",
        "X Bad",
        "",
        ":authority",
    ]);
    let values = prop::sample::select(vec![
        "a",
        "a.example",
        "tight.example%2e",
        "chunked",
        "chunked, chunked",
        "gzip, chunked",
        "0",
        "5",
        "-1",
        "99999999999999999999",
        "Bearer ",
        "Bearer demo-key-acme",
        "BEARER x",
        "1.2.3.4",
        "1.2.3.4, 5.6.7.8",
        "for=1.2.3.4",
        "[::1]:80",
        "close",
        "host",
        "100-continue",
        "websocket",
        "",
        " ",
        "\t",
    ]);
    (names, values).prop_map(|(n, v)| format!("{n}: {v}\r\n"))
}

fn request() -> impl Strategy<Value = Vec<u8>> {
    (
        method(),
        target(),
        prop::sample::select(vec![
            "HTTP/1.1",
            "HTTP/1.0",
            "HTTP/2.0",
            "HTTP/1.1 ",
            "http/1.1",
        ]),
        prop::collection::vec(header(), 0..6),
        prop::sample::select(vec![
            "",
            "0\r\n\r\n",
            "abc",
            "zz\r\nabc\r\n0\r\n\r\n",
            "5\r\nab",
        ]),
    )
        .prop_map(|(m, t, v, h, body)| {
            format!(
                "{m} {t} {v}\r\n{}Connection: close\r\n\r\n{body}",
                h.concat()
            )
            .into_bytes()
        })
}

#[test]
fn raw_request_heads_never_break_the_gateway() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let up = upstream().await;
        let gw = gateway(
            &Toml::new()
                .upstream("up", &[up.url()])
                .policy("p", &[("anonymous", "{ per_second = 1_000_000_000 }")])
                .route(
                    route("orders", "/orders")
                        .methods(&["POST"])
                        .upstream("up")
                        .policy("p"),
                )
                .route(route("all", "/").upstream("up"))
                .build(),
        )
        .await;
        let addr = gw.addr;
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 300,
            failure_persistence: Some(Box::new(
                proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
            )),
            ..ProptestConfig::default()
        });
        let handle = tokio::runtime::Handle::current();
        let result = tokio::task::spawn_blocking(move || {
            runner.run(&request(), |bytes| {
                let answer = handle.block_on(async {
                    let mut stream = connect(addr, None).await;
                    let _ = stream.write_all(&bytes).await;
                    let mut answer = Vec::new();
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        stream.read_to_end(&mut answer),
                    )
                    .await;
                    answer
                });
                let text = String::from_utf8_lossy(&answer);
                // An answer (or a closed connection, for what hyper cannot parse
                // at all), never a hang; a status line that is HTTP/1.x.
                if !text.is_empty() {
                    prop_assert!(text.starts_with("HTTP/1."), "{text}");
                    let status: u16 = text[9..12].parse().unwrap_or(0);
                    prop_assert!((100..600).contains(&status), "{text}");
                    // Nothing sluice refuses is a 5xx of its own making.
                    prop_assert!(status != 500, "{text}");
                }
                Ok(())
            })
        })
        .await
        .unwrap();
        if let Err(err) = result {
            panic!("{err}");
        }
        // Still serving.
        let resp = support::Req::get("/still").send(addr).await;
        assert_eq!(resp.status, 200);
        gw.stop().await;
    });
}

const VALID: &str = r#"
[server]
listen = "127.0.0.1:8080"
max_body_bytes = 1000

[identity]
trusted_proxies = ["10.0.0.0/8"]

[ban]
after = 5

[upstreams.shop]
targets = ["http://127.0.0.1:3000", "https://shop.example"]

[policies.standard]
anonymous = { per_minute = 10, per_day = 1_000 }
registered = { per_minute = 100 }
concurrency = { max = 10, queue = 5, queue_timeout = "1s" }

[[consumers]]
name = "acme"
key_sha256 = "8649cdebee753898fd50e01408a9e438aa5090249bc3e51b65f33dce973b0873"

[[routes]]
name = "orders"
path_prefix = "/orders"
methods = ["POST"]
upstream = "shop"
policy = "standard"
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// A config with bytes inserted, removed or replaced anywhere: compiled or
    /// refused, never a panic; every error names the file and a line.
    #[test]
    fn mutated_configs_compile_or_are_refused_with_a_line(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(vec![
            "\"", "=", "[", "]", "{", "}", ",", "\n", "0", "-1", "99999999999999999999", "1.5",
            "\"1h\"", "\"0s\"", "true", "#", "é", "\\", "per_second", "max", "'", "\u{0}",
        ])), 1..4),
    ) {
        let mut text = VALID.to_string();
        for (at, op, piece) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match op {
                0 => text.insert_str(i, piece),
                1 => {
                    let mut end = (i + piece.len()).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(i..end, "");
                }
                _ => {
                    let mut end = (i + 1).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(i..end, piece);
                }
            }
        }
        if let Err(err) = sluice::config::Config::parse(Path::new("gateway.toml"), &text) {
            let err = err.to_string();
            prop_assert!(!err.is_empty());
            for line in err.lines().filter(|l| l.starts_with("error:")) {
                prop_assert!(line.starts_with("error: gateway.toml"), "{}", line);
            }
        }
    }
}
