//! `/admin/usage` of a consumer that does not exist is a 404, not an empty 200 an
//! operator would read as "used nothing": a typo in a name must show. A caller the
//! config does not list but that was counted (a name from a token or an auth layer)
//! still has its usage.

use crate::support;

use support::{ACME_SHA256, Req, live};

const CONFIG: &str = r#"
[identity]
consumer_header = "x-consumer-id"
trusted_proxies = ["127.0.0.0/8"]

[policies.standard]
anonymous = { per_minute = 10 }
registered = { per_minute = 100 }

[[consumers]]
name = "acme"
key_sha256 = "@ACME@"

[[routes]]
name = "api"
path_prefix = "/api"
respond = { status = 200, body = "ok" }
policy = "standard"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_of_a_consumer_that_does_not_exist_is_a_404() {
    let live = live(&CONFIG.replace("@ACME@", ACME_SHA256)).await;
    for method in [http::Method::GET, http::Method::DELETE] {
        let resp = (live.admin(Req::new(method, "/admin/usage?caller=consumer:acmee"))).await;
        let problem = resp.problem(404);
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("no consumer \"acmee\""), "{detail}");
    }
    // A listed consumer, even one that sent nothing: 200 with nothing used.
    let known = live
        .admin(Req::get("/admin/usage?caller=consumer:acme"))
        .await;
    assert_eq!(known.status, 200, "{}", known.text());
    // A name an auth layer gave, counted: its usage is there.
    let named = Req::get("/api/x")
        .header("x-consumer-id", "tenant-7")
        .send(live.addr)
        .await;
    assert_eq!(named.status, 200, "{}", named.text());
    let usage = live
        .admin(Req::get("/admin/usage?caller=consumer:tenant-7"))
        .await;
    assert_eq!(usage.status, 200, "{}", usage.text());
    assert!(usage.text().contains("\"used\":1"), "{}", usage.text());
    // An IP is always a caller.
    let ip = live
        .admin(Req::get("/admin/usage?caller=ip:192.0.2.1"))
        .await;
    assert_eq!(ip.status, 200);
    live.stop().await;
}
