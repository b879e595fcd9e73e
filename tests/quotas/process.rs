//! The real `sluice` binary as a child process, with extra environment.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::Req;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A running `sluice run`, killed when dropped.
pub(crate) struct Proc {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `sluice run -c config` in `cwd` with `env` set (stderr collected).
    pub(crate) fn spawn(config: &Path, cwd: &Path, env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(SLUICE)
            .args(["run", "-c", config.to_str().unwrap()])
            .current_dir(cwd)
            .env_remove("SLUICE_CONFIG")
            .env_remove("SLUICE_LOG")
            .envs(env.iter().copied())
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
                let text = String::from_utf8_lossy(&chunk[..n]);
                sink.lock().unwrap().push_str(&text);
            }
        });
        Proc { child, stderr }
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) until `GET path` on `port` gets an answer.
    pub(crate) async fn ready(&mut self, port: u16, path: &str) {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let started = Instant::now();
        while Req::get(path).try_send(addr).await.is_err() {
            if self.child.try_wait().unwrap().is_some() {
                panic!("sluice exited before serving; stderr:\n{}", self.stderr());
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "sluice never served on port {port}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGTERM, then waits (bounded) for a clean exit: the state file is written.
    pub(crate) async fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-s", "TERM", &pid]).status();
        assert!(sent.unwrap().success(), "kill -s TERM failed");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert_eq!(status.code(), Some(0), "{}", self.stderr());
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "sluice did not exit; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
