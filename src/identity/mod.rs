//! Who is calling: a registered consumer (by API key) or an anonymous client IP.
//!
//! Keys come from the configured header or `Authorization: Bearer`; they are hashed
//! with SHA-256 and confirmed with a constant-time compare, so the config never needs
//! the plain key and timing reveals nothing about it. A presented but unknown key is
//! an error (401), never a fall-back to anonymous. The client IP is the peer address,
//! or, when the peer is a trusted proxy, the rightmost `X-Forwarded-For` (or
//! `Forwarded`) entry that is not itself a trusted proxy. An auth layer among the
//! trusted proxies may name the caller in `consumer_header` ([`asserted`]). This
//! module does not decide what a caller may do; policies do.

mod asserted;
pub(crate) mod jwks;
pub(crate) mod jwt;

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use asserted::IdentityHeaders;
pub(crate) use asserted::{Asserted, HeaderError};
use jwt::{JwtVerifier, Verified, Who};

use crate::config::consumer_index::ConsumerIndex;

use crate::config::{Config, ConsumerConfig, ConsumerId, PlanId};
/// The caller-name rule (1 to 256 bytes of visible ASCII), the config's: consumers
/// are held to it as every other source of a caller's name is.
pub(crate) use crate::config::{MAX_NAME_BYTES, is_caller_name};
use crate::store::CallerKey;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The caller of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    pub kind: CallerKind,
    pub plan: PlanId,
    /// The client IP (after trusted proxies), for access lists and logs.
    pub ip: IpAddr,
}

