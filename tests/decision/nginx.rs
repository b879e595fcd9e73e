//! A real nginx (the Debian package, with `auth_request`) in front of a recording
//! upstream, configured with the snippet the docs ship (`examples/proxies/
//! nginx.conf`): its clients get sluice's limits, the real 429 and its headers.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::support::{self, ACME_SHA256, Req};
use super::{decision_addr, wait_listening};

/// A proxy process the test started; killed when dropped.
pub(super) struct Proxy(pub Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The gateway config both proxies' tests decide with.
pub(super) fn gateway_config() -> String {
    format!(
        r#"
[decision]
listen = "127.0.0.1:0"

[identity]
trusted_proxies = ["127.0.0.1/32"]

[policies.standard]
anonymous = {{ per_minute = 3 }}
registered = {{ per_minute = 10 }}

[[consumers]]
name = "acme"
plan = "registered"
key_sha256 = "{ACME_SHA256}"

[[routes]]
name = "api"
path_prefix = "/api"
policy = "standard"
"#
    )
}

/// The shipped snippet with its addresses replaced by the test's.
fn site(listen: u16, sluice: &str, app: &str) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/proxies/nginx.conf");
    let text = std::fs::read_to_string(example).unwrap();
    text.replace("listen 8080;", &format!("listen 127.0.0.1:{listen};"))
        .replace("127.0.0.1:8081", sluice)
        .replace("127.0.0.1:3000", app)
}

fn start_nginx(dir: &Path, site: &str) -> Proxy {
    let d = dir.display();
    std::fs::write(dir.join("site.conf"), site).unwrap();
    let main = format!(
        "worker_processes 1;\n\
         error_log {d}/error.log;\n\
         pid {d}/nginx.pid;\n\
         user root;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
           access_log off;\n\
           client_body_temp_path {d}/body;\n\
           proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n\
           scgi_temp_path {d}/scgi;\n\
           include {d}/site.conf;\n\
         }}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).unwrap();
    let nginx = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|n| Command::new(n).arg("-v").output().is_ok())
        .unwrap_or_else(|| panic!("nginx cannot run: install the Debian package `nginx`"));
    let child = Command::new(nginx)
        .args(["-g", "daemon off;", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx starts");
    Proxy(child)
}

#[tokio::test]
async fn nginx_auth_request_gives_clients_sluices_limits_and_the_real_429() {
    let live = support::live(&gateway_config()).await;
    let up = support::upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let sluice = decision_addr(&live).to_string();
    let _nginx = start_nginx(dir.path(), &site(port, &sluice, &up.addr.to_string()));
    let nginx = format!("127.0.0.1:{port}").parse().unwrap();
    wait_listening(nginx, "nginx listening").await;

    for left in [2, 1, 0] {
        let resp = Req::get("/api/items?page=1").send(nginx).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.text(), "up saw /api/items?page=1");
        assert_eq!(resp.sf_param("ratelimit", "minute", "r"), Some(left));
        assert_eq!(resp.sf_param("ratelimit-policy", "minute", "q"), Some(3));
    }
    let refused = Req::get("/api/items").send(nginx).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.json()["status"], 429);
    assert!(refused.retry_after() >= 1);
    assert_eq!(refused.sf_param("ratelimit", "minute", "r"), Some(0));
    assert_eq!(
        refused.header("x-sluice-status"),
        None,
        "nginx keeps it to itself"
    );
    assert_eq!(
        up.count(),
        3,
        "the refused request never reached the upstream"
    );

    // Another client address: its own budget (nginx's $remote_addr, trusted).
    let other = Req::get("/api/items").from("127.0.0.2").send(nginx).await;
    assert_eq!(other.status, 200);
    assert_eq!(other.sf_param("ratelimit", "minute", "r"), Some(2));
    // A consumer's key, passed on with the original headers.
    let acme = Req::get("/api/items")
        .header("x-api-key", "demo-key-acme")
        .send(nginx)
        .await;
    assert_eq!(acme.status, 200);
    assert_eq!(acme.sf_param("ratelimit", "minute", "r"), Some(9));
    let unknown = Req::get("/api/items")
        .header("x-api-key", "wrong")
        .send(nginx)
        .await;
    assert_eq!(unknown.status, 401);
    assert_eq!(up.count(), 5);
    live.stop().await;
}
