//! The status page in a real headless Chromium (Debian's `chromium`, driven by
//! Playwright for Python: `tests/status/browser.py` says what it checks). What the
//! browser needs is installed by `scripts/test`.

use std::process::Command;

use crate::binary::{Sluice, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_page_logs_in_updates_without_reload_and_lifts_a_ban() {
    let sluice = Sluice::start(&crate::config()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/status/browser.py");
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let shot = screenshot.clone();
    let admin = format!("http://{}", sluice.admin);
    let port = sluice.addr.port().to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([
                script,
                "--admin",
                &admin,
                "--gateway-port",
                &port,
                "--token",
                TOKEN,
            ])
            .args(["--caller", "127.0.0.11", "--screenshot"])
            .arg(&screenshot)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs (scripts/test installs Playwright and chromium)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser test failed: {stderr}\n{stdout}\nsluice:\n{}",
        sluice.stderr()
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["without_token"], 401);
    assert_eq!(
        seen["burst"],
        serde_json::json!([200, 200, 429, 429, 429, 403])
    );
    assert_eq!(seen["banned_status"], 403);
    assert_eq!(seen["after_lift"], 200);
    let png = std::fs::read(shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a screenshot is written");
}
