//! The `sluice` command: `run`, `check`, `hash-key`, `health`, `completions`, `man`.

use std::io::{IsTerminal, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use sha2::{Digest, Sha256};
use sluice::config::Config;

/// mimalloc instead of the C library's allocator (`allocator.rs`).
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

// A file of its own (the library forbids unsafe code), which `benches/memory.rs`
// includes too, so its figures are this allocator's.
// The one module of the binary that may use unsafe code: a global allocator must.
#[allow(unsafe_code)]
mod allocator;
// The whole manual page (`sluice man`).
mod man;
// The table `sluice check` prints.
mod table;

#[derive(Parser)]
#[command(name = "sluice", version = sluice::app::VERSION, about = "A rate-limiting API gateway")]
struct Cli {
    /// Config file [default: $SLUICE_CONFIG, then ./gateway.toml]
    #[arg(short = 'c', long = "config", global = true, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Log format on stderr
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve: SIGTERM or SIGINT drains in-flight requests and exits
    Run,
    /// Validate the config and print the route/policy table; exit 1 on error
    Check,
    /// Print the sha256 of an API key, for key_sha256 (reads stdin without KEY, so
    /// the key stays out of shell history)
    HashKey {
        key: Option<String>,
        /// Read "NAME PLAN KEY" lines on stdin and print consumers-file JSON lines
        #[arg(long, conflicts_with = "key")]
        batch: bool,
    },
    /// Exit 0 if the admin listener's /readyz answers 200 (for a container HEALTHCHECK)
    Health {
        /// Admin address [default: the config's admin.listen, then 127.0.0.1:9090]
        #[arg(long)]
        admin: Option<String>,
    },
    /// Print a shell completion script
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff)
    Man,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    sluice::app::set_upkeep(allocator::collect);
    let cli = Cli::parse();
    let path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(sluice::config::DEFAULT_PATH));
    match cli.command {
        Command::HashKey { batch: true, .. } => hash_keys(),
        Command::HashKey { key, .. } => hash_key(key),
        Command::Check => check(&path),
        Command::Health { admin } => health(admin, &path),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "sluice", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man => match man::render(Cli::command(), &mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Run => {
            init_logging(cli.log_format);
            run(&path)
        }
    }
}

/// `SLUICE_LOG` is a level for sluice's own logs (`debug`), or, with `=` in it, a
/// full filter (`sluice=debug,h2=trace`). A bare level leaves the HTTP libraries
/// at `warn`: their debug output is a line per frame.
fn log_filter(setting: Option<&str>) -> String {
    match setting.map(str::trim) {
        None | Some("") => "warn,sluice=info".to_string(),
        Some(full) if full.contains('=') => full.to_string(),
        Some(level) => format!("warn,sluice={level}"),
    }
}

