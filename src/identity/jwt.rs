//! Bearer JWTs: a verified token names its caller (`consumer_claim`) and plan
//! (`plan_claim`).
//!
//! A token is verified once: its signature with a key of the family its `alg`
//! belongs to (a JWK's `kid` picks among keys), `iss` and `aud` when configured,
//! `exp` (required) and `nbf` with the `leeway`, against the instant the request was
//! admitted at. The verified claims are then cached by the token's SHA-256 until its
//! `exp`, so the hot path pays a signature check once per token. `alg: none` does not
//! parse, an algorithm outside `algorithms` is refused before any key is tried, and a
//! key is only ever used with its own family's algorithms, so an HS token signed with
//! an RSA or EC public key (algorithm confusion) finds no key. This module does not
//! fetch keys and does not decide what a caller may do.

use std::collections::HashMap;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, Validation, decode, decode_header};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::jwks::RemoteJwks;
use crate::config::{Config, JwtConfig, JwtKey, PlanId};

/// Tokens longer than this are refused unread: real access tokens are 1 to 2 KiB.
pub(crate) const MAX_TOKEN_BYTES: usize = 8_192;
/// Verified tokens kept at most; the cache starts over when full.
const MAX_CACHED: usize = 100_000;
/// The longest consumer name a token may carry (as for identity headers).
const MAX_NAME_BYTES: usize = 256;

/// What a verified token says.
#[derive(Debug)]
pub(crate) struct Verified {
    /// The `consumer_claim` value.
    pub consumer: Box<str>,
    /// The plan `plan_claim` names, or the default plan.
    pub plan: PlanId,
    /// The claims, for `claim:NAME` limit key parts.
    pub claims: Map<String, Value>,
    exp_s: u64,
    nbf_s: Option<u64>,
}

impl Verified {
    /// A claim's value as limit key bytes: a string as is, a number or boolean as
    /// JSON; `None` for anything else.
    pub(crate) fn claim(&self, name: &str) -> Option<Vec<u8>> {
        match self.claims.get(name)? {
            Value::String(s) => Some(s.as_bytes().to_vec()),
            v @ (Value::Number(_) | Value::Bool(_)) => Some(v.to_string().into_bytes()),
            _ => None,
        }
    }
}

/// Verifies tokens for one config snapshot.
#[derive(Debug)]
pub(crate) struct JwtVerifier {
    keys: Vec<JwtKey>,
    algorithms: Vec<Algorithm>,
    issuer: Vec<String>,
    audience: Vec<String>,
    leeway_s: u64,
    consumer_claim: String,
    plan_claim: Option<String>,
    /// Plans a claim may name (every routed policy covers them).
    plans: HashMap<Box<str>, PlanId>,
    default_plan: PlanId,
    cache: Mutex<HashMap<[u8; 32], Arc<Verified>>>,
    /// The key set of `jwks_url`, once attached ([`JwtVerifier::attach`]).
    remote: Option<Arc<RemoteJwks>>,
}

impl JwtVerifier {
    /// Uses `remote`'s key set besides the configured keys.
    pub(crate) fn attach(&mut self, remote: Arc<RemoteJwks>) {
        self.remote = Some(remote);
    }

    /// The key set of `jwks_url`, if any.
    pub(crate) fn remote(&self) -> Option<&Arc<RemoteJwks>> {
        self.remote.as_ref()
    }

    pub(crate) fn new(config: &Config, jwt: &JwtConfig) -> JwtVerifier {
        let plans = super::asserted::named_plans(config);
        let plan_id = |name: &str| {
            let index = config.plans.iter().position(|p| **p == *name)?;
            Some(PlanId(index as u16))
        };
        let default_plan = jwt
            .default_plan
            .as_deref()
            .and_then(plan_id)
            .or_else(|| plan_id(crate::config::DEFAULT_PLAN))
            .unwrap_or(PlanId::ANONYMOUS);
        JwtVerifier {
            keys: jwt.keys.clone(),
            algorithms: jwt.algorithms.clone(),
            issuer: jwt.issuer.clone(),
            audience: jwt.audience.clone(),
            leeway_s: jwt.leeway.as_secs(),
            consumer_claim: jwt.consumer_claim.clone(),
            plan_claim: jwt.plan_claim.clone(),
            plans,
            default_plan,
            cache: Mutex::new(HashMap::new()),
            remote: None,
        }
    }

