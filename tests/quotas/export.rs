//! The usage export (`GET /admin/usage?policy=P&format=jsonl|csv`): every tracked
//! caller of a policy once across its pages while traffic runs, in memory and in
//! Redis (one server and a Cluster), `min_ratio`, both formats, keyed buckets named
//! by their key parts, and bad parameters.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http_body_util::BodyExt;

use crate::support::redis_server::RedisServer;
use crate::support::redis_server::cluster::RedisCluster;
use crate::support::{self, Live, Req, live};

/// A policy of per-minute and per-hour limits (and `extra` quotas) on a direct
/// route, with room for every caller the tests make.
fn config(store: &str, extra: &str) -> String {
    format!(
        r#"
[store]
max_keys = 300000
{store}

[policies.api]
anonymous = {{ per_hour = 10, per_day = 100{extra} }}
registered = {{ per_minute = 10 }}

[policies.other]
anonymous = {{ per_minute = 10 }}

[[consumers]]
name = "acme"
key = "demo-key-acme"

[[routes]]
name = "api"
path_prefix = "/api"
respond = {{ status = 200, body = "ok\n" }}
policy = "api"
"#
    )
}

/// The address of the `n`-th caller the tests fill the store with.
fn address(n: u32) -> String {
    format!("10.{}.{}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
}

/// Charges each caller of `callers` (address number, cost) through `/v1/check` on
/// `connections` keep-alive connections; panics on any answer but 200.
async fn fill(admin: SocketAddr, callers: Vec<(u32, u32)>, connections: usize) {
    let callers = Arc::new(callers);
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let (callers, next) = (callers.clone(), next.clone());
            tokio::spawn(async move {
                let mut sender = keep_alive(admin).await;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(n, cost)) = callers.get(i) else {
                        return;
                    };
                    let (status, body) = check(&mut sender, &address(n), cost).await;
                    assert_eq!(status, 200, "{body}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

type Sender = hyper::client::conn::http1::SendRequest<String>;

async fn keep_alive(addr: SocketAddr) -> Sender {
    let stream = support::connect(addr, Some("127.0.0.1".parse().unwrap())).await;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// Charges `cost` to `ip:ADDRESS` under policy api; the answer's status and body.
async fn check(sender: &mut Sender, address: &str, cost: u32) -> (u16, String) {
    let body =
        serde_json::json!({"policy": "api", "caller": format!("ip:{address}"), "cost": cost});
    let request = http::Request::post("/v1/check")
        .header("host", "127.0.0.1")
        .body(body.to_string())
        .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Traffic until `stop`: proxied requests from new addresses and decision-API
/// charges of filled callers. Returns how many answers came back.
fn traffic(gw: &Live, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    let (addr, admin) = (gw.addr, gw.admin);
    tokio::spawn(async move {
        let mut sender = keep_alive(admin).await;
        let mut answered = 0;
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let ip = format!("127.0.{}.{}", 5 + (n >> 8) % 8, n & 0xff);
            let proxied = Req::get("/api").from(&ip).send(addr).await;
            assert!(
                [200, 429].contains(&proxied.status.as_u16()),
                "{}",
                proxied.status
            );
            // Filled callers, spread, but never one charged near its limit.
            let filled = n.wrapping_mul(7919) % 100_000;
            let (status, _) = check(&mut sender, &address(filled | 1), 1).await;
            assert_eq!(status, 200);
            answered += 2;
        }
        answered
    })
}

/// Every page of the export of `query`, followed by its cursors: the pages' bodies.
async fn pages(gw: &Live, query: &str) -> Vec<String> {
    let mut url = format!("/admin/usage?{query}");
    let mut bodies = Vec::new();
    loop {
        let resp = gw.admin(Req::get(&url)).await;
        assert_eq!(resp.status, 200, "{url}: {}", resp.text());
        bodies.push(resp.text());
        let Some(next) = resp.header("x-next-cursor") else {
            assert_eq!(resp.header("link"), None);
            return bodies;
        };
        let link = resp.header("link").unwrap().to_string();
        assert!(link.ends_with(">; rel=\"next\""), "{link}");
        assert!(link.contains(&format!("cursor={next}")), "{link}");
        url = link
            .trim_start_matches('<')
            .trim_end_matches(">; rel=\"next\"")
            .to_string();
        assert!(bodies.len() < 1_000, "the cursors do not end");
    }
}

/// The JSON lines of `bodies`, by caller; panics on a caller listed twice.
fn by_caller(bodies: &[String]) -> HashMap<String, serde_json::Value> {
    let mut callers = HashMap::new();
    for line in bodies.iter().flat_map(|body| body.lines()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(row.get("error").is_none(), "{row}");
        let caller = row["caller"].as_str().unwrap().to_string();
        assert!(
            callers.insert(caller.clone(), row).is_none(),
            "{caller} twice"
        );
    }
    callers
}

/// Fills `callers` callers (every 1000th charged 8 of its 10 an hour), exports the
/// policy in pages of `limit` while traffic runs, and checks every filled caller is
/// listed exactly once with what it was charged.
async fn exports_every_caller_once(gw: &Live, callers: u32, limit: usize) {
    let filled = (0..callers).map(|n| (n, if n % 1000 == 0 { 8 } else { 1 }));
    fill(gw.admin, filled.collect(), 4).await;
    let stop = Arc::new(AtomicBool::new(false));
    let running = traffic(gw, stop.clone());
    let bodies = pages(gw, &format!("policy=api&format=jsonl&limit={limit}")).await;
    stop.store(true, Ordering::Relaxed);
    assert!(
        running.await.unwrap() > 0,
        "no traffic ran during the export"
    );
    assert!(bodies.len() > 1, "one page only");
    let rows = by_caller(&bodies);
    for n in 0..callers {
        let caller = format!("ip:{}", address(n));
        let row = rows
            .get(&caller)
            .unwrap_or_else(|| panic!("{caller} missing"));
        assert_eq!(row["plan"], "anonymous", "{row}");
        let hour = &row["limits"][0];
        assert_eq!(
            (&hour["window"], &hour["limit"]),
            (&"hour".into(), &10.into())
        );
        let used = hour["used"].as_u64().unwrap();
        match n % 1000 {
            0 => assert_eq!(used, 8, "{row}"),
            _ => assert!(used >= 1, "{row}"),
        }
        let at: jiff::Timestamp = hour["resets_at"].as_str().unwrap().parse().unwrap();
        assert!(hour["reset_after"].as_i64().unwrap() <= 3600, "{row}");
        assert!(at.as_second() > 1_000_000_000, "{row}");
    }
    // The traffic's own callers may be listed too, and nobody else.
    let ours = |c: &String| c.starts_with("ip:10.") || c.starts_with("ip:127.0.");
    assert!(
        rows.keys().all(ours),
        "{:?}",
        rows.keys().find(|c| !ours(c))
    );
}

/// Callers at or over 80 % of a limit alone, in CSV: every 1000th filled caller
/// (8 of 10 an hour), each window a row.
async fn min_ratio_lists_the_callers_near_a_limit(gw: &Live, callers: u32) {
    let bodies = pages(gw, "policy=api&format=csv&min_ratio=0.8").await;
    let mut listed = Vec::new();
    for body in &bodies {
        let mut lines = body.lines();
        assert_eq!(
            lines.next(),
            Some("caller,plan,window,used,limit,resets_at,reset_after")
        );
        for line in lines {
            let fields: Vec<&str> = line.split(',').collect();
            assert_eq!(fields.len(), 7, "{line}");
            assert_eq!(fields[1], "anonymous");
            fields[5].parse::<jiff::Timestamp>().unwrap();
            if fields[2] == "hour" {
                assert_eq!(fields[3], "8", "{line}");
                listed.push(fields[0].to_string());
            }
        }
    }
    listed.sort();
    let mut near: Vec<String> = (0..callers)
        .filter(|n| n % 1000 == 0)
        .map(|n| format!("ip:{}", address(n)))
        .collect();
    near.sort();
    assert_eq!(listed, near);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_exports_100_000_callers_each_once_while_traffic_runs() {
    let gw = live(&config("", ", per_month = 1000")).await;
    exports_every_caller_once(&gw, 100_000, 15_000).await;
    min_ratio_lists_the_callers_near_a_limit(&gw, 100_000).await;
    // A consumer is named as the config names it; the month shows its reset.
    let acme = Req::get("/api").header("x-api-key", "demo-key-acme");
    assert_eq!(acme.send(gw.addr).await.status, 200);
    let rows = by_caller(&pages(&gw, "policy=api&format=jsonl&min_ratio=0").await);
    assert_eq!(rows["consumer:acme"]["plan"], "registered");
    let month = &rows["ip:10.0.0.1"]["limits"][2];
    assert_eq!(month["window"], "month", "{month}");
    assert_eq!(month["used"], 1, "{month}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_exports_100_000_callers_each_once_while_traffic_runs() {
    let server = RedisServer::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        server.url()
    );
    let gw = live(&config(&store, "")).await;
    exports_every_caller_once(&gw, 100_000, 15_000).await;
    min_ratio_lists_the_callers_near_a_limit(&gw, 100_000).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_exports_from_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let store = format!(
        "backend = \"redis\"\n{}\ntimeout = \"2s\"",
        cluster.seeds_toml()
    );
    let gw = live(&config(&store, "")).await;
    exports_every_caller_once(&gw, 5_000, 1_500).await;
    gw.stop().await;
}

#[tokio::test]
async fn bad_export_parameters_are_400_problems() {
    let gw = live(&config("", "")).await;
    for (query, says) in [
        ("policy=nope&format=jsonl", "unknown policy"),
        ("policy=api&format=xml", "format must be"),
        ("policy=api", "format is required"),
        ("policy=api&format=csv&cursor=zzz", "not a cursor"),
        ("policy=api&format=csv&min_ratio=-1", "min_ratio"),
        ("policy=api&format=csv&min_ratio=high", "min_ratio"),
        ("policy=api&format=csv&limit=0", "limit must be"),
        (
            "policy=api&format=csv&caller=ip:1.2.3.4",
            "unknown parameter",
        ),
    ] {
        let resp = gw.admin(Req::get(&format!("/admin/usage?{query}"))).await;
        let problem = resp.problem(400);
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{query}: {detail}");
    }
    // Nothing tracked: an empty last page, and a CSV page is its header alone.
    let resp = gw
        .admin(Req::get("/admin/usage?policy=other&format=csv"))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/csv; charset=utf-8"));
    assert_eq!(
        resp.text(),
        "caller,plan,window,used,limit,resets_at,reset_after\n"
    );
    assert_eq!(resp.header("x-next-cursor"), None);
    gw.stop().await;
}

/// An organisation budget keyed by two headers, on a route of its own.
fn keyed_config(store: &str) -> String {
    format!(
        r#"
[store]
{store}

[policies.org]
key = ["header:x-org", "header:x-team"]
on_missing = "deny"
anonymous = {{ per_hour = 100 }}

[[routes]]
name = "org"
path_prefix = "/org"
respond = {{ status = 200, body = "ok\n" }}
policy = "org"
"#
    )
}

/// Three organisations' teams (one with a comma and a quote in its team, which CSV
/// must quote) charged 1, 2 and 3 requests, then exported: each bucket is named by
/// its parts, in JSON lines and in CSV, with what it used.
async fn keyed_buckets_are_exported_by_their_parts(gw: &Live) {
    let orgs = [
        ("acme", "red", 1),
        ("globex", "blue", 2),
        ("initech", "a, \"b\"", 3),
    ];
    for (org, team, n) in orgs {
        for _ in 0..n {
            let req = Req::get("/org").header("x-org", org).header("x-team", team);
            assert_eq!(req.send(gw.addr).await.status, 200);
        }
    }
    let rows = by_caller(&pages(gw, "policy=org&format=jsonl").await);
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (org, team, n) in orgs {
        let caller = format!("header:x-org={org}&header:x-team={team}");
        let row = rows
            .get(&caller)
            .unwrap_or_else(|| panic!("{caller}: {rows:?}"));
        assert_eq!(
            row["key"],
            serde_json::json!({"header:x-org": org, "header:x-team": team}),
            "{row}"
        );
        assert_eq!(row["limits"][0]["used"], n, "{row}");
    }
    let csv = pages(gw, "policy=org&format=csv").await.concat();
    let mut lines: Vec<&str> = csv.lines().skip(1).collect();
    lines.sort();
    let fields: Vec<String> = lines
        .iter()
        .map(|line| line.rsplitn(6, ',').last().unwrap().to_string())
        .collect();
    assert_eq!(
        fields,
        [
            "\"header:x-org=initech&header:x-team=a, \"\"b\"\"\",anonymous",
            "header:x-org=acme&header:x-team=red,anonymous",
            "header:x-org=globex&header:x-team=blue,anonymous",
        ],
        "{csv}"
    );
    assert!(lines[0].contains(",hour,3,100,"), "{csv}");
    assert!(lines[1].contains(",hour,1,100,"), "{csv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_exports_keyed_buckets_by_their_parts() {
    let gw = live(&keyed_config("")).await;
    keyed_buckets_are_exported_by_their_parts(&gw).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_exports_keyed_buckets_by_their_parts() {
    let server = RedisServer::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        server.url()
    );
    let gw = live(&keyed_config(&store)).await;
    keyed_buckets_are_exported_by_their_parts(&gw).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_exports_keyed_buckets_by_their_parts() {
    let cluster = RedisCluster::start(3, 0);
    let store = format!(
        "backend = \"redis\"\n{}\ntimeout = \"2s\"",
        cluster.seeds_toml()
    );
    let gw = live(&keyed_config(&store)).await;
    keyed_buckets_are_exported_by_their_parts(&gw).await;
    gw.stop().await;
}
