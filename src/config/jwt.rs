//! `[identity.jwt]`: bearer JWTs that name their caller.
//!
//! Keys are read (and checked) as the config is: PEM public keys (RSA, EC, Ed25519),
//! JWK or JWK-set files, or an HMAC `secret`. A key file that does not load is a
//! diagnostic like any other, and a reload re-reads the files. A `jwks_url` is
//! checked here (https, its `ca_file` loads); [`crate::identity::jwks`] fetches it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::raw;
use super::values::duration_of;

/// `[identity.jwt]`, its keys loaded.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// Every key that may have signed a token (`keys` files, `secret`).
    pub keys: Vec<JwtKey>,
    /// The `keys` files, re-read when they change.
    pub files: Vec<PathBuf>,
    /// `jwks_url`, `refresh` and `ca_file`: a key set fetched over https.
    pub jwks: Option<JwksConfig>,
    /// `algorithms`: those accepted; empty, every algorithm of the keys' families.
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    /// `issuer`: accepted `iss` values; empty, not checked.
    pub issuer: Vec<String>,
    /// `audience`: a token's `aud` must hold one of these; empty, not checked.
    pub audience: Vec<String>,
    /// `leeway` (default 30 s): clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// `consumer_claim` (default `sub`): names the caller.
    pub consumer_claim: String,
    /// `plan_claim`: its value is the caller's plan.
    pub plan_claim: Option<String>,
    /// `default_plan` (default `registered`): the plan when `plan_claim` names none.
    pub default_plan: Option<String>,
    /// `forward` (default false): a verified token goes upstream in its
    /// `Authorization` header, for an upstream that reads its claims; else it is
    /// removed, as an API key is.
    pub forward: bool,
}

/// `jwks_url`: the identity provider's key set, fetched over https.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksConfig {
    /// `jwks_url`, an `https://` URL.
    pub url: http::Uri,
    /// `refresh` (default 10 min, at least 30 s): how often it is fetched again.
    pub refresh: Duration,
    /// `ca_file`: trust only this CA bundle (default: the system's roots).
    pub ca_file: Option<PathBuf>,
}

/// One verification key, with the `kid` a JWK gave it.
#[derive(Debug, Clone)]
pub struct JwtKey {
    /// The JWK's `kid`; `None` for PEM keys and the secret (tried for any token).
    pub kid: Option<String>,
    /// The key, of the family it was loaded as.
    pub key: jsonwebtoken::DecodingKey,
    /// The JWK's `alg`: the one algorithm the key verifies (`None`: any of its
    /// family's).
    pub alg: Option<jsonwebtoken::Algorithm>,
}

impl JwtKey {
    /// The key a JWK holds, with its `kid` and `alg`; the error says why a JWK
    /// cannot verify tokens (a key of no supported kind, or an `alg` that is not a
    /// signature algorithm).
    pub fn from_jwk(jwk: &jsonwebtoken::jwk::Jwk) -> Result<JwtKey, String> {
        let key = jsonwebtoken::DecodingKey::from_jwk(jwk)
            .map_err(|err| format!("a JWK that cannot verify: {err}"))?;
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(alg) => Some(
                alg.to_string()
                    .parse()
                    .map_err(|_| format!("a JWK whose alg {alg} is not a signature algorithm"))?,
            ),
        };
        Ok(JwtKey {
            kid: jwk.common.key_id.clone(),
            key,
            alg,
        })
    }
}

/// Clock skew allowed on `exp` and `nbf` when `leeway` is not set.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// How often a JWKS URL is fetched again: providers rotate keys in days, and
/// publish new ones well before they sign with them.
const DEFAULT_REFRESH: Duration = Duration::from_secs(600);
/// A provider is asked at most this often, whatever the tokens' `kid`s.
pub(crate) const MIN_REFRESH: Duration = Duration::from_secs(30);
/// The OIDC claim that names the subject.
const DEFAULT_CONSUMER_CLAIM: &str = "sub";

pub(super) fn compile_jwt(
    d: &mut Diagnostics,
    raw: Spanned<raw::Jwt>,
    file: &Path,
) -> Option<JwtConfig> {
    let span = raw.span();
    let raw = raw.into_inner();
    let dir = file.parent().unwrap_or(Path::new(""));
    let jwks = compile_jwks(d, &raw, dir);
    let (keys, files) = compile_keys(d, &raw, dir);
    if keys.is_empty() && jwks.is_none() && !d.has_errors() {
        d.error(
            Some(span.clone()),
            "identity.jwt",
            "needs jwks_url, keys = [\"pub.pem\"] or secret",
        );
    }
    let algorithms = compile_algorithms(d, &raw);
    let strings = |v: &Option<Spanned<raw::OneOrMany<String>>>| {
        v.as_ref()
            .map(|v| v.get_ref().as_slice().to_vec())
            .unwrap_or_default()
    };
    let leeway = duration_of(
        d,
        "identity.jwt.leeway",
        raw.leeway.as_ref(),
        DEFAULT_LEEWAY,
    );
    let claim = |v: &Option<Spanned<String>>| v.as_ref().map(|c| c.get_ref().clone());
    Some(JwtConfig {
        keys,
        files,
        jwks,
        algorithms,
        issuer: strings(&raw.issuer),
        audience: strings(&raw.audience),
        leeway,
        consumer_claim: claim(&raw.consumer_claim).unwrap_or_else(|| DEFAULT_CONSUMER_CLAIM.into()),
        plan_claim: claim(&raw.plan_claim),
        default_plan: claim(&raw.default_plan),
        forward: raw.forward.unwrap_or(false),
    })
}

