//! `examples/`: every example's gateway.toml passes `sluice check`, the Kubernetes
//! Deployment's probes answer a gateway started as it starts one, and the fleet
//! recipe (three replicas and a private redis-server) enforces one limit.

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{blocking_request, free_port};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

#[test]
fn every_example_config_passes_sluice_check() {
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(examples()).unwrap() {
        let config = entry.unwrap().path().join("gateway.toml");
        if !config.exists() {
            continue;
        }
        let out = Command::new(SLUICE)
            .args(["check", "-c"])
            .arg(&config)
            .env("SLUICE_ADMIN_TOKEN", "a-token-from-a-secret")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}:\n{}",
            config.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked.push(config.parent().unwrap().file_name().unwrap().to_owned());
    }
    checked.sort();
    assert_eq!(
        checked,
        ["container", "flash-sale", "fleet", "kubernetes", "proxies"]
    );
}

/// What the Kubernetes Deployment runs, read from `deployment.yaml` line by line (the
/// manifest writes each of these on one line): the container's args, its
/// `SLUICE_CONFIG`, each named port, and the path and port name of its readiness and
/// liveness probes.
struct Deployment {
    args: Vec<String>,
    config: String,
    ports: Vec<(String, u16)>,
    probes: Vec<(String, String)>,
}

impl Deployment {
    fn read() -> Deployment {
        let text = std::fs::read_to_string(examples().join("kubernetes/deployment.yaml")).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        // `{key: value, key: value}` on one line.
        let fields = |line: &str| -> Vec<(String, String)> {
            line.trim_start_matches("- ")
                .trim_start_matches("httpGet: ")
                .trim_matches(|c| c == '{' || c == '}')
                .split(", ")
                .filter_map(|f| f.split_once(": "))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let field = |fields: &[(String, String)], key: &str| {
            let found = fields.iter().find(|(k, _)| k == key);
            found
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
        };
        let args = lines
            .iter()
            .find_map(|l| l.strip_prefix("args: "))
            .expect("the container's args");
        let at = lines
            .iter()
            .position(|l| *l == "- name: SLUICE_CONFIG")
            .expect("SLUICE_CONFIG in env");
        let config = lines[at + 1].strip_prefix("value: ").expect("its value");
        let ports = lines
            .iter()
            .filter(|l| l.contains("containerPort: "))
            .map(|l| {
                let f = fields(l);
                (
                    field(&f, "name"),
                    field(&f, "containerPort").parse().unwrap(),
                )
            })
            .collect();
        let probes = ["readinessProbe:", "livenessProbe:"]
            .iter()
            .map(|probe| {
                let at = lines.iter().position(|l| l == probe).expect(probe);
                let f = fields(lines[at + 1]);
                (field(&f, "path"), field(&f, "port"))
            })
            .collect();
        Deployment {
            args: serde_json::from_str(args).unwrap(),
            config: config.to_string(),
            ports,
            probes,
        }
    }
}

#[test]
fn the_kubernetes_probes_answer_on_the_ports_the_deployment_names() {
    let deployment = Deployment::read();
    assert_eq!(deployment.probes.len(), 2);
    // The ConfigMap is made from the example's gateway.toml and mounted at
    // /etc/sluice: that file, on free ports in place of the container's.
    assert_eq!(deployment.config, "/etc/sluice/gateway.toml");
    let mut config = std::fs::read_to_string(examples().join("kubernetes/gateway.toml")).unwrap();
    let mut free = Vec::new();
    for (name, port) in &deployment.ports {
        let here = free_port();
        let listen = format!("0.0.0.0:{port}");
        assert!(config.contains(&listen), "no listener for port {name}");
        config = config.replace(&listen, &format!("127.0.0.1:{here}"));
        free.push((name.clone(), here));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let mut sluice = Recipe(
        Command::new(SLUICE)
            .args(&deployment.args)
            .env("SLUICE_CONFIG", &path)
            .env("SLUICE_ADMIN_TOKEN", "a-token-from-a-secret")
            .env_remove("SLUICE_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for (path, port) in &deployment.probes {
        let (_, port) = free
            .iter()
            .find(|(name, _)| name == port)
            .unwrap_or_else(|| panic!("the probe's port {port} is not a container port"));
        // Ready once it listens: the probe is retried until then, as the kubelet does.
        let mut answer = blocking_request(*port, "GET", path);
        for _ in 0..200 {
            if answer.as_ref().is_ok_and(|(status, _)| *status == 200) {
                break;
            }
            assert!(sluice.0.try_wait().unwrap().is_none(), "sluice exited");
            std::thread::sleep(Duration::from_millis(50));
            answer = blocking_request(*port, "GET", path);
        }
        assert_eq!(answer.unwrap().0, 200, "the probe {path} on port {port}");
    }
}

/// Kills the recipe's process group when the test ends, however it ends.
struct Recipe(Child);

impl Drop for Recipe {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_fleet_recipe_runs_three_replicas_that_share_one_limit() {
    let redis = free_port();
    // run.sh puts replicas on consecutive ports; find three free in a row.
    let base = (20_000..60_000)
        .step_by(7)
        .find(|&p| {
            (0..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok())
                && (0..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + 100 + i)).is_ok())
        })
        .expect("six free ports");
    let mut recipe = Recipe(
        Command::new(examples().join("fleet/run.sh"))
            .env("SLUICE", SLUICE)
            .env("REDIS_PORT", redis.to_string())
            .env("BASE_PORT", base.to_string())
            .env("ADMIN_BASE_PORT", (base + 100).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(recipe.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("fleet ready"), "{line:?}");
    // The anonymous limit is 5 a minute for the fleet, whichever replica is asked.
    let statuses: Vec<u16> = (0..8)
        .map(|i| blocking_request(base + (i % 3), "GET", "/").unwrap().0)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
}
