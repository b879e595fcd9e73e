//! The tokenless admin API on loopback, against what a web page in the operator's
//! browser can make it send: cross-site changes (a form or `fetch` with a foreign
//! `Origin`) and a page that rebinds its own name to 127.0.0.1 (a foreign `Host`).

use crate::support;

use serde_json::json;
use support::{Req, Toml, live, route};

fn config() -> String {
    Toml::new()
        .policy("standard", &[("anonymous", "{ per_minute = 5 }")])
        .route(route("api", "/api").respond(200, "ok\n").policy("standard"))
        .build()
}

fn ban(caller: &str) -> Req {
    Req::post(
        "/admin/bans",
        json!({"caller": caller, "duration": "5m"}).to_string(),
    )
    .header("content-type", "text/plain")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sites_page_can_neither_change_nor_read_the_open_admin_api() {
    let live = live(&config()).await;
    let own = format!("http://{}", live.admin);

    // A cross-site form post (text/plain needs no preflight) and a `fetch` from a
    // page with an opaque origin: refused, and nothing is banned.
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let refused = live
            .admin(ban("ip:10.0.0.1").header("origin", origin))
            .await;
        refused.problem(403);
    }
    let bans = live.admin(Req::get("/admin/bans")).await;
    assert_eq!(bans.status, 200);
    assert!(
        !bans.text().contains("10.0.0.1"),
        "a cross-site post banned: {}",
        bans.text()
    );

    // A page that rebound its name to 127.0.0.1 sends that name as Host: it can
    // read nothing and change nothing, even "from its own origin".
    let rebound = "evil.example:9090";
    for req in [
        Req::get("/admin/usage?caller=ip:127.0.0.1"),
        Req::get("/admin/status"),
        Req::get("/"),
        ban("ip:10.0.0.2").header("origin", &format!("http://{rebound}")),
    ] {
        live.admin(req.header("host", rebound)).await.problem(403);
    }
    // A Host that is not text (an obs-text byte) names no loopback either.
    let odd = support::raw(
        live.admin,
        b"GET /admin/status HTTP/1.1\r\nHost: 127.0.0.1\xe9\r\nConnection: close\r\n\r\n",
    )
    .await;
    odd.problem(403);
    // What probes and scrapers use stays open to any Host.
    for path in ["/metrics", "/healthz", "/readyz"] {
        let answer = live.admin(Req::get(path).header("host", rebound)).await;
        assert_eq!(answer.status, 200, "{path}");
    }

    // curl and scripts send no Origin; the page served by the admin listener sends
    // its own; loopback names in any spelling are the machine's own.
    let made = live.admin(ban("ip:10.0.0.3")).await;
    assert_eq!(made.status, 201, "{}", made.text());
    let made = live.admin(ban("ip:10.0.0.4").header("origin", &own)).await;
    assert_eq!(made.status, 201, "{}", made.text());
    let port = live.admin.port();
    for host in [
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_string(),
    ] {
        let read = live
            .admin(Req::get("/admin/usage?caller=ip:127.0.0.1").header("host", &host))
            .await;
        assert_eq!(read.status, 200, "Host {host}: {}", read.text());
    }
    let bans = live.admin(Req::get("/admin/bans")).await.text();
    assert!(
        bans.contains("10.0.0.3") && bans.contains("10.0.0.4"),
        "{bans}"
    );
}
