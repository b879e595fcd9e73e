//! TLS to https upstreams: rustls with certificate verification and SNI, trusting
//! the system's roots, or only the CA bundle of the upstream's `ca_file`.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_rustls::TlsConnector;

/// The trust anchors in a PEM file (at least one).
pub fn roots_from(path: &Path) -> Result<RootCertStore, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|err| format!("bad certificate PEM in {}: {err}", path.display()))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("no usable CA certificate in {}", path.display()));
    }
    Ok(roots)
}

/// The system's trust anchors, read once (an unreadable bundle leaves none, and every
/// https upstream without `ca_file` then fails verification, which is logged).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for err in &found.errors {
                tracing::warn!(error = %err, "reading the system's CA certificates");
            }
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            Arc::new(roots)
        })
        .clone()
}

/// A connector for https targets: HTTP/1.1 by ALPN, verifying the target's name.
pub fn connector(ca_file: Option<&Path>) -> TlsConnector {
    let roots = match ca_file.map(roots_from) {
        Some(Ok(roots)) => Arc::new(roots),
        Some(Err(reason)) => {
            // The config compiler checked the file; it changed since.
            tracing::error!(error = %reason, "upstream ca_file; trusting no certificate");
            Arc::new(RootCertStore::empty())
        }
        None => system_roots(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}
