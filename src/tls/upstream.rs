//! TLS to https upstreams: rustls with certificate verification and SNI, trusting
//! the system's roots, or only the CA bundle of the upstream's `ca_file` (both read
//! by [`crate::tls::pki`]).

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use tokio_rustls::TlsConnector;

use crate::tls::pki;

/// A connector for https targets offering the `alpn` protocols (`http/1.1`, `h2`),
/// verifying the target's name.
pub(crate) fn connector(ca_file: Option<&Path>, alpn: &[&[u8]]) -> TlsConnector {
    let roots = match ca_file.map(pki::roots_from) {
        Some(Ok(roots)) => Arc::new(roots),
        Some(Err(reason)) => {
            // The config compiler checked the file; it changed since.
            tracing::error!(error = %reason, "upstream ca_file; trusting no certificate");
            Arc::new(RootCertStore::empty())
        }
        None => pki::system_roots(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}
