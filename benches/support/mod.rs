//! What the process-level benchmarks (`flash_sale`, `rapid_reset`) share: a gateway
//! process stopped when dropped, free ports, waiting for a listener, percentiles and
//! numeric settings from the environment.

use std::net::SocketAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// A gateway process, stopped when dropped.
pub(crate) struct Gateway(pub Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `addr` accepts connections (20 s at most).
pub(crate) async fn wait_ready(addr: SocketAddr) {
    let started = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{addr} never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `p` quantile of `sorted`, in milliseconds (NaN when empty).
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1_000.0
}

/// The number in environment variable `name`, or `default`.
pub(crate) fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
