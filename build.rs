//! Records the commit the binary is built from, for `sluice --version` and
//! `sluice_build_info`: `$SLUICE_COMMIT` if set (a container build has no `.git`),
//! else `git rev-parse`, else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    // What a new commit changes: HEAD, the branch file it names (a commit on the
    // branch rewrites only that file) and the packed refs. Asked of git, so a linked
    // work tree (whose `.git` is a file) is followed too.
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]);
    let watched = ["HEAD", "packed-refs"]
        .into_iter()
        .chain(branch.as_deref().filter(|b| b.starts_with("refs/")));
    for path in watched.filter_map(|name| git(&["rev-parse", "--git-path", name])) {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("SLUICE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
}

/// What `git ARGS` prints (trimmed), if git runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    out.status.success().then(|| text.trim().to_string())
}