impl Caller {
    /// The configured consumer the caller is, if it is one.
    pub(crate) fn consumer(&self) -> Option<ConsumerId> {
        match self.kind {
            CallerKind::Consumer(index) => Some(index),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallerKind {
    /// Index into the config's consumers.
    Consumer(ConsumerId),
    /// A caller that a trusted auth layer named and the config does not list: its
    /// limiter key ([`named_consumer_key`] of the name).
    Named(CallerKey),
    Anonymous,
}

/// Why a request has no acceptable identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdentityError {
    #[error("the API key is not valid")]
    UnknownKey,
    /// A bearer JWT that is bad, expired or cannot be verified.
    #[error("the bearer token is not valid: {0}")]
    InvalidToken(&'static str),
    /// An API key and a bearer JWT in one request.
    #[error("an API key and a bearer token in one request")]
    TwoCredentials,
}

/// Why identity headers from a trusted proxy are refused (400).
impl From<HeaderError> for crate::http::refusal::Refusal {
    fn from(err: HeaderError) -> Self {
        crate::http::refusal::Refusal::Malformed(match err {
            HeaderError::Repeated => "more than one identity header",
            HeaderError::Invalid => "an identity header longer than 256 bytes or not visible ASCII",
        })
    }
}

/// The credential headers of a request: its API key header and `Authorization`.
/// Gathered by [`crate::http::head::check`] in its pass over the headers, or looked up.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Credentials<'a> {
    pub key: Option<&'a HeaderValue>,
    pub authorization: Option<&'a HeaderValue>,
    /// What a trusted auth layer's identity headers say ([`Identifier::asserted`]).
    pub asserted: Option<Asserted<'a>>,
}

impl<'a> Credentials<'a> {
    /// Looks both up in `headers`; `key_header` carries API keys.
    #[cfg(test)]
    pub(crate) fn of(headers: &'a HeaderMap, key_header: &HeaderName) -> Credentials<'a> {
        Credentials {
            key: headers.get(key_header),
            authorization: headers.get(http::header::AUTHORIZATION),
            asserted: None,
        }
    }

    /// The token of `Authorization: Bearer <token>`, scheme in any case. `Bearer`
    /// with no token is an empty (so unknown) key, never an anonymous caller.
    fn bearer(&self) -> Option<&'a [u8]> {
        let value = self.authorization?.as_bytes().trim_ascii();
        let (scheme, rest) = value.split_at_checked(6)?;
        let separated = rest.is_empty() || rest[0] == b' ' || rest[0] == b'\t';
        (scheme.eq_ignore_ascii_case(b"bearer") && separated).then(|| rest.trim_ascii())
    }
}

/// Identifies callers for one config snapshot.
#[derive(Debug)]
pub(crate) struct Identifier {
    api_key_header: HeaderName,
    /// The config's consumers, shared with it.
    consumers: Arc<Vec<ConsumerConfig>>,
    /// Consumers by the SHA-256 of their key and by name (for callers an auth layer
    /// names and the admin API).
    index: Arc<ConsumerIndex>,
    /// Limiter key of each consumer: [`name_key`] of `consumer:NAME`.
    consumer_keys: Vec<CallerKey>,
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
    /// `consumer_header` and `plan_header`, when configured.
    headers: Option<IdentityHeaders>,
    /// `[identity.jwt]`, when configured.
    jwt: Option<JwtVerifier>,
    /// `[identity.jwt] jwks_url`, when configured.
    jwks_config: Option<crate::config::JwksConfig>,
    /// `[identity.jwt] forward`: a bearer JWT stays in the forwarded request.
    forward_token: bool,
}

impl Identifier {
    pub(crate) fn new(config: &Config) -> Identifier {
        Identifier {
            api_key_header: config.identity.api_key_header.clone(),
            consumers: Arc::clone(&config.consumers),
            index: Arc::clone(&config.consumer_index),
            consumer_keys: config
                .consumers
                .iter()
                .map(|c| named_consumer_key(&c.name))
                .collect(),
            trusted: config.identity.trusted_proxies.clone(),
            ipv6_prefix: config.identity.ipv6_prefix,
            headers: IdentityHeaders::new(config),
            jwt: (config.identity.jwt.as_ref()).map(|jwt| JwtVerifier::new(config, jwt)),
            jwks_config: (config.identity.jwt.as_ref()).and_then(|jwt| jwt.jwks.clone()),
            forward_token: config.identity.jwt.as_ref().is_some_and(|jwt| jwt.forward),
        }
    }

    /// Gives the JWT verifier the key set of `jwks_url`: `previous`'s, when it fetches
    /// the same URL the same way (a reload keeps the set and its task), else a new
    /// one counted in `refreshes`; starts its fetch task if it is new.
    pub(crate) fn attach_jwks(
        &mut self,
        previous: Option<&Identifier>,
        refreshes: &prometheus::IntCounterVec,
    ) {
        let Some(jwt) = self.jwt.as_mut() else { return };
        let Some(config) = self.jwks_config.clone() else {
            return;
        };
        let kept = previous
            .and_then(|p| p.jwt.as_ref())
            .and_then(|p| p.remote())
            .filter(|r| *r.config() == config)
            .cloned();
        let remote = kept.unwrap_or_else(|| jwks::RemoteJwks::new(config, refreshes.clone()));
        remote.start();
        jwt.attach(remote);
    }

    /// The `jwks_url` and its fetch state, for `/readyz`.
    pub(crate) fn jwks_state(&self) -> Option<(String, jwks::FetchState)> {
        let remote = self.jwt.as_ref()?.remote()?;
        Some((remote.config().url.to_string(), remote.state()))
    }

    /// The caller a bearer JWT names, when `[identity.jwt]` is configured and the
    /// request's bearer credential is a JWT (`None` otherwise: an API key, or none).
    pub(crate) fn identify_token(
        &self,
        credentials: Credentials<'_>,
        ip: IpAddr,
        now_ms: u64,
    ) -> Option<Result<(Caller, Arc<Verified>), IdentityError>> {
        let jwt = self.jwt.as_ref()?;
        let token = credentials.bearer().filter(|t| JwtVerifier::is_jwt(t))?;
        if credentials.key.is_some() {
            return Some(Err(IdentityError::TwoCredentials));
        }
        let resolve = |name: &str, plan| match self.consumer_index(name) {
            Some(id) if self.consumers[id.index()].disabled => Who::Disabled,
            Some(id) => Who::Consumer(id),
            None => Who::Named(named_consumer_key(name), plan),
        };
        let verified = match jwt.verify(token, now_ms, resolve) {
            Ok(verified) => verified,
            Err(reason) => return Some(Err(IdentityError::InvalidToken(reason))),
        };
        let caller = match verified.who {
            Who::Disabled => {
                return Some(Err(IdentityError::InvalidToken("the consumer is disabled")));
            }
            Who::Consumer(id) => Caller {
                kind: CallerKind::Consumer(id),
                plan: self.consumers[id.index()].plan,
                ip,
            },
            Who::Named(key, plan) => Caller {
                kind: CallerKind::Named(key),
                plan,
                ip,
            },
        };
        Some(Ok((caller, verified)))
    }

    /// The index of the consumer called `name`.
    pub(crate) fn consumer_index(&self, name: &str) -> Option<ConsumerId> {
        self.index
            .by_name(&self.consumers, name)
            .map(ConsumerId::new)
    }

    /// Removes the identity headers from the request of a `peer` that is not a
    /// trusted proxy, before anything reads them (nor are they forwarded).
    pub(crate) fn strip_untrusted(&self, headers: &mut HeaderMap, peer: IpAddr) {
        if let Some(identity) = &self.headers
            && !self.is_trusted(peer.to_canonical())
        {
            identity.strip(headers);
        }
    }

    /// What the identity headers of a request say. Only a trusted proxy's request
    /// still has them ([`Identifier::strip_untrusted`]).
    pub(crate) fn asserted<'a>(
        &self,
        headers: &'a HeaderMap,
    ) -> Result<Option<Asserted<'a>>, HeaderError> {
        match &self.headers {
            Some(identity) => identity.read(headers),
            None => Ok(None),
        }
    }

