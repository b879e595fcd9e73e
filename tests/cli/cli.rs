//! The `sluice` binary: `check`, `hash-key` and `run`, as an operator uses them.

use crate::support;

use support::{Toml, free_port, route};

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A config whose client and admin listeners are on these ports; `server` adds
/// lines to `[server]`.
fn listening(port: u16, admin_port: u16, server: &str) -> Toml {
    Toml::new().raw(&format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{server}\n[admin]\nlisten = \"127.0.0.1:{admin_port}\""
    ))
}

/// Runs `sluice args...` in `dir` with `env`, without inheriting SLUICE_CONFIG.
fn sluice(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(SLUICE);
    command
        .args(args)
        .current_dir(dir)
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice starts");
    wait_output(child, Duration::from_secs(10))
}

/// Waits for `child` to exit (killing it after `limit`) and collects its output.
fn wait_output(mut child: Child, limit: Duration) -> Output {
    let status = wait_exit(&mut child, limit);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_end(&mut stdout).unwrap();
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_end(&mut stderr).unwrap();
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway.toml")
}

#[test]
fn check_accepts_the_shipped_example_and_prints_the_route_table() {
    let dir = tempfile::tempdir().unwrap();
    let example = example();
    let out = sluice(dir.path(), &["check", "-c", example.to_str().unwrap()], &[]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let header = stdout.lines().next().unwrap_or_default();
    for column in ["ROUTE", "MATCH", "TARGET", "POLICY", "LIMITS"] {
        assert!(header.contains(column), "table header: {header:?}");
    }
    let demo = stdout
        .lines()
        .find(|l| l.starts_with("demo "))
        .unwrap_or_else(|| panic!("no demo row in:\n{stdout}"));
    for cell in [
        "/demo",
        "respond 200",
        "standard",
        "anonymous: 10/minute 1000/day",
        "registered: 100/minute 100000/day",
    ] {
        assert!(demo.contains(cell), "demo row lacks {cell:?}: {demo}");
    }
    let api = stdout
        .lines()
        .find(|l| l.starts_with("api "))
        .unwrap_or_else(|| panic!("no api row in:\n{stdout}"));
    assert!(
        api.contains("/api") && api.contains("upstream api"),
        "{api}"
    );
    assert!(
        stdout.contains("ok (2 routes, 1 policies, 1 consumers, 1 upstreams)"),
        "{stdout}"
    );
}

const BROKEN: &str = r#"[server]
listen = "127.0.0.1:8080"
listn = "oops"

[upstreams.shop]
targets = ["http://127.0.0.1:3000"]
timeout = "30"

[policies.standard]
anonymous = { per_minute = 10 }

[[routes]]
name = "shop"
path_prefix = "/shop"
upstream = "nope"
policy = "standard"
"#;

#[test]
fn check_lists_every_error_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "broken.toml", BROKEN);
    let out = sluice(dir.path(), &["check", "-c", path.to_str().unwrap()], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        !text(&out.stdout).contains("ok ("),
        "a broken config must not be reported ok"
    );
    let file = path.display().to_string();
    // (line, key, words of the reason); each error is a block: the headline, the
    // location, the source line with a caret.
    let expected: [(usize, &str, &[&str]); 3] = [
        (
            3,
            "server.listn",
            &["unknown key `listn`", "did you mean `listen`?"],
        ),
        (7, "upstreams.shop.timeout", &["30", "unit"]),
        (15, "routes[0].upstream", &["unknown upstream", "nope"]),
    ];
    let blocks: Vec<&str> = stderr.split("\n\n").collect();
    for (line, key, words) in expected {
        let location = format!("{file}:{line}:");
        let found = blocks
            .iter()
            .find(|b| b.contains(&location) && b.contains(&format!("error: {key}: ")))
            .unwrap_or_else(|| panic!("no error at {location} for {key} in stderr:\n{stderr}"));
        assert!(found.contains(" ^"), "no caret under the key: {found}");
        for word in words {
            assert!(found.contains(word), "{found:?} should mention {word:?}");
        }
    }
    assert!(stderr.contains("3 error(s)"), "{stderr}");
}

