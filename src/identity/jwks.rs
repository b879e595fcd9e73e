//! A JWKS URL: the identity provider's key set, fetched over https and kept fresh.
//!
//! [`RemoteJwks`] holds the last key set that was fetched and parsed; a fetch that
//! fails (the provider down, an invalid answer) keeps it. A task fetches the set at
//! start, every `refresh`, and when a token names a `kid` the set lacks, but never
//! more than once per 30 s: tokens with random `kid`s cannot make sluice hammer the
//! provider. Fetches are counted in `sluice_jwks_refreshes_total{result}`, and the
//! state is shown in `/readyz`. A reload that keeps the URL keeps the set and its
//! task. This module does not verify tokens ([`super::jwt`] does).
//!
//! A key the provider drops is revoked by the fetch that finds it gone: each key of
//! the set carries a [`KeyLife`] that every token it verified holds, and that fetch
//! ends it, so no cached verification outlives its key (the verifier checks the
//! life on every use of a cached token). A key is the same key from fetch to fetch
//! while its JWK is unchanged; one that comes back later is a new key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use parking_lot::Mutex;
use prometheus::IntCounterVec;
use tokio::time::Instant;

use crate::config::{JwksConfig, JwtKey};
use crate::http::client;

/// The largest key set read: real ones are a few KiB.
const MAX_BYTES: usize = 1 << 20;
/// The longest a fetch may take, connecting included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A provider's key set and its fetch state.
#[derive(Debug)]
pub(crate) struct RemoteJwks {
    config: JwksConfig,
    keys: ArcSwap<Vec<RemoteKey>>,
    state: Mutex<FetchState>,
    wake: tokio::sync::Notify,
    refreshes: IntCounterVec,
    started: std::sync::atomic::AtomicBool,
}

/// What `/readyz` shows of a key set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct FetchState {
    /// Keys in the set in force.
    pub keys: usize,
    /// Successful fetches so far, and failed ones.
    pub ok: u64,
    pub errors: u64,
    /// Why the last fetch failed, if it did.
    pub last_error: Option<String>,
    /// Seconds since the last successful fetch.
    pub age_s: Option<u64>,
    #[serde(skip)]
    last_ok: Option<Instant>,
}

/// A key of the fetched set: the key, the JWK it was read from (what makes it the
/// same key in the next fetch), and its life.
#[derive(Debug)]
pub(crate) struct RemoteKey {
    pub(crate) key: JwtKey,
    jwk: Jwk,
    pub(crate) life: Arc<KeyLife>,
}

/// Whether a fetched key is still in its provider's set: ended by the fetch that
/// finds it gone. Every token the key verified holds its life, so that fetch
/// revokes them all at once.
#[derive(Debug, Default)]
pub(crate) struct KeyLife {
    ended: AtomicBool,
}

