//! `[server.tls]`: the TLS listener's addresses, certificates and versions, every
//! certificate and key loaded at compile time (`pki`).

use std::path::Path;

use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::values::socket_addr;
use super::{TlsConfig, raw};
use crate::tls::pki;

const DEFAULT_TLS_LISTEN: &str = "0.0.0.0:8443";

/// `[server.tls]` (or `[decision.tls]`: `section` names it in diagnostics): paths
/// relative to the config file; every certificate and key is loaded now, so a
/// missing file, a bad PEM or a key that does not match its certificate is a config
/// error with the reason, never a listener that fails later.
pub(super) fn compile_tls(
    d: &mut Diagnostics,
    file: &Path,
    raw: raw::Tls,
    section: &str,
) -> TlsConfig {
    let dir = file.parent().unwrap_or(Path::new(""));
    let listen = match raw.listen {
        None => vec![DEFAULT_TLS_LISTEN.parse().expect("a valid address")],
        Some(listen) => {
            let span = listen.span();
            listen
                .into_inner()
                .into_vec()
                .into_iter()
                .filter_map(|a| {
                    socket_addr(
                        d,
                        &format!("{section}.listen"),
                        &Spanned::new(span.clone(), a),
                    )
                })
                .collect()
        }
    };
    let pair = |d: &mut Diagnostics, key: &str, span, cert: &str, key_file: &str| {
        let (cert, key_path) = (dir.join(cert), dir.join(key_file));
        if let Err(reason) = pki::load_pair(&cert, &key_path) {
            d.error(Some(span), key, reason.to_string());
        }
        (cert, key_path)
    };
    let span = raw.cert.span();
    let (cert, key) = pair(
        d,
        &format!("{section}.cert"),
        span,
        raw.cert.get_ref(),
        raw.key.get_ref(),
    );
    let sni = raw
        .sni
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let key = format!("{section}.sni[{i}]");
            let p = entry.get_ref();
            pair(d, &key, entry.span(), &p.cert, &p.key)
        })
        .collect();
    let tls13_only = match raw
        .min_version
        .as_ref()
        .map(|v| (v.span(), v.get_ref().as_str()))
    {
        None | Some((_, "1.2")) => false,
        Some((_, "1.3")) => true,
        Some((span, other)) => {
            d.error(
                Some(span),
                &format!("{section}.min_version"),
                format!("\"{other}\": must be \"1.2\" or \"1.3\" (older versions are not offered)"),
            );
            false
        }
    };
    TlsConfig {
        listen,
        cert,
        key,
        sni,
        tls13_only,
    }
}
