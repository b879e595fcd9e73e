//! TLS termination: the certificates of `[server.tls]`, chosen by SNI, re-read when
//! their files change, and the rustls server config the TLS listener accepts with.
//!
//! rustls with the ring provider, TLS 1.2 and 1.3 (or 1.3 only), ALPN `h2` then
//! `http/1.1`. The default certificate answers clients whose SNI name no `sni`
//! certificate covers (and clients that send no SNI). cert-manager and ACME clients
//! rotate certificates by replacing the files: when the file watcher says they may
//! have changed (`crate::app::watch`, which also polls every [`CHECK_EVERY`]), the
//! files' sizes and modification times are compared, and on a change the whole set is
//! loaded again; a set that does not load (a missing file, a key that does not match
//! its certificate, half-written PEM) is logged with the reason and the old set keeps
//! serving. The files are read by [`super::pki`], as config validation reads them.
//! This module watches nothing itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::crypto::ring;
use rustls::pki_types::ServerName;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::tls::pki::{PkiError, load_pair};

/// `[server.tls]`: a TLS listener and its certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// `listen` (default `0.0.0.0:8443`): the addresses TLS is served on.
    pub listen: Vec<SocketAddr>,
    /// The default certificate chain and key (PEM), for clients whose SNI name no
    /// `sni` certificate covers.
    pub cert: PathBuf,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// More certificates, each chosen for the names it covers.
    pub sni: Vec<(PathBuf, PathBuf)>,
    /// TLS 1.3 only, instead of 1.2 and 1.3.
    pub tls13_only: bool,
}

/// How often certificate files are looked at when no change event comes.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// One loaded set: the default certificate and the SNI ones.
#[derive(Debug)]
struct Set {
    default: Arc<CertifiedKey>,
    /// Each with its certificate parsed once, to match SNI names against.
    sni: Vec<Arc<CertifiedKey>>,
}

impl Set {
    fn load(config: &TlsConfig) -> Result<Set, PkiError> {
        Ok(Set {
            default: load_pair(&config.cert, &config.key)?,
            sni: config
                .sni
                .iter()
                .map(|(cert, key)| load_pair(cert, key))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The first SNI certificate valid for `name`, else the default one.
    fn for_name(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let found = name
            .and_then(|name| ServerName::try_from(name).ok())
            .and_then(|name| {
                self.sni.iter().find(|certified| {
                    certified.end_entity_cert().is_ok_and(|der| {
                        webpki::EndEntityCert::try_from(der)
                            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
                    })
                })
            });
        found.unwrap_or(&self.default).clone()
    }
}

/// The certificates in force, swapped whole when their files change.
#[derive(Debug)]
pub struct Certificates {
    config: TlsConfig,
    set: ArcSwap<Set>,
    /// (path, size, modified) of every file, as last loaded.
    stamps: parking_lot::Mutex<Vec<Stamp>>,
}

type Stamp = (PathBuf, u64, Option<SystemTime>);

impl Certificates {
    /// Loads every certificate of `config`.
    pub fn load(config: &TlsConfig) -> Result<Arc<Certificates>, PkiError> {
        let set = Set::load(config)?;
        Ok(Arc::new(Certificates {
            stamps: parking_lot::Mutex::new(stamps(config)),
            config: config.clone(),
            set: ArcSwap::from_pointee(set),
        }))
    }

    /// The rustls server config: these certificates, ALPN `h2` and `http/1.1`.
    pub fn server_config(self: &Arc<Certificates>) -> Arc<rustls::ServerConfig> {
        let versions: &[&rustls::SupportedProtocolVersion] = if self.config.tls13_only {
            &[&rustls::version::TLS13]
        } else {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        };
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
                .with_protocol_versions(versions)
                .expect("ring supports TLS 1.2 and 1.3")
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// Loads the files again if any changed since the last load. `Ok(false)`: nothing
    /// changed; `Err`: they changed but do not load, and the old set stays.
    pub fn reload_if_changed(&self) -> Result<bool, PkiError> {
        let now = stamps(&self.config);
        let mut last = self.stamps.lock();
        if *last == now {
            return Ok(false);
        }
        // Remembered even when the new files fail: the error is logged once per
        // change, not every few seconds.
        *last = now;
        let set = Set::load(&self.config)?;
        self.set.store(Arc::new(set));
        Ok(true)
    }

    /// The certificate and key files.
    pub fn files(&self) -> Vec<PathBuf> {
        stamps(&self.config)
            .into_iter()
            .map(|(path, ..)| path)
            .collect()
    }

    /// [`Certificates::reload_if_changed`], its outcome logged and returned:
    /// `None` when nothing changed, else whether the new files now serve.
    pub fn check(&self) -> Option<bool> {
        match self.reload_if_changed() {
            Ok(false) => None,
            Ok(true) => {
                tracing::info!("TLS certificates reloaded");
                Some(true)
            }
            Err(reason) => {
                tracing::error!(
                    error = %reason,
                    "TLS certificates changed but do not load; the previous ones keep serving"
                );
                Some(false)
            }
        }
    }
}

fn stamps(config: &TlsConfig) -> Vec<Stamp> {
    std::iter::once((&config.cert, &config.key))
        .chain(config.sni.iter().map(|(c, k)| (c, k)))
        .flat_map(|(cert, key)| [cert, key])
        .map(|path| {
            let meta = std::fs::metadata(path).ok();
            (
                path.clone(),
                meta.as_ref().map_or(0, |m| m.len()),
                meta.and_then(|m| m.modified().ok()),
            )
        })
        .collect()
}

#[derive(Debug)]
struct Resolver(Arc<Certificates>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.set.load().for_name(hello.server_name()))
    }
}
