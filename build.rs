//! Records the commit the binary is built from, for `sluice --version` and
//! `sluice_build_info`: `$SLUICE_COMMIT` if set (a container build has no `.git`),
//! else `git rev-parse`, else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    for watched in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if Path::new(watched).exists() {
            println!("cargo:rerun-if-changed={watched}");
        }
    }
    let commit = std::env::var("SLUICE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            out.status.success().then(|| text.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
}
