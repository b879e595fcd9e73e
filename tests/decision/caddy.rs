//! A real Caddy (the Debian package, 2.6, with `forward_auth`) in front of a
//! recording upstream, configured with the shipped `examples/proxies/Caddyfile`:
//! sluice's refusal reaches the client as sluice wrote it.

use std::path::Path;
use std::process::{Command, Stdio};

use super::nginx::{Proxy, gateway_config};
use super::support::{self, Req};
use super::{decision_addr, wait_listening};

fn start_caddy(dir: &Path, caddyfile: &str) -> Proxy {
    let file = dir.join("Caddyfile");
    std::fs::write(&file, caddyfile).unwrap();
    if Command::new("caddy").arg("version").output().is_err() {
        panic!("caddy cannot run: install the Debian package `caddy`");
    }
    let child = Command::new("caddy")
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&file)
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("caddy starts");
    Proxy(child)
}

#[tokio::test]
async fn caddy_forward_auth_passes_sluices_refusal_to_the_client() {
    let live = support::live(&gateway_config()).await;
    let up = support::upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/proxies/Caddyfile");
    let caddyfile = std::fs::read_to_string(example)
        .unwrap()
        .replace(":8080 {", &format!("http://127.0.0.1:{port} {{"))
        .replace("127.0.0.1:8081", &decision_addr(&live).to_string())
        .replace("127.0.0.1:3000", &up.addr.to_string());
    let caddyfile = format!("{{\n\tadmin off\n}}\n{caddyfile}");
    let _caddy = start_caddy(dir.path(), &caddyfile);
    let caddy = format!("127.0.0.1:{port}").parse().unwrap();
    wait_listening(caddy, "caddy listening").await;

    for _ in 0..3 {
        let resp = Req::get("/api/items").send(caddy).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.text(), "up saw /api/items");
    }
    let refused = Req::get("/api/items").send(caddy).await;
    let problem = refused.problem(429);
    assert!(problem["detail"].as_str().unwrap().contains("route api"));
    assert!(refused.retry_after() >= 1);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    assert_eq!(
        up.count(),
        3,
        "the refused request never reached the upstream"
    );
    let other = Req::get("/api/items").from("127.0.0.2").send(caddy).await;
    assert_eq!(other.status, 200);
    assert_eq!(up.count(), 4);
    live.stop().await;
}
