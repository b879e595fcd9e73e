//! A refusal flood through `sluice run`: the access log on stdout holds a line a
//! second per caller, route and outcome, and every refusal is a line or counted in
//! one line's `repeated`, as `sluice_access_log_suppressed_total` says.

use crate::support::free_port;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request on a fresh connection; the status, or 0 when none came.
fn status(port: u16, path: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn start(dir: &Path, port: u16, admin: u16) -> Running {
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
[admin]
listen = "127.0.0.1:{admin}"
[policies.p]
anonymous = {{ per_minute = 1 }}
[[routes]]
name = "api"
path_prefix = "/"
respond = {{ status = 200, body = "ok" }}
policy = "p"
"#
    );
    std::fs::write(dir.join("gateway.toml"), config).unwrap();
    let stdout = std::fs::File::create(dir.join("access.log")).unwrap();
    let child = Command::new(SLUICE)
        .args(["run", "-c", "gateway.toml"])
        .current_dir(dir)
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = Running(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(admin, "/healthz") != 200 {
        assert!(Instant::now() < deadline, "sluice run did not serve");
        std::thread::sleep(Duration::from_millis(50));
    }
    running
}

#[test]
fn a_refusal_flood_through_sluice_run_is_a_few_lines_that_count_every_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let _running = start(dir.path(), port, admin);
    assert_eq!(status(port, "/first"), 200);
    const FLOOD: u64 = 300;
    for _ in 0..FLOOD {
        assert_eq!(status(port, "/flood"), 429);
    }
    // The last refusals are written once the caller has been quiet for a second.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (lines, repeated) = loop {
        let log = std::fs::read_to_string(dir.path().join("access.log")).unwrap();
        let lines: Vec<serde_json::Value> = (log.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let refused = lines.iter().filter(|l| l["status"] == 429);
        let repeated: u64 = refused.clone().filter_map(|l| l["repeated"].as_u64()).sum();
        if refused.count() as u64 + repeated >= FLOOD || Instant::now() > deadline {
            break (lines, repeated);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let refused = lines.iter().filter(|l| l["status"] == 429).count() as u64;
    assert_eq!(refused + repeated, FLOOD, "{lines:#?}");
    assert!(refused < 30 && repeated > 0, "{lines:#?}");
    assert_eq!(lines.iter().filter(|l| l["status"] == 200).count(), 1);
    let mut metrics = String::new();
    let mut stream = TcpStream::connect(("127.0.0.1", admin)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    stream.read_to_string(&mut metrics).unwrap();
    let counted = (metrics.lines())
        .find_map(|l| l.strip_prefix("sluice_access_log_suppressed_total "))
        .expect("the counter");
    assert_eq!(counted.trim(), repeated.to_string());
}
