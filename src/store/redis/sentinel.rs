//! Following a Sentinel-managed master: the sentinels name the master, and are asked
//! again whenever a call to it fails.
//!
//! A failover shows up as failing calls: the old master's connection is refused (it
//! died) or its writes are refused with `READONLY` (it came back as a replica, or was
//! demoted by hand). Each failure asks for the master again ([`Follow::lost`]), one
//! question at a time and at most every [`ASK_EVERY`], on the engine's thread; when
//! the sentinels name another address, calls go there from then on. Until they do
//! (the sentinels' `down-after-milliseconds` plus the election), calls fail and
//! `on_error` decides.
//!
//! The sentinels' URLs carry the sentinels' own credentials; the master is reached
//! with the first URL's database, user and password, and its TLS mode. With a
//! `ca_file`, the first URL's user and password go to every sentinel too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::IntoConnectionInfo;
use redis::TlsCertificates;
use redis::aio::ConnectionManager;
use redis::sentinel::{
    SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType,
};
use tokio::runtime::Handle;

use super::link::manager_config;

/// The shortest time between two questions to the sentinels.
pub const ASK_EVERY: Duration = Duration::from_millis(100);

/// The master the sentinels name, and the connection to it.
pub struct Follow {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The master's address and the connection to it, once known.
    current: Mutex<Option<(String, ConnectionManager)>>,
    /// True while a question to the sentinels is on its way.
    asking: AtomicBool,
    timeout: Duration,
}

impl Follow {
    /// Follows the master the sentinels at `nodes` monitor as `master`; asks nothing
    /// yet. With `ca` (PEM), TLS to the sentinels and to the master trusts that CA
    /// instead of the system's roots.
    pub fn new(
        master: &str,
        nodes: &[String],
        ca: Option<Vec<u8>>,
        timeout: Duration,
    ) -> redis::RedisResult<Arc<Follow>> {
        let infos = nodes
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let tls = infos.first().and_then(|info| match info.addr() {
            redis::ConnectionAddr::TcpTls { insecure, .. } => Some(if *insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            }),
            _ => None,
        });
        let sentinels = match (ca, tls) {
            // The builder takes one set of credentials for every sentinel (the first
            // URL's) and one for the master.
            (Some(ca), Some(mode)) => {
                let certs = || TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                };
                let addrs = infos.iter().map(|info| info.addr().clone());
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
                        .set_client_to_sentinel_tls_mode(mode)
                        .set_client_to_sentinel_certificates(certs())
                        .set_client_to_redis_tls_mode(mode)
                        .set_client_to_redis_certificates(certs());
                if let Some(first) = infos.first() {
                    let settings = first.redis_settings();
                    builder = builder
                        .set_client_to_redis_db(settings.db())
                        .set_client_to_redis_protocol(settings.protocol())
                        .set_client_to_sentinel_protocol(settings.protocol());
                    if let Some(user) = settings.username() {
                        builder = builder
                            .set_client_to_redis_username(user)
                            .set_client_to_sentinel_username(user);
                    }
                    if let Some(password) = settings.password() {
                        builder = builder
                            .set_client_to_redis_password(password)
                            .set_client_to_sentinel_password(password);
                    }
                }
                builder.build()?
            }
            // Without TLS a CA has nothing to verify.
            _ => {
                let node = infos.first().map(|info| {
                    let node = SentinelNodeConnectionInfo::default()
                        .set_redis_connection_info(info.redis_settings().clone());
                    match tls {
                        Some(mode) => node.set_tls_mode(mode),
                        None => node,
                    }
                });
                SentinelClient::build(
                    nodes.iter().map(String::as_str).collect(),
                    master,
                    node,
                    SentinelServerType::Master,
                )?
            }
        };
        Ok(Arc::new(Follow {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: Mutex::new(None),
            asking: AtomicBool::new(false),
            timeout,
        }))
    }

    /// The connection to the master, once the sentinels have named it.
    pub fn current(&self) -> Option<ConnectionManager> {
        self.current.lock().as_ref().map(|(_, c)| c.clone())
    }

    /// A call failed (or no master is known): asks the sentinels for the master on
    /// `home`, unless a question is already on its way.
    pub fn lost(self: &Arc<Follow>, home: &Handle) {
        if self.asking.swap(true, Ordering::AcqRel) {
            return;
        }
        let follow = self.clone();
        home.spawn(async move {
            follow.ask().await;
            tokio::time::sleep(ASK_EVERY).await;
            follow.asking.store(false, Ordering::Release);
        });
    }

    /// Asks the sentinels which server is the master; connects there if it moved.
    async fn ask(&self) {
        let wait = self.timeout.max(Duration::from_millis(500));
        let named = tokio::time::timeout(wait, async {
            self.sentinels.lock().await.async_get_client().await
        });
        let client = match named.await {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "redis sentinel: no master named");
                return;
            }
            Err(_) => {
                tracing::warn!("redis sentinel: no answer within {wait:?}");
                return;
            }
        };
        let address = client.get_connection_info().addr().to_string();
        if self
            .current
            .lock()
            .as_ref()
            .is_some_and(|(at, _)| *at == address)
        {
            return;
        }
        match ConnectionManager::new_lazy_with_config(client, manager_config(self.timeout)) {
            Ok(connection) => {
                tracing::info!(master = %address, "redis sentinel: following the master");
                *self.current.lock() = Some((address, connection));
            }
            Err(err) => tracing::warn!(error = %err, "redis sentinel: cannot use the master"),
        }
    }
}