    /// Identifies the caller of a request that came from `peer`.
    #[cfg(test)]
    pub(crate) fn identify(
        &self,
        headers: &HeaderMap,
        peer: IpAddr,
    ) -> Result<Caller, IdentityError> {
        let mut credentials = Credentials::of(headers, &self.api_key_header);
        if self.is_trusted(peer.to_canonical()) {
            credentials.asserted = self.asserted(headers).ok().flatten();
        }
        self.identify_from(credentials, self.client_ip(headers, peer))
    }

    /// Identifies the caller of a request whose client IP is already known.
    pub(crate) fn identify_from(
        &self,
        credentials: Credentials<'_>,
        ip: IpAddr,
    ) -> Result<Caller, IdentityError> {
        match presented_key(credentials) {
            None => Ok(match (credentials.asserted, &self.headers) {
                (Some(asserted), Some(identity)) => match self.consumer_index(asserted.consumer) {
                    Some(id) if self.consumers[id.index()].disabled => {
                        return Err(IdentityError::UnknownKey);
                    }
                    Some(id) => Caller {
                        kind: CallerKind::Consumer(id),
                        plan: self.consumers[id.index()].plan,
                        ip,
                    },
                    None => Caller {
                        kind: CallerKind::Named(named_consumer_key(asserted.consumer)),
                        plan: identity.plan(&asserted),
                        ip,
                    },
                },
                _ => Caller {
                    kind: CallerKind::Anonymous,
                    plan: PlanId::ANONYMOUS,
                    ip,
                },
            }),
            Some(key) => {
                let hash: [u8; 32] = Sha256::digest(key).into();
                let index =
                    (self.index.by_key(&self.consumers, &hash)).ok_or(IdentityError::UnknownKey)?;
                if self.consumers[index].disabled {
                    return Err(IdentityError::UnknownKey);
                }
                Ok(Caller {
                    kind: CallerKind::Consumer(ConsumerId::new(index)),
                    plan: self.consumers[index].plan,
                    ip,
                })
            }
        }
    }

    /// The header that carries API keys (removed before forwarding).
    pub(crate) fn api_key_header(&self) -> &HeaderName {
        &self.api_key_header
    }

    /// Whether the request carries its key in `Authorization: Bearer`, so that
    /// forwarding removes the header: an API key there, or a JWT unless `forward`
    /// keeps it.
    pub(crate) fn key_in_authorization(&self, credentials: Credentials<'_>) -> bool {
        match credentials.bearer() {
            None => false,
            Some(token) if self.forward_token && JwtVerifier::is_jwt(token) => false,
            Some(token) => {
                credentials.key.is_none() || {
                    let hash: [u8; 32] = Sha256::digest(token).into();
                    self.index.by_key(&self.consumers, &hash).is_some()
                }
            }
        }
    }

    /// The limiter key of an anonymous caller: its IP, IPv6 cut to the prefix.
    pub(crate) fn ip_key(&self, ip: IpAddr) -> CallerKey {
        ip_key(ip, self.ipv6_prefix)
    }

