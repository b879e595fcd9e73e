//! `examples/`: every example's gateway.toml passes `sluice check`, and the fleet
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
    assert_eq!(checked, ["container", "flash-sale", "fleet", "kubernetes"]);
}

#[test]
fn the_kubernetes_manifests_have_probes_a_drain_and_an_in_place_config() {
    let read = |name: &str| std::fs::read_to_string(examples().join("kubernetes").join(name));
    let deployment = read("deployment.yaml").unwrap();
    for needed in [
        "readinessProbe:\n            httpGet: {path: /readyz, port: admin}",
        "livenessProbe:\n            httpGet: {path: /healthz, port: admin}",
        "preStop:",
        "configMap: {name: sluice-config}",
        "runAsUser: 10001",
    ] {
        assert!(deployment.contains(needed), "deployment lacks {needed:?}");
    }
    let kustomization = read("kustomization.yaml").unwrap();
    assert!(kustomization.contains("disableNameSuffixHash: true"));
    assert!(read("service.yaml").unwrap().contains("kind: Service"));
    assert!(
        read("servicemonitor.yaml")
            .unwrap()
            .contains("kind: ServiceMonitor")
    );
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
