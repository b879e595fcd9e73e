//! The container image, proven without a container runtime: the binary is started
//! the way the Dockerfile's final stage starts it, read from the Dockerfile (the
//! config it copies to `SLUICE_CONFIG`, its ENTRYPOINT and CMD, its volume for the
//! state file), then probed the way Prometheus and Kubernetes probe it and with the
//! image's own HEALTHCHECK command.

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

/// What the Dockerfile's final stage runs, read from it: the binary's path in the
/// image, the config file it copies to `ENV SLUICE_CONFIG`, the volume, the
/// ENTRYPOINT and CMD it starts with and the HEALTHCHECK's command.
struct Image {
    /// Where `COPY --from=build` puts the binary.
    binary: String,
    /// The `ENV SLUICE_CONFIG` path.
    config: String,
    /// The repository file copied there.
    config_source: PathBuf,
    /// The one `VOLUME`.
    volume: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    healthcheck: Vec<String>,
}

impl Image {
    fn read() -> Image {
        let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
        let text = text.replace("\\\n", " ");
        let stage = text.rsplit("\nFROM ").next().unwrap();
        let exec = |json: &str| -> Vec<String> {
            serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{json}: {e}"))
        };
        let (mut binary, mut copies, mut config, mut volume) = (None, Vec::new(), None, None);
        let (mut entrypoint, mut cmd, mut healthcheck) = (None, None, None);
        for line in stage.lines().map(str::trim) {
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "COPY" if rest.starts_with("--from=build ") => {
                    binary = rest.split_whitespace().last().map(str::to_string);
                }
                "COPY" => {
                    let (from, to) = rest.split_once(' ').unwrap();
                    copies.push((from.to_string(), to.trim().to_string()));
                }
                "ENV" => config = rest.strip_prefix("SLUICE_CONFIG=").map(str::to_string),
                "VOLUME" => volume = exec(rest).pop(),
                "ENTRYPOINT" => entrypoint = Some(exec(rest)),
                "CMD" => cmd = Some(exec(rest)),
                "HEALTHCHECK" => {
                    let (_, command) = rest.split_once(" CMD ").expect("HEALTHCHECK ... CMD");
                    healthcheck = Some(exec(command));
                }
                _ => {}
            }
        }
        let config = config.expect("ENV SLUICE_CONFIG");
        let (source, _) = copies
            .iter()
            .find(|(_, to)| *to == config)
            .unwrap_or_else(|| panic!("no COPY puts a file at {config}"));
        Image {
            binary: binary.expect("COPY --from=build of the binary"),
            config_source: repo().join(source),
            config,
            volume: volume.expect("a VOLUME"),
            entrypoint: entrypoint.expect("an ENTRYPOINT"),
            cmd: cmd.expect("a CMD"),
            healthcheck: healthcheck.expect("a HEALTHCHECK"),
        }
    }

    /// `argv` as this test runs it: the image's binary is the one cargo built, and
    /// `SLUICE_CONFIG` names `config` (the image's file, moved to free ports).
    fn command(&self, argv: &[String], config: &Path) -> Command {
        assert_eq!(argv[0], self.binary, "{argv:?} runs the image's binary");
        let mut command = Command::new(SLUICE);
        command.args(&argv[1..]).env("SLUICE_CONFIG", config);
        command
    }

    /// Runs the HEALTHCHECK's command (with `extra` arguments): healthy or not,
    /// and what it said.
    fn health(&self, config: &Path, extra: &[&str]) -> (bool, String) {
        let out = self
            .command(&self.healthcheck, config)
            .args(extra)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
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
    // The config the image copies to its SLUICE_CONFIG, with free ports and the
    // image's volume at a temp path.
    let image = Image::read();
    assert_eq!(image.config, "/etc/sluice/gateway.toml");
    let image_config = std::fs::read_to_string(&image.config_source).unwrap();
    let config = image_config
        .replace("0.0.0.0:8080", &format!("0.0.0.0:{port}"))
        .replace("0.0.0.0:9090", &format!("0.0.0.0:{admin}"))
        .replace(&image.volume, volume.to_str().unwrap());
    assert!(
        config.contains(&format!("0.0.0.0:{port}")) && config.contains(&format!("0.0.0.0:{admin}")),
        "the image's config listens on 0.0.0.0:8080 and 0.0.0.0:9090:\n{image_config}"
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &config).unwrap();

    // Started as the image starts it: ENTRYPOINT, then CMD.
    let argv: Vec<String> = image.entrypoint.iter().chain(&image.cmd).cloned().collect();
    let mut child = Killed(
        image
            .command(&argv, &path)
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

    // The HEALTHCHECK's command: the config's 0.0.0.0 admin address is asked on
    // loopback.
    let (ok, said) = image.health(&path, &[]);
    assert!(ok, "{said}");
    let (ok, said) = image.health(&path, &["--admin", &format!("127.0.0.1:{}", closed_port())]);
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
        "state file on the image's volume"
    );
    let (ok, _) = image.health(&path, &[]);
    assert!(!ok, "stopped is not healthy");
}