    /// The client address: the peer, or what trusted proxies say the client was.
    pub(crate) fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        if headers.contains_key(&X_FORWARDED_FOR) {
            let hops = headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .rev()
                .flat_map(|v| v.to_str().unwrap_or("").rsplit(','));
            for hop in hops {
                match parse_hop(hop) {
                    Some(ip) if self.is_trusted(ip) => client = ip,
                    Some(ip) => return ip,
                    // A garbled entry: trust stops at the proxy that added it.
                    None => return client,
                }
            }
        } else {
            let hops = headers
                .get_all(FORWARDED)
                .iter()
                .rev()
                .flat_map(|v| v.to_str().unwrap_or("").rsplit(','));
            for element in hops {
                let Some(hop) = element.split(';').find_map(|pair| {
                    pair.trim()
                        .strip_prefix("for=")
                        .or_else(|| pair.trim().strip_prefix("FOR="))
                }) else {
                    return client;
                };
                match parse_hop(hop.trim_matches('"')) {
                    Some(ip) if self.is_trusted(ip) => client = ip,
                    Some(ip) => return ip,
                    None => return client,
                }
            }
        }
        client
    }

    /// The prefix length IPv6 callers are keyed by.
    pub(crate) fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The limiter key of consumer `id`.
    pub(crate) fn consumer_key(&self, id: ConsumerId) -> CallerKey {
        self.consumer_keys[id.index()]
    }

    /// The limiter key of `caller`: its consumer's, or its IP (prefix).
    pub(crate) fn key(&self, caller: &Caller) -> CallerKey {
        match caller.kind {
            CallerKind::Consumer(id) => self.consumer_key(id),
            CallerKind::Named(key) => key,
            CallerKind::Anonymous => self.ip_key(caller.ip),
        }
    }

    /// Whether `ip` is a trusted proxy.
    pub(crate) fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

/// The key presented, if any. Two key or `Authorization` headers never get here:
/// [`crate::http::head::check`] refuses them.
fn presented_key<'a>(credentials: Credentials<'a>) -> Option<&'a [u8]> {
    match credentials.key {
        Some(value) => Some(value.as_bytes().trim_ascii()),
        None => credentials.bearer(),
    }
}

/// Parses one forwarding hop: `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]:80`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, _) = rest.split_once(']')?;
        return inside.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
    }
    let (host, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// 64-bit limiter key of an IP.
///
/// IPv4 is `0xffff` followed by the address (its IPv4-mapped IPv6 form without the
/// zero top half). IPv6 cut to a prefix of at most 64 bits is that prefix: only the
/// unrouted `::/64` and `0:ffff::/32` ranges could meet an IPv4 key. Longer prefixes are
/// mixed down to 64 bits; a collision could only merge two callers' budgets (errs
/// toward rejecting), never split one.
pub(crate) fn ip_key(ip: IpAddr, prefix: u8) -> CallerKey {
    match ip.to_canonical() {
        IpAddr::V4(v4) => (0xffff << 32) | u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let prefix = u32::from(prefix.clamp(1, 128));
            let masked = u128::from(v6) & (u128::MAX << (128 - prefix));
            let (high, low) = ((masked >> 64) as u64, masked as u64);
            if prefix <= 64 {
                high
            } else {
                high ^ low.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
            }
        }
    }
}

/// 64-bit limiter key of a named caller (`consumer:acme`, or any decision-API name).
pub(crate) fn name_key(name: &str) -> CallerKey {
    digest_key(Sha256::digest(name.as_bytes()).into())
}

/// [`name_key`] of `consumer:NAME`, without building the string: a caller an auth
/// layer names shares the key space (and the admin API's names) of the config's.
pub(crate) fn named_consumer_key(name: &str) -> CallerKey {
    let digest = Sha256::new()
        .chain_update(b"consumer:")
        .chain_update(name.as_bytes())
        .finalize();
    digest_key(digest.into())
}

pub(crate) fn digest_key(digest: [u8; 32]) -> CallerKey {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    // The top bit keeps named keys out of allocated IPv6 space (2000::/3) and IPv4.
    u64::from_be_bytes(bytes) | (1 << 63)
}

#[cfg(test)]
mod tests;