/// `keys` (files of PEM keys, JWKs or JWK sets, relative to the config file) and
/// `secret`: the keys loaded, and the files (a reload re-reads them).
fn compile_keys(d: &mut Diagnostics, raw: &raw::Jwt, dir: &Path) -> (Vec<JwtKey>, Vec<PathBuf>) {
    let mut keys = Vec::new();
    let mut files = Vec::new();
    for path in raw.keys.iter().flatten() {
        let full = dir.join(path.get_ref());
        files.push(full.clone());
        match load_keys(&full) {
            Ok(loaded) => keys.extend(loaded),
            Err(reason) => d.error(Some(path.span()), "identity.jwt.keys", reason),
        }
    }
    if let Some(secret) = &raw.secret {
        match secret_value(secret.get_ref()) {
            Ok(value) if value.len() >= 32 => keys.push(JwtKey {
                kid: None,
                key: DecodingKey::from_secret(value.as_bytes()),
                alg: None,
            }),
            Ok(_) => d.error(
                Some(secret.span()),
                "identity.jwt.secret",
                "must be at least 32 bytes (256 bits, RFC 7518 section 3.2)",
            ),
            Err(reason) => d.error(Some(secret.span()), "identity.jwt.secret", reason),
        }
    }
    (keys, files)
}

/// `algorithms`: the ones a token may be signed with (none: each key's own).
fn compile_algorithms(d: &mut Diagnostics, raw: &raw::Jwt) -> Vec<Algorithm> {
    match &raw.algorithms {
        None => Vec::new(),
        Some(list) => list
            .iter()
            .filter_map(|a| match a.get_ref().parse::<Algorithm>() {
                Ok(alg) => Some(alg),
                Err(_) => {
                    d.error(
                        Some(a.span()),
                        "identity.jwt.algorithms",
                        format!("\"{}\" is not an accepted algorithm (RS256..512, PS256..512, ES256, ES384, EdDSA, HS256..512; never none)", a.get_ref()),
                    );
                    None
                }
            })
            .collect(),
    }
}

/// `jwks_url` (https only), `refresh` and `ca_file`.
fn compile_jwks(d: &mut Diagnostics, raw: &raw::Jwt, dir: &Path) -> Option<JwksConfig> {
    let Some(url) = &raw.jwks_url else {
        for (key, value) in [
            ("identity.jwt.refresh", &raw.refresh),
            ("identity.jwt.ca_file", &raw.ca_file),
        ] {
            if let Some(v) = value {
                d.warn(Some(v.span()), key, "only used with jwks_url; ignored");
            }
        }
        return None;
    };
    let parsed = url
        .get_ref()
        .parse::<http::Uri>()
        .ok()
        .filter(|u| u.scheme_str() == Some("https") && u.host().is_some());
    let Some(parsed) = parsed else {
        d.error(
            Some(url.span()),
            "identity.jwt.jwks_url",
            "must be an https:// URL (keys fetched in the clear could be replaced)",
        );
        return None;
    };
    let refresh = duration_of(
        d,
        "identity.jwt.refresh",
        raw.refresh.as_ref(),
        DEFAULT_REFRESH,
    );
    if refresh < MIN_REFRESH {
        d.error(
            raw.refresh.as_ref().map(|r| r.span()),
            "identity.jwt.refresh",
            "must be at least 30s",
        );
    }
    let ca_file = raw.ca_file.as_ref().and_then(|ca| {
        let path = dir.join(ca.get_ref());
        match crate::tls::pki::roots_from(&path) {
            Ok(_) => Some(path),
            Err(reason) => {
                d.error(Some(ca.span()), "identity.jwt.ca_file", reason.to_string());
                None
            }
        }
    });
    Some(JwksConfig {
        url: parsed,
        refresh: refresh.max(MIN_REFRESH),
        ca_file,
    })
}

/// A secret as written, or `env:NAME` read from the environment.
fn secret_value(text: &str) -> Result<String, String> {
    match text.strip_prefix("env:") {
        None => Ok(text.to_string()),
        Some(var) => match std::env::var(var) {
            Ok(value) if !value.is_empty() => Ok(value),
            _ => Err(format!("environment variable {var} is not set or empty")),
        },
    }
}

/// The verification keys of one file: a PEM public key, a JWK, or a JWK set.
fn load_keys(path: &Path) -> Result<Vec<JwtKey>, String> {
    let bytes =
        std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let trimmed = text.trim_start();
    if trimmed.starts_with("-----BEGIN") {
        let key = DecodingKey::from_rsa_pem(&bytes)
            .or_else(|_| DecodingKey::from_ec_pem(&bytes))
            .or_else(|_| DecodingKey::from_ed_pem(&bytes))
            .map_err(|_| {
                format!(
                    "{}: not an RSA, EC or Ed25519 public key (PEM)",
                    path.display()
                )
            })?;
        return Ok(vec![JwtKey {
            kid: None,
            key,
            alg: None,
        }]);
    }
    let jwks: Vec<Jwk> = match serde_json::from_str::<JwkSet>(trimmed) {
        Ok(set) => set.keys,
        Err(_) => vec![
            serde_json::from_str::<Jwk>(trimmed)
                .map_err(|err| format!("{}: neither PEM nor a JWK (set): {err}", path.display()))?,
        ],
    };
    jwks.iter()
        .map(|jwk| JwtKey::from_jwk(jwk).map_err(|reason| format!("{}: {reason}", path.display())))
        .collect()
}
