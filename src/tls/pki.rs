//! Certificates and keys from files: a PEM certificate chain with its private key, a
//! CA bundle as trust anchors, and the system's trust anchors.
//!
//! Both config validation (every `cert`, `key` and `ca_file` is loaded when the
//! config is, so a bad file is a config error with its line) and the runtime (the
//! TLS listener's certificates, the connectors of https upstreams) load through
//! here, so a file the config accepted loads the same way when it is used. This
//! module depends on nothing else in the crate; it does not watch files, choose
//! certificates by SNI, or build rustls client or server configs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::crypto::ring;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// Why a certificate, key or CA file did not load. The message names the file.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The certificate file could not be opened or read.
    #[error("cannot read certificate {}: {source}", .path.display())]
    ReadCertificate {
        /// The certificate file.
        path: PathBuf,
        /// Why it could not be read.
        source: pem::Error,
    },
    /// A certificate or CA file holds a PEM section that does not parse.
    #[error("bad certificate PEM in {}: {source}", .path.display())]
    CertificatePem {
        /// The certificate or CA file.
        path: PathBuf,
        /// What the PEM parser found wrong.
        source: pem::Error,
    },
    /// The certificate file holds no PEM certificate at all.
    #[error("no certificate in {}", .path.display())]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// The key file could not be read, or holds no PEM private key.
    #[error("cannot read a private key from {}: {source}", .path.display())]
    ReadKey {
        /// The key file.
        path: PathBuf,
        /// Why no key was read from it.
        source: pem::Error,
    },
    /// The private key is of a kind or algorithm rustls cannot sign with.
    #[error("unusable private key in {}: {source}", .path.display())]
    UnusableKey {
        /// The key file.
        path: PathBuf,
        /// Why rustls refused the key.
        source: rustls::Error,
    },
    /// The private key is not the key of the chain's first (leaf) certificate.
    #[error(
        "the key in {} does not match the certificate in {}: {source}",
        .key.display(),
        .cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// How rustls found the mismatch.
        source: rustls::Error,
    },
    /// The CA file (`ca_file`) could not be opened or read.
    #[error("cannot read {}: {source}", .path.display())]
    ReadCa {
        /// The CA file.
        path: PathBuf,
        /// Why it could not be read.
        source: pem::Error,
    },
    /// The CA file holds no certificate usable as a trust anchor.
    #[error("no usable CA certificate in {}", .path.display())]
    NoCa {
        /// The CA file.
        path: PathBuf,
    },
}

/// Loads a PEM certificate chain and its private key, checking that they match.
pub fn load_pair(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, PkiError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|source| PkiError::ReadCertificate {
            path: cert.to_path_buf(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| PkiError::CertificatePem {
            path: cert.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(PkiError::NoCertificate {
            path: cert.to_path_buf(),
        });
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|source| PkiError::ReadKey {
        path: key.to_path_buf(),
        source,
    })?;
    let signing = ring::default_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|source| PkiError::UnusableKey {
            path: key.to_path_buf(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|source| PkiError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            source,
        })?;
    Ok(Arc::new(certified))
}

/// The trust anchors in a PEM file (at least one).
pub fn roots_from(path: &Path) -> Result<RootCertStore, PkiError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|source| PkiError::ReadCa {
            path: path.to_path_buf(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| PkiError::CertificatePem {
            path: path.to_path_buf(),
            source,
        })?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(PkiError::NoCa {
            path: path.to_path_buf(),
        });
    }
    Ok(roots)
}

/// The system's trust anchors, read once (an unreadable bundle leaves none, and every
/// connection verified against them then fails, which is logged).
pub fn system_roots() -> Arc<RootCertStore> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name` and its key, as PEM files in `dir`.
    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec![format!("{name}.example")]).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    #[test]
    fn a_pair_loads_and_its_certificate_is_a_trust_anchor() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let certified = load_pair(&cert, &key).unwrap();
        assert_eq!(certified.cert.len(), 1);
        assert_eq!(roots_from(&cert).unwrap().len(), 1);
    }

    #[test]
    fn each_failure_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_key) = pair(dir.path(), "a");
        let (b, _) = pair(dir.path(), "b");
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();

        let err = load_pair(&missing, &a_key).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read certificate ") && err.contains("missing.pem"),
            "{err}"
        );
        let err = load_pair(&empty, &a_key).unwrap_err().to_string();
        assert!(
            err.starts_with("no certificate in ") && err.contains("empty.pem"),
            "{err}"
        );
        let err = load_pair(&a, &missing).unwrap_err().to_string();
        assert!(err.starts_with("cannot read a private key from "), "{err}");
        let err = load_pair(&b, &a_key).unwrap_err().to_string();
        assert!(
            err.contains("a-key.pem does not match the certificate in ") && err.contains("b.pem"),
            "{err}"
        );
        let err = roots_from(&empty).unwrap_err().to_string();
        assert!(err.starts_with("no usable CA certificate in "), "{err}");
        let err = roots_from(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read ") && err.contains("missing.pem"),
            "{err}"
        );
        assert!(load_pair(&a, &a_key).is_ok());
    }
}
