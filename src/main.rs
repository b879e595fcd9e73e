//! The `sluice` command: `run`, `check` and `hash-key`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use sha2::{Digest, Sha256};
use sluice::config::{Config, PlanRule};
use sluice::route::Target;

#[derive(Parser)]
#[command(name = "sluice", version, about = "A rate-limiting API gateway")]
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
    /// Print the sha256 of an API key, for key_sha256
    HashKey { key: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(sluice::config::DEFAULT_PATH));
    match cli.command {
        Command::HashKey { key } => {
            println!("{}", hex::encode(Sha256::digest(key.as_bytes())));
            ExitCode::SUCCESS
        }
        Command::Check => check(&path),
        Command::Run => {
            init_logging(cli.log_format);
            run(&path)
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
            for diagnostic in &err.diagnostics {
                eprintln!("{diagnostic}");
            }
            None
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
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if config.server.worker_threads > 0 {
        runtime.worker_threads(config.server.worker_threads);
    }
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
    match runtime.block_on(sluice::run(path, config, shutdown)) {
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
    print!("{}", table(&config));
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

/// The route/policy table `sluice check` prints.
fn table(config: &Config) -> String {
    let mut rows = vec![[
        "ROUTE".to_string(),
        "MATCH".to_string(),
        "TARGET".to_string(),
        "POLICY".to_string(),
        "LIMITS".to_string(),
    ]];
    for route in &config.routes {
        let methods = route
            .methods
            .as_ref()
            .map(|m| m.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "*".to_string());
        let host = route.host.as_deref().unwrap_or("");
        let target = match &route.target {
            Target::Upstream(index) => format!("upstream {}", config.upstreams[*index].name),
            Target::Respond { status, .. } => format!("respond {}", status.as_u16()),
        };
        let (policy, limits) = match route.policy {
            None => ("-".to_string(), "not limited".to_string()),
            Some(index) => {
                let policy = &config.policies[index];
                let mut parts = Vec::new();
                for (plan, rule) in policy.plans.iter().enumerate() {
                    let Some(rule) = rule else { continue };
                    let text = match rule {
                        PlanRule::Deny => "deny".to_string(),
                        PlanRule::Limits(q) if q.is_empty() => "unlimited".to_string(),
                        PlanRule::Limits(quotas) => quotas
                            .iter()
                            .map(|q| format!("{}/{}", q.limit, q.window.name()))
                            .collect::<Vec<_>>()
                            .join(" "),
                    };
                    parts.push(format!("{}: {text}", config.plans[plan]));
                }
                if !policy.total.is_empty() {
                    let total = policy
                        .total
                        .iter()
                        .map(|q| format!("{}/{}", q.limit, q.window.name()))
                        .collect::<Vec<_>>()
                        .join(" ");
                    parts.push(format!("total: {total}"));
                }
                (policy.name.clone(), parts.join("; "))
            }
        };
        rows.push([
            route.name.clone(),
            format!("{methods} {host}{}", route.path_prefix),
            target,
            policy,
            limits,
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|col| rows.iter().map(|r| r[col].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