impl KeyLife {
    /// Whether the key has left its set.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

impl RemoteJwks {
    pub(crate) fn new(config: JwksConfig, refreshes: IntCounterVec) -> Arc<RemoteJwks> {
        Arc::new(RemoteJwks {
            config,
            keys: ArcSwap::from_pointee(Vec::new()),
            state: Mutex::new(FetchState::default()),
            wake: tokio::sync::Notify::new(),
            refreshes,
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The URL it fetches, and how.
    pub(crate) fn config(&self) -> &JwksConfig {
        &self.config
    }

    /// The key set in force.
    pub(crate) fn keys(&self) -> Arc<Vec<RemoteKey>> {
        self.keys.load_full()
    }

    /// Asks for a fetch soon (a token named a `kid` the set lacks); the task keeps
    /// fetches at least 30 s apart.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// The fetch state, for `/readyz`.
    pub(crate) fn state(&self) -> FetchState {
        let mut state = self.state.lock().clone();
        state.age_s = state.last_ok.map(|at| at.elapsed().as_secs());
        state
    }

    /// Starts the fetch task on the current runtime; it ends when the last holder
    /// of the set lets it go.
    pub(crate) fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        runtime.spawn(fetch_loop(weak));
    }

    async fn fetch_once(&self) {
        let result = tokio::time::timeout(FETCH_TIMEOUT, fetch(&self.config))
            .await
            .unwrap_or_else(|_| Err("timed out".to_string()));
        let mut state = self.state.lock();
        match result {
            Ok(keys) => {
                self.refreshes.with_label_values(&["ok"]).inc();
                state.ok += 1;
                state.keys = keys.len();
                state.last_error = None;
                state.last_ok = Some(Instant::now());
                self.install(keys);
            }
            Err(reason) => {
                self.refreshes.with_label_values(&["error"]).inc();
                tracing::warn!(url = %self.config.url, error = %reason, "JWKS fetch failed; keeping the last key set");
                state.errors += 1;
                state.last_error = Some(reason);
            }
        }
    }
}

impl RemoteJwks {
    /// Puts the fetched `keys` in force: a key whose JWK the set in force holds too
    /// keeps its life; then every key of the old set that the new one lacks is
    /// revoked, with every verification it made.
    fn install(&self, keys: Vec<(JwtKey, Jwk)>) {
        let old = self.keys.load_full();
        let new: Vec<RemoteKey> = keys
            .into_iter()
            .map(|(key, jwk)| {
                let kept = old.iter().find(|k| k.jwk == jwk);
                let life = kept.map_or_else(Arc::default, |k| Arc::clone(&k.life));
                RemoteKey { key, jwk, life }
            })
            .collect();
        let gone: Vec<&RemoteKey> = (old.iter())
            .filter(|k| !new.iter().any(|n| Arc::ptr_eq(&n.life, &k.life)))
            .collect();
        // The new set first: a token found revoked is verified again against it.
        self.keys.store(Arc::new(new));
        for key in gone {
            key.life.end();
            let kid = key.key.kid.as_deref().unwrap_or("(none)");
            tracing::info!(url = %self.config.url, kid, "a key left the JWKS; the tokens it verified are refused from now on");
        }
    }
}

async fn fetch_loop(weak: Weak<RemoteJwks>) {
    loop {
        let Some(remote) = weak.upgrade() else { return };
        remote.fetch_once().await;
        let next = Instant::now() + crate::config::JWKS_MIN_REFRESH;
        let refresh = remote.config.refresh;
        // Hold only a weak reference while waiting, so a dropped set ends the task.
        let woken = {
            let wait = async {
                tokio::select! {
                    _ = tokio::time::sleep(refresh) => {}
                    _ = remote.wake.notified() => {}
                }
            };
            tokio::time::timeout(refresh, wait).await.is_ok()
        };
        drop(remote);
        if woken {
            tokio::time::sleep_until(next).await;
        }
    }
}

/// GETs the key set over https and parses it: each usable key with its JWK.
async fn fetch(config: &JwksConfig) -> Result<Vec<(JwtKey, Jwk)>, String> {
    let asked = client::Get {
        accept: Some("application/json"),
        ca_file: config.ca_file.as_deref(),
    };
    let response = client::get(&config.url, asked)
        .await
        .map_err(|err| err.to_string())?;
    if !response.status().is_success() {
        return Err(format!("answered {}", response.status()));
    }
    let body = client::body(response, MAX_BYTES)
        .await
        .map_err(|err| err.to_string())?;
    let set: JwkSet =
        serde_json::from_slice(&body).map_err(|err| format!("not a JWK set: {err}"))?;
    let keys: Vec<(JwtKey, Jwk)> = set
        .keys
        .into_iter()
        // A key for another use (an encryption algorithm) verifies nothing.
        .filter_map(|jwk| Some((JwtKey::from_jwk(&jwk).ok()?, jwk)))
        .collect();
    if keys.is_empty() {
        return Err("the set holds no key sluice can use".to_string());
    }
    Ok(keys)
}
