//! The worker model: client connections are served by `N` worker threads, each with
//! its own current-thread tokio runtime and its own `SO_REUSEPORT` socket on every
//! client-facing address, so the kernel spreads new connections over the workers and
//! a connection lives and dies on one thread (the nginx and pingora model: no wake-ups
//! across threads, no work stealing, no locks in the scheduler). The admin API, config
//! reloads and upkeep run on the process's main runtime.
//!
//! A second process on the same port would silently share it through `SO_REUSEPORT`;
//! [`bind_group`] first checks that nobody else listens there, so starting sluice
//! twice still fails with "address in use".

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

/// Connections the kernel may hold for a socket before sluice accepts them. A burst
/// of thousands of clients connecting at once (a flash sale) overflows a short
/// backlog, and each dropped SYN costs its client a one-second retransmission; the
/// kernel caps it at `net.core.somaxconn`.
pub(crate) const BACKLOG: i32 = 4_096;

/// What each worker thread runs once a second, if the binary gave one: its
/// allocator's collection, so memory that connections freed when they went idle goes
/// back to the system. mimalloc returns freed pages only after a delay, and only when
/// their segment is touched again: a worker whose connections all went idle would
/// otherwise keep their hyper buffers resident (`docs/performance.md`, "Idle
/// connections").
static UPKEEP: OnceLock<fn()> = OnceLock::new();

/// How often a worker runs [`UPKEEP`].
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Sets what every worker started from now on runs once a second (the first call
/// wins).
pub fn set_upkeep(upkeep: fn()) {
    let _ = UPKEEP.set(upkeep);
}

/// One worker's sockets: one per plain and one per TLS address, in config order.
#[derive(Debug, Default)]
pub struct WorkerSockets {
    /// One socket per `[server] listen` address, served as plain HTTP.
    pub plain: Vec<std::net::TcpListener>,
    /// One socket per `[server.tls] listen` address, served with TLS.
    pub tls: Vec<std::net::TcpListener>,
}

/// How many workers `worker_threads` asks for: 0 means one per core.
pub fn count(worker_threads: usize) -> usize {
    match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Binds `workers` sockets to `addr` in one `SO_REUSEPORT` group. Fails like a plain
/// bind when another socket already listens there (even one of the same user with
/// `SO_REUSEPORT` set). Port 0 picks one free port for the whole group.
pub(crate) fn bind_group(
    addr: SocketAddr,
    workers: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut addr = addr;
    if addr.port() != 0 {
        // A socket without SO_REUSEPORT cannot join anyone's group: if it binds, the
        // port is free. It is closed again before the group binds.
        drop(socket(addr, false)?);
    }
    let mut group = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let listener = socket(addr, true)?;
        addr = listener.local_addr()?;
        group.push(listener);
    }
    Ok(group)
}

fn socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A worker's end: resolves when its thread has served its last connection.
pub(crate) type Finished = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A task on the caller's runtime as a [`Finished`].
pub(crate) fn joined(task: tokio::task::JoinHandle<()>) -> Finished {
    Box::pin(async move {
        let _ = task.await;
    })
}

/// Starts a worker thread named `name` that runs `serve` on its own current-thread
/// runtime until it returns.
pub(crate) fn spawn<F, Fut>(name: String, serve: F) -> std::io::Result<Finished>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (done, finished) = oneshot::channel::<()>();
    std::thread::Builder::new().name(name).spawn(move || {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(async move {
                if let Some(&upkeep) = UPKEEP.get() {
                    // Ends with the runtime, when `serve` returns.
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval(UPKEEP_EVERY);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        loop {
                            tick.tick().await;
                            upkeep();
                        }
                    });
                }
                serve().await
            }),
            Err(err) => tracing::error!(error = %err, "cannot start a worker's runtime"),
        }
        let _ = done.send(());
    })?;
    Ok(Box::pin(async move {
        let _ = finished.await;
    }))
}