#[test]
fn check_reports_a_toml_syntax_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "syntax.toml",
        "[server]\nlisten = \"127.0.0.1:8080\"\nheader_timeout = \n",
    );
    let out = sluice(dir.path(), &["check", "-c", path.to_str().unwrap()], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("{}:3", path.display())),
        "syntax error located on line 3:\n{stderr}"
    );
}

#[test]
fn check_of_a_missing_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice(dir.path(), &["check", "-c", "does-not-exist.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("does-not-exist.toml"),
        "{}",
        text(&out.stderr)
    );
}

const MINIMAL: &str = r#"
[[routes]]
name = "from-env"
path_prefix = "/env"
respond = { status = 204 }
"#;

#[test]
fn the_config_comes_from_dash_c_then_sluice_config_then_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let from_env = write(dir.path(), "env.toml", MINIMAL);
    let broken = write(dir.path(), "broken.toml", BROKEN);
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();

    // $SLUICE_CONFIG is read when -c is absent.
    let out = sluice(&work, &["check"], &[("SLUICE_CONFIG", &from_env)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("from-env"),
        "{}",
        text(&out.stdout)
    );

    let out = sluice(&work, &["check"], &[("SLUICE_CONFIG", &broken)]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "SLUICE_CONFIG points at a broken file"
    );
    assert!(text(&out.stderr).contains("broken.toml"));

    // -c wins over $SLUICE_CONFIG.
    let out = sluice(
        &work,
        &["check", "-c", from_env.to_str().unwrap()],
        &[("SLUICE_CONFIG", &broken)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Neither: ./gateway.toml.
    let out = sluice(&work, &["check"], &[]);
    assert_eq!(out.status.code(), Some(1), "no ./gateway.toml yet");
    assert!(
        text(&out.stderr).contains("gateway.toml"),
        "{}",
        text(&out.stderr)
    );
    write(
        &work,
        "gateway.toml",
        &MINIMAL.replace("from-env", "from-cwd"),
    );
    let out = sluice(&work, &["check"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("from-cwd"));
}

#[test]
fn hash_key_prints_the_sha256_of_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice(dir.path(), &["hash-key", "demo-key-acme"], &[]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        "8649cdebee753898fd50e01408a9e438aa5090249bc3e51b65f33dce973b0873"
    );
    let other = sluice(dir.path(), &["hash-key", "demo-key-acme2"], &[]);
    assert_ne!(text(&other.stdout).trim(), text(&out.stdout).trim());
}

#[test]
fn hash_key_reads_the_key_from_stdin_when_none_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(SLUICE)
        .arg("hash-key")
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As `echo demo-key-acme | sluice hash-key` sends it: with a newline.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"demo-key-acme\n")
        .unwrap();
    let out = wait_output(child, Duration::from_secs(10));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "8649cdebee753898fd50e01408a9e438aa5090249bc3e51b65f33dce973b0873"
    );
    // Nothing on stdin is an error, not the hash of "".
    let empty = sluice(dir.path(), &["hash-key"], &[]);
    assert_eq!(empty.status.code(), Some(1));
    assert!(text(&empty.stderr).contains("the key is empty"));
}

