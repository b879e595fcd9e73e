//! Putting listeners to work: the client-facing ones on the caller's runtime or on
//! worker threads (one current-thread runtime each, sharing each address's
//! connection cap), and the admin listener; each until the stop signal, then
//! drained within its `drain_timeout`.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, broadcast};
use tokio_rustls::TlsAcceptor;

use crate::admin::Admin;
use crate::config::ServerStartup;
use crate::decision::DecisionListener;
use crate::gateway::Gateway;
use crate::server::{self, workers};

/// What every client-facing listener is served with.
pub(super) struct Serving<'a> {
    /// Answers every request.
    pub gateway: &'a Arc<Gateway>,
    /// `[server]`'s start-up settings.
    pub settings: &'a ServerStartup,
    /// The TLS listeners' handshake, with `[server.tls]`'s certificates.
    pub acceptor: Option<TlsAcceptor>,
    /// Fires when the gateway stops.
    pub stop: &'a broadcast::Sender<()>,
}

impl Serving<'_> {
    /// Serves `plain` and `tls` listeners on the caller's runtime, each with a
    /// connection cap of its own.
    pub(super) fn here(
        &self,
        plain: Vec<TcpListener>,
        tls: Vec<TcpListener>,
    ) -> Vec<workers::Finished> {
        let plain = plain.into_iter().map(|l| (l, None));
        let secure = tls.into_iter().map(|l| (l, self.acceptor.clone()));
        plain
            .chain(secure)
            .map(|(listener, tls)| {
                let listening = server::Listening {
                    listener,
                    handler: self.gateway.clone(),
                    settings: self.settings.clone(),
                    slots: Arc::new(Semaphore::new(self.settings.max_connections)),
                    tls,
                };
                let serving = serve_until(listening, self.stop.subscribe());
                workers::joined(tokio::spawn(serving))
            })
            .collect()
    }

    /// Serves each worker's sockets on a thread of its own; each address's
    /// connection cap is shared by the workers serving it.
    pub(super) fn on_workers(
        &self,
        workers: Vec<workers::WorkerSockets>,
    ) -> anyhow::Result<Vec<workers::Finished>> {
        let first = workers.first();
        let slots: Vec<Arc<Semaphore>> = first
            .iter()
            .flat_map(|w| w.plain.iter().chain(&w.tls))
            .map(|_| Arc::new(Semaphore::new(self.settings.max_connections)))
            .collect();
        let mut finished = Vec::new();
        for (index, worker) in workers.into_iter().enumerate() {
            let plain = worker.plain.into_iter().map(|l| (l, None));
            let secure = worker.tls.into_iter().map(|l| (l, self.acceptor.clone()));
            let sockets: Vec<_> = plain
                .chain(secure)
                .zip(&slots)
                .map(|((socket, tls), slots)| (socket, tls, slots.clone(), self.stop.subscribe()))
                .collect();
            let (gateway, settings) = (self.gateway.clone(), self.settings.clone());
            let name = format!("sluice-worker-{index}");
            let worker = workers::spawn(name, move || serve_worker(sockets, gateway, settings))?;
            finished.push(worker);
        }
        Ok(finished)
    }

    /// Serves the admin API on `listener`; its connections get a second to finish
    /// when the gateway stops.
    pub(super) fn admin(&self, listener: TcpListener, admin: Arc<Admin>) -> workers::Finished {
        let settings = ServerStartup {
            drain_timeout: Duration::from_secs(1),
            ..self.settings.clone()
        };
        let listening = server::Listening {
            listener,
            handler: admin,
            slots: Arc::new(Semaphore::new(settings.max_connections)),
            settings,
            tls: None,
        };
        let serving = serve_until(listening, self.stop.subscribe());
        workers::joined(tokio::spawn(serving))
    }
}

impl Serving<'_> {
    /// Serves the decision listener on `listener` with `[decision]`'s own connection
    /// limits, timeouts and TLS handshake (`tls`).
    pub(super) fn decision(
        &self,
        listener: TcpListener,
        settings: ServerStartup,
        tls: Option<TlsAcceptor>,
    ) -> workers::Finished {
        let listening = server::Listening {
            listener,
            handler: Arc::new(DecisionListener::new(self.gateway.clone())),
            slots: Arc::new(Semaphore::new(settings.max_connections)),
            settings,
            tls,
        };
        let serving = serve_until(listening, self.stop.subscribe());
        workers::joined(tokio::spawn(serving))
    }
}

/// One worker's sockets: each with its TLS handshake (if it is a TLS socket), its
/// address's connection cap and the stop signal.
type WorkerListeners = Vec<(
    std::net::TcpListener,
    Option<TlsAcceptor>,
    Arc<Semaphore>,
    broadcast::Receiver<()>,
)>;

/// A worker thread's life: serves its sockets until each is stopped and drained.
async fn serve_worker(sockets: WorkerListeners, gateway: Arc<Gateway>, settings: ServerStartup) {
    let mut listeners = tokio::task::JoinSet::new();
    for (socket, tls, slots, stopped) in sockets {
        match TcpListener::from_std(socket) {
            Ok(listener) => {
                let listening = server::Listening {
                    listener,
                    handler: gateway.clone(),
                    settings: settings.clone(),
                    slots,
                    tls,
                };
                listeners.spawn(serve_until(listening, stopped));
            }
            Err(err) => tracing::error!(error = %err, "a worker cannot use its socket"),
        }
    }
    listeners.join_all().await;
}

/// Serves `listening` until `stopped` fires, then lets its connections finish
/// within its `drain_timeout`.
async fn serve_until<H: server::Handler>(
    listening: server::Listening<H>,
    mut stopped: broadcast::Receiver<()>,
) {
    let shutdown = async move {
        let _ = stopped.recv().await;
    };
    server::serve(listening, shutdown).await;
}
