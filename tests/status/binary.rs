//! The real `sluice` binary, started on free loopback ports with a config file of
//! its own, and stopped when dropped.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{Req, Resp, free_port};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The admin token every test's binary is given.
pub(crate) const TOKEN: &str = "status-test-token";

/// A running `sluice run`.
pub(crate) struct Sluice {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Holds the config file; removed when the binary is dropped.
    _dir: tempfile::TempDir,
    pub config: PathBuf,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl Sluice {
    /// Starts the binary with `body` after its `[server]` and `[admin]` sections
    /// (loopback ports, the admin token), and waits until both listeners answer.
    pub(crate) async fn start(body: &str) -> Sluice {
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gateway.toml");
        std::fs::write(&config, config_text(port, admin_port, body)).unwrap();
        let mut child = Command::new(SLUICE)
            .args(["run", "-c", config.to_str().unwrap()])
            .current_dir(dir.path())
            .env_remove("SLUICE_CONFIG")
            .env_remove("SLUICE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice run starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&chunk[..n]).into_owned();
                sink.lock().unwrap().push_str(&text);
            }
        });
        let sluice = Sluice {
            child,
            stderr,
            _dir: dir,
            config,
            addr: ([127, 0, 0, 1], port).into(),
            admin: ([127, 0, 0, 1], admin_port).into(),
        };
        sluice.wait_serving(sluice.admin, "/healthz").await;
        sluice.wait_serving(sluice.addr, "/").await;
        sluice
    }

    /// Rewrites the config file with `body` (same ports and token).
    pub(crate) fn rewrite(&self, body: &str) {
        let text = config_text(self.addr.port(), self.admin.port(), body);
        std::fs::write(&self.config, text).unwrap();
    }

    async fn wait_serving(&self, addr: SocketAddr, path: &str) {
        let started = Instant::now();
        while Req::get(path).try_send(addr).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "sluice never served on {addr}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// `GET /admin/status` with the token, as JSON.
    pub(crate) async fn status(&self) -> serde_json::Value {
        let resp = self.admin_get("/admin/status").await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.json()
    }

    /// `GET path` on the admin listener with the token.
    pub(crate) async fn admin_get(&self, path: &str) -> Resp {
        Req::get(path)
            .header("authorization", &format!("Bearer {TOKEN}"))
            .send(self.admin)
            .await
    }

    /// Reads the status until `check` holds, for at most `limit`; returns the
    /// status that satisfied it.
    pub(crate) async fn status_until(
        &self,
        limit: Duration,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.status().await;
            if check(&status) {
                return status;
            }
            assert!(
                started.elapsed() < limit,
                "{what}: never seen in {status:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config_text(port: u16, admin_port: u16, body: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken = \"{TOKEN}\"\n\n{body}\n"
    )
}
