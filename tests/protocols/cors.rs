//! Browsers calling sluice from another origin: preflights answered before any
//! limit (never charged, never refused by one), the CORS headers on every answer
//! for an allowed origin (sluice's own refusals included, so browser code can read
//! `Retry-After`), the upstream's own `Access-Control-*` replaced or removed, and a
//! real headless Chromium reading a 429's `Retry-After` across origins.

use std::net::SocketAddr;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{ACME_SHA256, Req, Toml, live, route, upstream, within};

const APP: &str = "https://app.example.com";

fn gateway_toml(up: &str, cors: &str) -> String {
    Toml::new()
        .upstream("api", &[up.to_string()])
        .policy(
            "p",
            &[
                ("anonymous", "{ per_minute = 1 }"),
                ("registered", "{ per_minute = 2 }"),
            ],
        )
        .consumer("acme", ACME_SHA256)
        .route(
            route("api", "/api")
                .upstream("api")
                .policy("p")
                .methods(&["GET", "POST"])
                .with(&format!("cors = {cors}")),
        )
        .build()
}

fn preflight(origin: &str, method: &str, headers: &str) -> Req {
    let mut req = Req::new(http::Method::OPTIONS, "/api/orders")
        .header("origin", origin)
        .header("access-control-request-method", method);
    if !headers.is_empty() {
        req = req.header("access-control-request-headers", headers);
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_by_sluice_and_never_charged() {
    let up = upstream().await;
    let cors = format!(
        "{{ origins = [\"{APP}\"], credentials = true, max_age = \"10m\", headers = [\"x-api-key\", \"content-type\"] }}"
    );
    let gw = live(&gateway_toml(&up.url(), &cors)).await;
    // Far more preflights than the anonymous budget: each is answered, none counts.
    for _ in 0..5 {
        let resp = preflight(APP, "POST", "X-API-Key, content-type")
            .send(gw.addr)
            .await;
        assert_eq!(resp.status, 204, "{}", resp.text());
        assert_eq!(resp.header("access-control-allow-origin"), Some(APP));
        assert_eq!(
            resp.header("access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(
            resp.header("access-control-allow-methods"),
            Some("GET, POST")
        );
        assert_eq!(
            resp.header("access-control-allow-headers"),
            Some("X-API-Key, content-type")
        );
        assert_eq!(resp.header("access-control-max-age"), Some("600"));
        assert_eq!(resp.header("vary"), Some("Origin"));
        assert!(resp.header("ratelimit").is_none());
    }
    assert_eq!(up.count(), 0, "preflights never reach the upstream");
    // The anonymous caller's one request a minute is still there, then a 429 that a
    // browser may read.
    let first = Req::get("/api/orders")
        .header("origin", APP)
        .send(gw.addr)
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("access-control-allow-origin"), Some(APP));
    let limited = Req::get("/api/orders")
        .header("origin", APP)
        .send(gw.addr)
        .await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("access-control-allow-origin"), Some(APP));
    assert_eq!(
        limited.header("access-control-allow-credentials"),
        Some("true")
    );
    assert_eq!(
        limited.header("access-control-expose-headers"),
        Some("RateLimit, RateLimit-Policy, Retry-After, X-Request-Id")
    );
    assert!(limited.header("retry-after").is_some());
    // sluice's 401 too.
    let unknown = Req::get("/api/orders")
        .header("origin", APP)
        .header("x-api-key", "nobody")
        .send(gw.addr)
        .await;
    assert_eq!(unknown.status, 401);
    assert_eq!(unknown.header("access-control-allow-origin"), Some(APP));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_for_another_origin_method_or_header_is_403_without_cors_headers() {
    let up = upstream().await;
    let cors = format!("{{ origins = [\"{APP}\"], headers = [\"x-api-key\"] }}");
    let gw = live(&gateway_toml(&up.url(), &cors)).await;
    let refused = [
        preflight("https://evil.example.com", "GET", ""),
        preflight(&format!("{APP}/"), "GET", ""),
        preflight(APP, "DELETE", ""),
        preflight(APP, "GET", "x-api-key, x-other"),
    ];
    for req in refused {
        let resp = req.send(gw.addr).await;
        assert_eq!(resp.status, 403, "{}", resp.text());
        assert_eq!(
            resp.header("content-type"),
            Some("application/problem+json")
        );
        let cors_headers = resp
            .headers
            .keys()
            .filter(|name| name.as_str().starts_with("access-control-"))
            .count();
        assert_eq!(cors_headers, 0, "{:?}", resp.headers);
    }
    assert_eq!(up.count(), 0);
    gw.stop().await;
}

/// An upstream whose every answer carries its own CORS headers.
async fn permissive_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0; 1];
                loop {
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    head.clear();
                    let answer = "HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: *\r\n\
                                  Access-Control-Allow-Credentials: true\r\n\
                                  Access-Control-Expose-Headers: x-secret\r\n\
                                  Content-Length: 2\r\n\r\nok";
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_cors_headers_are_replaced_for_an_allowed_origin_and_removed_otherwise() {
    let addr = permissive_upstream().await;
    let cors = format!("{{ origins = [\"{APP}\"], expose = [\"x-trace\"] }}");
    let gw = live(&gateway_toml(&format!("http://{addr}"), &cors)).await;
    let key = ("x-api-key", "demo-key-acme");
    let allowed = Req::get("/api/x")
        .header("origin", APP)
        .header(key.0, key.1)
        .send(gw.addr)
        .await;
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(APP));
    assert_eq!(allowed.header("access-control-allow-credentials"), None);
    assert_eq!(
        allowed.header("access-control-expose-headers"),
        Some("RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, x-trace")
    );
    let other = Req::get("/api/x")
        .header("origin", "https://evil.example.com")
        .header(key.0, key.1)
        .send(gw.addr)
        .await;
    assert_eq!(
        other.status, 200,
        "a request is served; only its CORS headers go"
    );
    let leaked: Vec<_> = (other.headers.keys())
        .filter(|name| name.as_str().starts_with("access-control-"))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_passed_upstream_are_bounded_per_client_ip() {
    let up = upstream().await;
    let cors =
        format!("{{ origins = [\"{APP}\"], preflight = \"upstream\", preflight_limit = 2 }}");
    let gw = live(&gateway_toml(&up.url(), &cors)).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let resp = preflight(APP, "GET", "").send(gw.addr).await;
        if resp.status == 200 {
            assert_eq!(resp.header("access-control-allow-origin"), Some(APP));
        }
        statuses.push(resp.status.as_u16());
    }
    // Three within a second (or two, then one in the next: never more than two a
    // second reach the upstream).
    assert!(
        statuses == [200, 200, 429] || up.count() == 3,
        "{statuses:?}"
    );
    assert!(up.count() <= 3);
    assert_eq!(up.last().method, http::Method::OPTIONS);
    // The anonymous budget is untouched.
    let resp = Req::get("/api/orders")
        .header("origin", APP)
        .send(gw.addr)
        .await;
    assert_eq!(resp.status, 200);
    gw.stop().await;
}

#[test]
fn a_wildcard_origin_with_credentials_is_a_config_error() {
    let toml = gateway_toml(
        "http://127.0.0.1:9",
        "{ origins = [\"*\"], credentials = true }",
    );
    let err = sluice::config::Config::parse(Path::new("gateway.toml"), &toml).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("routes[0].cors.credentials") || text.contains("cors.credentials"),
        "{text}"
    );
    let toml = gateway_toml(
        "http://127.0.0.1:9",
        "{ origins = [\"https://a.example/\"] }",
    );
    let err = sluice::config::Config::parse(Path::new("gateway.toml"), &toml).unwrap_err();
    assert!(err.to_string().contains("not an origin"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_chromium_reads_retry_after_from_sluice_on_another_origin() {
    let up = upstream().await;
    // The page's origin is known once its server listens: the gateway allows it.
    let pages = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_addr = pages.local_addr().unwrap();
    let origin = format!("http://{page_addr}");
    let cors = format!("{{ origins = [\"{origin}\"], headers = [\"x-api-key\"] }}");
    let gw = live(&gateway_toml(&up.url(), &cors)).await;
    let api = format!("http://{}/api/orders", gw.addr);
    let page = format!(
        r#"<!doctype html><html><body><script>
(async () => {{
  const seen = [];
  for (let i = 0; i < 3; i++) {{
    try {{
      const r = await fetch("{api}", {{ headers: {{ "x-api-key": "demo-key-acme" }} }});
      seen.push(r.status + "/" + r.headers.get("Retry-After") + "/" + (r.headers.get("X-Request-Id") ? "id" : "-"));
    }} catch (e) {{ seen.push("error:" + e); }}
  }}
  document.body.setAttribute("data-seen", seen.join(","));
}})();
</script></body></html>"#
    );
    serve_page(pages, page);
    let dom = within("chromium", async {
        tokio::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--virtual-time-budget=10000",
                "--dump-dom",
            ])
            .arg(format!("http://{page_addr}/"))
            .kill_on_drop(true)
            .output()
            .await
            .expect("chromium runs (scripts/test installs it)")
    })
    .await;
    let dom = String::from_utf8_lossy(&dom.stdout).to_string();
    let seen = dom
        .split("data-seen=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the page recorded nothing: {dom}"));
    let parts: Vec<&str> = seen.split(',').collect();
    assert_eq!(parts.len(), 3, "{seen}");
    assert!(parts[0].starts_with("200/null/id"), "{seen}");
    assert!(parts[1].starts_with("200/null/id"), "{seen}");
    let retry: u64 = parts[2]
        .strip_prefix("429/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("the page could not read the 429's Retry-After: {seen}"));
    assert!((1..=60).contains(&retry), "{seen}");
    assert_eq!(up.count(), 2, "preflights never reach the upstream");
    gw.stop().await;
}

/// Serves `page` as HTML to every request on `listener`.
fn serve_page(listener: TcpListener, page: String) {
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 8192];
                let _ = stream.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
}
