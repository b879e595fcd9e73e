//! CPU time of compiling a consumers file of a million lines, the part of a swap
//! that does not depend on how busy the machine is: the time the compiling thread
//! spent on a core (`/proc/thread-self/schedstat`), not the wall time.
//!
//! For each of `RUNS` runs: `Config::load` of a `gateway.toml` whose
//! `consumers_file` holds `CONSUMERS` lines like those `sluice hash-key --batch`
//! writes (the read, the parse, the duplicate checks), then `Gateway::install` of
//! it (the snapshot: the identifier, its lookups and limiter keys), which also
//! drops the snapshot it replaces. The median of each is printed.
//!
//! Run: `cargo bench --bench consumers_file` (`CONSUMERS=N`, `RUNS=N` change the
//! counts).

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use std::io::Write;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sluice::clock::Clock;
use sluice::config::Config;
use sluice::gateway::Gateway;

/// Time this thread has run on a core.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("linux /proc");
    let ns: u64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat starts with the time on a core");
    Duration::from_nanos(ns)
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f`, returning what it returns with its CPU and wall time.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration, Duration) {
    let (cpu, wall) = (thread_cpu(), Instant::now());
    let out = f();
    (out, thread_cpu() - cpu, wall.elapsed())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let consumers = env("CONSUMERS", 1_000_000);
    let runs = env("RUNS", 5).max(1);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("consumers.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&file).expect("created"));
    for i in 0..consumers {
        let hash = const_hex::encode(Sha256::digest(format!("key-{i}").as_bytes()));
        writeln!(
            out,
            r#"{{"name":"c{i}","plan":"registered","key_sha256":"{hash}"}}"#
        )
        .expect("written");
    }
    out.flush().expect("written");
    drop(out);
    let path = dir.path().join("gateway.toml");
    let toml = r#"
[identity]
consumers_file = "consumers.jsonl"
[policies.p]
anonymous = { per_minute = 10 }
registered = { per_second = 1000000 }
[[routes]]
name = "api"
path_prefix = "/"
respond = { status = 200, body = "ok" }
policy = "p"
"#;
    std::fs::write(&path, toml).expect("written");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let config = Config::load(&path).expect("the config compiles");
    let gateway = Gateway::new(config, Clock::system(), std::io::sink()).expect("a gateway");
    let (mut load_cpu, mut load_wall) = (Vec::new(), Vec::new());
    let (mut install_cpu, mut install_wall) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (config, cpu, wall) = timed(|| Config::load(&path).expect("the config compiles"));
        load_cpu.push(cpu);
        load_wall.push(wall);
        let (_, cpu, wall) = timed(|| gateway.install(config));
        install_cpu.push(cpu);
        install_wall.push(wall);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("consumers_file: {consumers} consumers, median of {runs} runs");
    println!(
        "  Config::load       cpu {:7.1} ms   wall {:7.1} ms",
        ms(median(load_cpu)),
        ms(median(load_wall))
    );
    println!(
        "  Gateway::install   cpu {:7.1} ms   wall {:7.1} ms",
        ms(median(install_cpu)),
        ms(median(install_wall))
    );
}
