//! `[identity]`: the API key header, trusted proxies, the IPv6 prefix anonymous callers
//! are keyed by, and the identity headers of an auth layer in front.

use std::path::{Path, PathBuf};

use http::HeaderName;
use ipnet::IpNet;
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::jwt::JwtConfig;
use super::raw;
use super::values::{cidrs, int_in};

/// `[identity]`: how the caller of a request is found.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// `api_key_header` (default `x-api-key`): the header that carries API keys;
    /// `Authorization: Bearer` is accepted too.
    pub api_key_header: HeaderName,
    /// `trusted_proxies`: peers whose `X-Forwarded-For` or `Forwarded` is believed
    /// about the client's address; empty, the peer is the client.
    pub trusted_proxies: Vec<IpNet>,
    /// `ipv6_prefix` (1 to 128, default 64): anonymous IPv6 callers are counted per
    /// prefix of this length.
    pub ipv6_prefix: u8,
    /// `consumers_file`: more consumers, one JSON object a line (relative to the
    /// config file's directory); read, validated and swapped with the config.
    pub consumers_file: Option<PathBuf>,
    /// `consumer_header`: names the caller when an auth layer in `trusted_proxies`
    /// sends it; removed from every other peer's request before anything reads it.
    pub consumer_header: Option<HeaderName>,
    /// `plan_header`: the plan of the caller `consumer_header` names (same trust).
    pub plan_header: Option<HeaderName>,
    /// `[identity.jwt]`: bearer JWTs that name their caller.
    pub jwt: Option<JwtConfig>,
}

/// IPv6 end sites usually get a /64: keying finer lets one host rotate addresses freely.
const DEFAULT_IPV6_PREFIX: i64 = 64;
const DEFAULT_API_KEY_HEADER: &str = "x-api-key";

pub(super) fn compile_identity(
    d: &mut Diagnostics,
    raw: raw::Identity,
    file: &Path,
) -> IdentityConfig {
    let api_key_header = match &raw.api_key_header {
        None => HeaderName::from_static(DEFAULT_API_KEY_HEADER),
        Some(h) => HeaderName::try_from(h.get_ref().to_ascii_lowercase()).unwrap_or_else(|_| {
            d.error(
                Some(h.span()),
                "identity.api_key_header",
                format!("\"{}\" is not a valid header name", h.get_ref()),
            );
            HeaderName::from_static(DEFAULT_API_KEY_HEADER)
        }),
    };
    let ipv6_prefix = raw
        .ipv6_prefix
        .as_ref()
        .and_then(|p| int_in(d, "identity.ipv6_prefix", p, 1, 128))
        .unwrap_or(DEFAULT_IPV6_PREFIX) as u8;
    let trusted_proxies = cidrs(d, "identity.trusted_proxies", raw.trusted_proxies);
    let untrusted = trusted_proxies.is_empty();
    let (consumer_header, plan_header) = identity_headers(
        d,
        &raw.consumer_header,
        &raw.plan_header,
        &api_key_header,
        untrusted,
    );
    let consumers_file = raw.consumers_file.as_ref().and_then(|v| {
        if v.get_ref().trim().is_empty() {
            d.error(
                Some(v.span()),
                "identity.consumers_file",
                "must not be empty",
            );
            return None;
        }
        // Relative paths are relative to the config file, like every path in it.
        Some(file.parent().unwrap_or(Path::new("")).join(v.get_ref()))
    });
    let jwt = raw
        .jwt
        .and_then(|jwt| super::jwt::compile_jwt(d, jwt, file));
    IdentityConfig {
        api_key_header,
        jwt,
        consumers_file,
        trusted_proxies,
        ipv6_prefix,
        consumer_header,
        plan_header,
    }
}

/// `consumer_header` and `plan_header`: valid names, apart from each other and from
/// the credential headers, and believed only from trusted proxies (`untrusted`:
/// there are none).
fn identity_headers(
    d: &mut Diagnostics,
    consumer: &Option<Spanned<String>>,
    plan: &Option<Spanned<String>>,
    api_key_header: &HeaderName,
    untrusted: bool,
) -> (Option<HeaderName>, Option<HeaderName>) {
    let consumer_header = identity_header(d, "identity.consumer_header", consumer);
    let plan_header = identity_header(d, "identity.plan_header", plan);
    for (key, name, raw_name) in [
        ("identity.consumer_header", &consumer_header, consumer),
        ("identity.plan_header", &plan_header, plan),
    ] {
        let Some(name) = name else { continue };
        let span = raw_name.as_ref().map(|v| v.span());
        if name == api_key_header || *name == http::header::AUTHORIZATION {
            d.error(
                span,
                key,
                "must differ from api_key_header and Authorization",
            );
        } else if untrusted {
            d.warn(
                span,
                key,
                "believed only from trusted_proxies, which is empty: never believed",
            );
        }
    }
    if consumer_header.is_some() && consumer_header == plan_header {
        let span = plan.as_ref().map(|v| v.span());
        d.error(
            span,
            "identity.plan_header",
            "must differ from consumer_header",
        );
    }
    if plan_header.is_some() && consumer_header.is_none() {
        let span = plan.as_ref().map(|v| v.span());
        d.error(
            span,
            "identity.plan_header",
            "needs consumer_header: a plan belongs to a named caller",
        );
    }
    (consumer_header, plan_header)
}

/// An identity header's name, lower-cased; `None` (with an error) if it is not one.
fn identity_header(
    d: &mut Diagnostics,
    key: &str,
    raw: &Option<Spanned<String>>,
) -> Option<HeaderName> {
    let raw = raw.as_ref()?;
    let name = HeaderName::try_from(raw.get_ref().to_ascii_lowercase()).ok();
    // An underscore would be removed before forwarding, and PHP and CGI read `_` as `-`.
    let name = name.filter(|n| !n.as_str().contains('_'));
    if name.is_none() {
        d.error(
            Some(raw.span()),
            key,
            format!(
                "\"{}\" is not a valid header name (letters, digits and '-')",
                raw.get_ref()
            ),
        );
    }
    name
}