    /// Whether a bearer credential is a JWT (three base64url parts, a JSON header)
    /// rather than an API key.
    pub(crate) fn is_jwt(token: &[u8]) -> bool {
        token.starts_with(b"eyJ") && token.iter().filter(|&&b| b == b'.').count() == 2
    }

    /// The verified claims of `token` at `now_ms`, or why it is refused.
    pub(crate) fn verify(&self, token: &[u8], now_ms: u64) -> Result<Arc<Verified>, &'static str> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err("the token is longer than 8 KiB");
        }
        let now_s = now_ms / 1_000;
        let hash: [u8; 32] = Sha256::digest(token).into();
        if let Some(verified) = self.cache.lock().get(&hash).cloned() {
            self.in_time(&verified, now_s)?;
            return Ok(verified);
        }
        let verified = Arc::new(self.verify_new(token)?);
        self.in_time(&verified, now_s)?;
        let mut cache = self.cache.lock();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(hash, verified.clone());
        Ok(verified)
    }

    fn in_time(&self, verified: &Verified, now_s: u64) -> Result<(), &'static str> {
        if now_s > verified.exp_s.saturating_add(self.leeway_s) {
            return Err("the token has expired");
        }
        if verified
            .nbf_s
            .is_some_and(|nbf| nbf > now_s.saturating_add(self.leeway_s))
        {
            return Err("the token is not valid yet");
        }
        Ok(())
    }

    fn verify_new(&self, token: &[u8]) -> Result<Verified, &'static str> {
        let header =
            decode_header(token).map_err(|_| "the token's header is not valid (or alg none)")?;
        let alg = header.alg;
        if !self.algorithms.is_empty() && !self.algorithms.contains(&alg) {
            return Err("the token's algorithm is not accepted");
        }
        let family = alg.family();
        let by_kid = |k: &&JwtKey| match (&header.kid, &k.kid) {
            (Some(wanted), Some(kid)) => wanted == kid,
            // A key without kid (PEM, secret) is tried for any token.
            (_, None) => true,
            (None, Some(_)) => true,
        };
        let mut validation = Validation::new(alg);
        // exp and nbf are checked against the gateway's clock (`in_time`).
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims.clear();
        validation.validate_aud = !self.audience.is_empty();
        if !self.audience.is_empty() {
            validation.set_audience(&self.audience);
        }
        if !self.issuer.is_empty() {
            validation.set_issuer(&self.issuer);
        }
        let remote = self.remote.as_ref().map(|r| r.keys());
        let keys = || self.keys.iter().chain(remote.iter().flat_map(|k| k.iter()));
        if let (Some(kid), Some(source)) = (&header.kid, &self.remote)
            && !keys().any(|k| k.kid.as_ref() == Some(kid))
        {
            // A kid the set lacks: perhaps the provider rotated; fetch soon.
            source.wake();
        }
        let mut tried = false;
        let mut claims = None;
        for key in keys().filter(|k| k.key.family() == family).filter(by_kid) {
            tried = true;
            match decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(err) => {
                    use jsonwebtoken::errors::ErrorKind;
                    match err.kind() {
                        ErrorKind::InvalidIssuer => {
                            return Err("the token's issuer is not accepted");
                        }
                        ErrorKind::InvalidAudience => {
                            return Err("the token's audience is not accepted");
                        }
                        ErrorKind::InvalidSignature => continue,
                        _ => return Err("the token is malformed or its claims are not valid"),
                    }
                }
            }
        }
        let Some(claims) = claims else {
            return Err(match tried {
                true => "the token's signature does not verify",
                false => "no key can verify the token",
            });
        };
        let seconds = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or("exp and nbf must be seconds"),
            Some(_) => Err("exp and nbf must be numbers"),
        };
        let exp_s = seconds("exp")?.ok_or("the token has no exp")?;
        let nbf_s = seconds("nbf")?;
        let consumer = match claims.get(&self.consumer_claim) {
            Some(Value::String(name))
                if !name.is_empty()
                    && name.len() <= MAX_NAME_BYTES
                    && name.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                Box::from(name.as_str())
            }
            _ => return Err("the consumer claim is missing or not a short string"),
        };
        let plan = match self.plan_claim.as_ref().map(|c| claims.get(c)) {
            Some(Some(Value::String(name))) => self.plans.get(name.as_str()).copied(),
            Some(Some(_)) => return Err("the plan claim is not a string"),
            _ => None,
        };
        Ok(Verified {
            consumer,
            plan: plan.unwrap_or(self.default_plan),
            claims,
            exp_s,
            nbf_s,
        })
    }
}
