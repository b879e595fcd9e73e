//! The container image, proven without a container runtime: the Dockerfile's
//! promises are read from it, and the binary is started the way the image starts it
//! (its config, `SLUICE_CONFIG`, `run --log-format json`, a state volume), then
//! probed the way Prometheus, Kubernetes and `HEALTHCHECK` probe it.

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{blocking_request, closed_port, free_port};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dockerfile() -> String {
    std::fs::read_to_string(repo().join("Dockerfile")).unwrap()
}

#[test]
fn the_dockerfile_builds_what_the_test_below_runs() {
    let docker = dockerfile();
    for promise in [
        // dependency layer cached apart from the sources, built by the release
        // script with its own flags
        "COPY Cargo.toml Cargo.lock build.rs ./",
        "COPY scripts/release ./scripts/release",
        "scripts/release --prebuild \\\n    && rm -rf src benches",
        // the shipped build (BOLT-laid-out), stripped by a strip that keeps BOLT's
        // layout working; numeric non-root user, writable state volume
        "    && scripts/release \\\n",
        "llvm-strip-19 target/shipped/sluice",
        "COPY --from=build /src/target/shipped/sluice /usr/local/bin/sluice",
        "USER 10001:10001",
        "chown 10001:10001 /var/lib/sluice",
        "VOLUME [\"/var/lib/sluice\"]",
        // the config and command this test runs
        "COPY examples/container/gateway.toml /etc/sluice/gateway.toml",
        "ENV SLUICE_CONFIG=/etc/sluice/gateway.toml",
        "CMD [\"/usr/local/bin/sluice\", \"health\"]",
        "ENTRYPOINT [\"/usr/local/bin/sluice\"]",
        "CMD [\"run\", \"--log-format\", \"json\"]",
    ] {
        assert!(docker.contains(promise), "Dockerfile lacks {promise:?}");
    }
    let config = std::fs::read_to_string(repo().join("examples/container/gateway.toml")).unwrap();
    assert!(config.contains("state_file = \"/var/lib/sluice/sluice.state\""));
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    for needed in [
        "!Cargo.toml",
        "!Cargo.lock",
        "!build.rs",
        "!scripts/release",
        "!src/",
        "!benches/*.rs",
    ] {
        assert!(
            ignore.contains(needed),
            ".dockerignore must let {needed} in"
        );
    }
    assert!(
        ignore.lines().any(|l| l.trim() == "*"),
        "everything else stays out"
    );
}

fn health(config: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(SLUICE)
        .arg("health")
        .args(args)
        .env("SLUICE_CONFIG", config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_image_config_serves_probes_and_metrics_off_loopback_and_keeps_state_on_its_volume() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("var-lib-sluice");
    std::fs::create_dir(&volume).unwrap();
    let (port, admin) = (free_port(), free_port());
    // The image's config, with free ports and the volume at a temp path.
    let image_config =
        std::fs::read_to_string(repo().join("examples/container/gateway.toml")).unwrap();
    let config = image_config
        .replace("0.0.0.0:8080", &format!("0.0.0.0:{port}"))
        .replace("0.0.0.0:9090", &format!("0.0.0.0:{admin}"))
        .replace("/var/lib/sluice", volume.to_str().unwrap());
    assert_ne!(config, image_config);
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &config).unwrap();

    let mut child = Killed(
        Command::new(SLUICE)
            .args(["run", "--log-format", "json"])
            .env("SLUICE_CONFIG", &path)
            .env_remove("SLUICE_LOG")
            .current_dir("/")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while blocking_request(admin, "GET", "/readyz").map(|r| r.0).ok() != Some(200) {
        assert!(started.elapsed() < Duration::from_secs(10), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Prometheus and the probes reach their three paths; the rest is 403.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(
            blocking_request(admin, "GET", path).unwrap().0,
            200,
            "{path}"
        );
    }
    assert_eq!(
        blocking_request(admin, "GET", "/admin/usage?caller=ip:1.2.3.4")
            .unwrap()
            .0,
        403
    );
    assert_eq!(
        blocking_request(admin, "GET", "/admin/bans").unwrap().0,
        403
    );
    assert_eq!(
        blocking_request(admin, "POST", "/admin/reload").unwrap().0,
        403
    );
    assert_eq!(blocking_request(admin, "POST", "/v1/check").unwrap().0, 403);

    // The HEALTHCHECK: the config's 0.0.0.0 admin address is asked on loopback.
    let (ok, said) = health(&path, &[]);
    assert!(ok, "{said}");
    let (ok, said) = health(&path, &["--admin", &format!("127.0.0.1:{}", closed_port())]);
    assert!(!ok, "a closed port is not healthy: {said}");

    // Traffic: served, and one JSON access line per request on stdout.
    let (status, body) = blocking_request(port, "GET", "/hello").unwrap();
    assert_eq!(status, 200, "{body}");
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let logged: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(logged["path"], "/hello");
    assert_eq!(logged["status"], 200);

    // docker stop: SIGTERM, a clean exit, the counters saved on the volume.
    let pid = child.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(
        volume.join("sluice.state").exists(),
        "state file on the volume"
    );
    let (ok, _) = health(&path, &[]);
    assert!(!ok, "stopped is not healthy");
}