fn init_logging(format: LogFormat) {
    let setting = std::env::var("SLUICE_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(setting.as_deref()))
        .unwrap_or_else(|err| {
            eprintln!("warning: SLUICE_LOG: {err}; using the default");
            tracing_subscriber::EnvFilter::new(log_filter(None))
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn load(path: &Path) -> Option<Config> {
    match Config::load(path) {
        Ok(config) => Some(config),
        Err(err) => {
            let color = std::io::stderr().is_terminal();
            for diagnostic in &err.diagnostics {
                eprintln!("{}\n", diagnostic.render(color));
            }
            let errors = err.errors().count();
            eprintln!("{}: {errors} error(s)", path.display());
            None
        }
    }
}

fn hash_key(key: Option<String>) -> ExitCode {
    let key = match key {
        Some(key) => key,
        None => {
            let mut text = String::new();
            if let Err(err) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("error: cannot read the key from stdin: {err}");
                return ExitCode::FAILURE;
            }
            // `echo KEY |` and a file saved by an editor end with a newline.
            text.trim_end_matches(['\n', '\r']).to_string()
        }
    };
    if key.is_empty() {
        eprintln!("error: the key is empty");
        return ExitCode::FAILURE;
    }
    println!("{}", const_hex::encode(Sha256::digest(key.as_bytes())));
    ExitCode::SUCCESS
}

/// `sluice hash-key --batch`: "NAME PLAN KEY" lines (the key is the rest of the
/// line) on stdin, one consumers-file JSON line each on stdout; a bad line stops
/// it with its number.
fn hash_keys() -> ExitCode {
    use std::io::{BufRead, Write};
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for (index, line) in std::io::stdin().lock().lines().enumerate() {
        let number = index + 1;
        let line = match line {
            Ok(line) => line,
            Err(err) => {
                eprintln!("error: stdin line {number}: {err}");
                return ExitCode::FAILURE;
            }
        };
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.trim_start().splitn(3, [' ', '\t']);
        let (Some(name), Some(plan), Some(key)) = (fields.next(), fields.next(), fields.next())
        else {
            eprintln!("error: stdin line {number}: expected \"NAME PLAN KEY\"");
            return ExitCode::FAILURE;
        };
        let key = key.trim_start();
        if key.is_empty() {
            eprintln!("error: stdin line {number}: the key is empty");
            return ExitCode::FAILURE;
        }
        let consumer = serde_json::json!({
            "name": name,
            "plan": plan,
            "key_sha256": const_hex::encode(Sha256::digest(key.as_bytes())),
        });
        if writeln!(out, "{consumer}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    match out.flush() {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// `sluice health`: GET /readyz on the admin listener, exit 0 on 200.
fn health(admin: Option<String>, path: &Path) -> ExitCode {
    let addr = match admin {
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                eprintln!("error: --admin {text:?} is not an address:port");
                return ExitCode::FAILURE;
            }
        },
        None => Config::load(path)
            .map(|config| config.admin.listen)
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9090))),
    };
    // A listener on every address is reached on loopback.
    let addr = match addr.ip().is_unspecified() {
        true if addr.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
        true => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port())),
        false => addr,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let readyz = sluice::app::readyz(addr);
    let asked = async { tokio::time::timeout(Duration::from_secs(3), readyz).await };
    match runtime.block_on(asked) {
        Ok(Ok(200)) => {
            println!("ready: {addr}");
            ExitCode::SUCCESS
        }
        Ok(Ok(status)) => {
            eprintln!("not ready: {addr}/readyz answered {status}");
            ExitCode::FAILURE
        }
        Ok(Err(err)) => {
            eprintln!("not ready: {addr}: {err}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("not ready: {addr}: no answer within 3 s");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path) -> ExitCode {
    let Some(config) = load(path) else {
        return ExitCode::FAILURE;
    };
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    // Client connections are served by sluice's own worker threads (`sluice::app::worker_threads`); this
    // runtime runs the admin API, the decision API, reloads and upkeep.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all().thread_name("sluice-admin");
    runtime.worker_threads(sluice::app::worker_threads(
        config.server.startup.worker_threads,
    ));
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = {
        let _runtime = runtime.enter();
        match shutdown_signal() {
            Ok(shutdown) => shutdown,
            Err(err) => {
                eprintln!("error: cannot install signal handlers: {err}");
                return ExitCode::FAILURE;
            }
        }
    };
    match runtime.block_on(sluice::app::run(path, config, shutdown)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM or SIGINT. The handlers are installed now, before anything listens, so a
/// signal that arrives during start-up is not fatal; the future waits for one.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

fn check(path: &Path) -> ExitCode {
    let Some(config) = load(path) else {
        return ExitCode::FAILURE;
    };
    for warning in &config.warnings {
        eprintln!("{warning}");
    }
    print!("{}", table::table(&config));
    println!(
        "{}: ok ({} routes, {} policies, {} consumers, {} upstreams)",
        path.display(),
        config.routes.len(),
        config.policies.len(),
        config.consumers.len(),
        config.upstreams.len()
    );
    ExitCode::SUCCESS
}
