//! Envoy's own generated rate limit client (`tests/decision/rls_client.py`: the
//! `RateLimitServiceStub` of `xds-protos`, over `grpcio`), run by the tests that
//! ask sluice's decision listener as Envoy would.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The decision listener, a `[[decision.descriptors]]` entry spending the
/// `standard` budget of Envoy's `remote_address`, and a route forward auth decides:
/// the same budget through every door.
pub const DOORS: &str = r#"
[decision]
listen = "127.0.0.1:0"

[identity]
trusted_proxies = ["127.0.0.1/32"]

[policies.standard]
anonymous = { per_minute = 10 }

[[decision.descriptors]]
domain = "edge"
entries = ["remote_address"]
policy = "standard"

[[routes]]
name = "api"
path_prefix = "/api"
policy = "standard"
respond = { status = 200, body = "ok" }
"#;

/// The Python that runs the stub: `SLUICE_TEST_PYTHON`, the venv `scripts/test`
/// makes, or `python3`.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("SLUICE_TEST_PYTHON") {
        return python.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python3");
    match venv.exists() {
        true => venv,
        false => "python3".into(),
    }
}

/// Sends `calls` (see `rls_client.py`) to the decision listener at `addr` in order;
/// the answers.
pub fn rls(addr: &str, calls: &Value) -> Vec<Value> {
    let mut child = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/decision/rls_client.py"))
        .arg(addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let input = serde_json::to_vec(calls).unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &input).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Envoy client failed (scripts/test installs its Python packages: \
         pip install grpcio xds-protos; SLUICE_TEST_PYTHON names the interpreter):\n{stderr}"
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}