#[test]
fn version_completions_and_man_page() {
    let dir = tempfile::tempdir().unwrap();
    let version = text(&sluice(dir.path(), &["--version"], &[]).stdout);
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    assert_eq!(
        version.trim(),
        format!("sluice {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
    let bash = sluice(dir.path(), &["completions", "bash"], &[]);
    assert!(bash.status.success());
    let script = text(&bash.stdout);
    assert!(
        script.contains("_sluice()") && script.contains("hash-key"),
        "{script}"
    );
    let man = sluice(dir.path(), &["man"], &[]);
    assert!(man.status.success());
    let page = text(&man.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH sluice"),
        "{page}"
    );
    assert!(page.contains("health"), "{page}");
}

/// One HTTP/1.1 request on a fresh connection (closed afterwards); the raw answer.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(answer)
}

/// `sluice run -c config` in `dir`, stderr captured, stdout discarded.
fn spawn_run(dir: &Path, config: &Path) -> Child {
    Command::new(SLUICE)
        .args(["run", "-c", config.to_str().unwrap()])
        .current_dir(dir)
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice run starts")
}

/// Sends SIGTERM to the guarded child and waits (bounded) for it to exit.
fn terminate(guard: &mut Guard) -> Output {
    let child = guard.0.take().expect("a running child");
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    wait_output(child, Duration::from_secs(10))
}

/// Kills the child if a test panics while it runs.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn run_serves_the_config_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let admin_port = free_port();
    let config = write(
        dir.path(),
        "run.toml",
        &listening(port, admin_port, "")
            .policy("standard", &[("anonymous", "{ per_minute = 2 }")])
            .route(
                route("demo", "/demo")
                    .respond(200, "hello from sluice\n")
                    .policy("standard"),
            )
            .build(),
    );
    let mut guard = Guard(Some(spawn_run(dir.path(), &config)));

    // Wait (bounded) until it serves.
    let started = Instant::now();
    let first = loop {
        match http_get(port, "/demo") {
            Ok(answer) => break answer,
            Err(err) if started.elapsed() < Duration::from_secs(10) => {
                let _ = err;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(err) => panic!("sluice run never served on port {port}: {err}"),
        }
    };
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(first.ends_with("hello from sluice\n"), "{first}");
    assert!(
        first
            .to_ascii_lowercase()
            .contains("ratelimit-policy: \"minute\";q=2;w=60")
    );
    assert!(http_get(port, "/demo").unwrap().starts_with("HTTP/1.1 200"));
    let limited = http_get(port, "/demo").unwrap();
    assert!(limited.starts_with("HTTP/1.1 429"), "{limited}");
    assert!(
        http_get(port, "/nowhere")
            .unwrap()
            .starts_with("HTTP/1.1 404")
    );

    let out = terminate(&mut guard);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "exit after SIGTERM: {:?}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still listening after exit"
    );
}

#[test]
fn run_with_a_broken_config_exits_1_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "broken.toml", BROKEN);
    let out = sluice(dir.path(), &["run", "-c", path.to_str().unwrap()], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(stderr.contains("unknown upstream"), "{stderr}");
}

#[test]
fn run_with_a_redis_url_the_client_cannot_use_exits_1_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = listening(free_port(), free_port(), "")
        .raw("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379/notanumber\"")
        .route(route("demo", "/").with("respond = { status = 200 }"))
        .build();
    let path = write(dir.path(), "gateway.toml", &config);
    let out = sluice(dir.path(), &["run", "-c", path.to_str().unwrap()], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("store.url") && stderr.contains("notanumber"),
        "{stderr}"
    );
}

#[test]
fn run_with_several_workers_counts_across_them_and_a_second_instance_cannot_share_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let admin_port = free_port();
    let config = write(
        dir.path(),
        "workers.toml",
        &listening(port, admin_port, "worker_threads = 3")
            .policy("standard", &[("anonymous", "{ per_minute = 20 }")])
            .route(
                route("demo", "/demo")
                    .respond(200, "ok\n")
                    .policy("standard"),
            )
            .build(),
    );
    let mut guard = Guard(Some(spawn_run(dir.path(), &config)));
    let pid = guard.0.as_ref().unwrap().id();
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Three worker threads, each with its own socket on the port. The sockets are
    // bound (and accept into their backlog) before the threads start: wait for them.
    let workers = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_string())
            .filter(|name| name.starts_with("sluice-worker-"))
            .collect()
    };
    let mut threads = workers();
    while threads.len() < 3 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        threads = workers();
    }
    assert_eq!(threads.len(), 3, "worker threads: {threads:?}");
    let listening = std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&format!("0100007F:{port:04X}").as_str())
                && fields.get(3) == Some(&"0A")
        })
        .count();
    assert_eq!(listening, 3, "listening sockets on port {port}");

    // 30 connections land on whichever worker the kernel picks; the limit is one.
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..30 {
        let answer = http_get(port, "/demo").unwrap();
        *statuses.entry(answer[9..12].to_string()).or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        [("200".to_string(), 20), ("429".to_string(), 10)].into(),
    );

    // A second sluice on the same port fails instead of joining the SO_REUSEPORT group.
    let second = wait_output(spawn_run(dir.path(), &config), Duration::from_secs(10));
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(http_get(port, "/demo").unwrap().starts_with("HTTP/1.1 429"));

    let out = terminate(&mut guard);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
