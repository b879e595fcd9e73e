//! Bearer JWTs: a verified token names its caller (`consumer_claim`) and plan
//! (`plan_claim`).
//!
//! A token is verified once: its signature with a key of the family its `alg`
//! belongs to (a JWK's `kid` picks among keys), `iss` and `aud` when configured,
//! `exp` (required) and `nbf` with the `leeway`, against the instant the request was
//! admitted at. The verified claims, and the caller they resolve to, are then cached
//! by the token's SHA-256 until its `exp`, so the hot path pays a signature check
//! once per token; each worker thread also keeps the tokens it saw last in a small
//! table of its own ([`Recent`]), found by comparing the token's bytes, so a cached
//! token costs a request neither a hash of the token nor a lock or a reference count
//! shared with the other workers. `alg: none` does not
//! parse, an algorithm outside `algorithms` is refused before any key is tried, and a
//! key is only ever used with its own family's algorithms, so an HS token signed with
//! an RSA or EC public key (algorithm confusion) finds no key. A token a fetched key
//! verified holds that key's life ([`KeyLife`]): once a fetch finds the key gone
//! from its set, every use of the cached token verifies it again, against the set
//! in force, so a revoked key verifies nothing from that fetch on. This module does
//! not fetch keys and does not decide what a caller may do.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation, decode, decode_header};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::jwks::{KeyLife, RemoteJwks};
use crate::config::{Config, ConsumerId, JwtConfig, JwtKey, PlanId};
use crate::store::CallerKey;

/// Tokens longer than this are refused unread: real access tokens are 1 to 2 KiB.
pub(crate) const MAX_TOKEN_BYTES: usize = 8_192;
/// Verified tokens kept at most; the cache starts over when full.
const MAX_CACHED: usize = 100_000;
/// Tokens each worker thread keeps in its own table ([`Recent`]): a thread serves
/// few distinct tokens at once (a keep-alive client sends the same one again), and
/// a miss only costs the shared cache's lookup.
const RECENT_SLOTS: usize = 64;

/// Tells verifiers apart, so a thread's table of recent tokens is never read with
/// another config's verifier.
static VERIFIERS: AtomicU64 = AtomicU64::new(1);

/// Who a verified token's caller is, resolved once, when the token is first
/// verified, against the config snapshot the verifier belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    /// Consumer `index` of the config's consumers.
    Consumer(ConsumerId),
    /// A caller the config does not list: its limiter key and the token's plan.
    Named(CallerKey, PlanId),
    /// A listed consumer that is disabled: the token is refused.
    Disabled,
}

/// What a verified token says.
#[derive(Debug, Clone)]
pub(crate) struct Verified {
    /// The `consumer_claim` value.
    pub consumer: Box<str>,
    /// The plan `plan_claim` names, or the default plan.
    pub plan: PlanId,
    /// The claims, for `claim:NAME` limit key parts.
    pub claims: Map<String, Value>,
    /// The caller, as the verifier's config resolves `consumer`.
    pub who: Who,
    exp_s: u64,
    nbf_s: Option<u64>,
    /// The life of the fetched key that verified it (none for a configured key,
    /// which a reload replaces with its verifier and caches).
    key: Option<Arc<KeyLife>>,
}

impl Verified {
    /// Whether the key that verified the token has left its set since.
    fn revoked(&self) -> bool {
        self.key.as_ref().is_some_and(|life| life.ended())
    }
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
    /// This verifier among all ([`VERIFIERS`]), for the threads' [`Recent`] tables.
    id: u64,
}

/// The tokens one worker thread verified or found last, each with a copy of its
/// claims owned by the thread: one slot per token, picked by the token's last bytes
/// (its signature's), and a token found only by comparing all its bytes. A hit
/// touches nothing another thread writes. Holds the tokens of one verifier at a
/// time; another's request empties it.
struct Recent {
    verifier: u64,
    slots: Vec<Option<Seen>>,
}

/// A token's bytes and the claims its thread holds for it.
type Seen = (Box<[u8]>, Arc<Verified>);

thread_local! {
    static RECENT: RefCell<Recent> = const {
        RefCell::new(Recent { verifier: 0, slots: Vec::new() })
    };
}

impl Recent {
    /// The slot a token goes in: its last eight bytes, mixed.
    fn slot(token: &[u8]) -> usize {
        let mut tail = [0u8; 8];
        let n = token.len().min(8);
        tail[..n].copy_from_slice(&token[token.len() - n..]);
        let mixed = u64::from_le_bytes(tail).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 58) as usize % RECENT_SLOTS
    }

    /// Makes this the table of `verifier`, emptied if it held another's tokens.
    fn serve(&mut self, verifier: u64) {
        if self.verifier != verifier || self.slots.is_empty() {
            self.verifier = verifier;
            self.slots.clear();
            self.slots.resize_with(RECENT_SLOTS, || None);
        }
    }

    fn get(&self, token: &[u8]) -> Option<Arc<Verified>> {
        match &self.slots[Self::slot(token)] {
            // A token is a secret: compared in a time that depends only on the
            // lengths (an early exit would tell how much of one a guess got right).
            Some((seen, verified)) if bool::from(seen.ct_eq(token)) => Some(Arc::clone(verified)),
            _ => None,
        }
    }

    fn put(&mut self, token: &[u8], verified: Arc<Verified>) {
        self.slots[Self::slot(token)] = Some((Box::from(token), verified));
    }
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
            id: VERIFIERS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether a bearer credential is a JWT (three base64url parts, a JSON header)
    /// rather than an API key.
    pub(crate) fn is_jwt(token: &[u8]) -> bool {
        token.starts_with(b"eyJ") && memchr::memchr_iter(b'.', token).count() == 2
    }

    /// The verified claims of `token` at `now_ms`, or why it is refused. `resolve`
    /// names the caller of a token verified for the first time ([`Verified::who`]).
    pub(crate) fn verify(
        &self,
        token: &[u8],
        now_ms: u64,
        resolve: impl FnOnce(&str, PlanId) -> Who,
    ) -> Result<Arc<Verified>, &'static str> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err("the token is longer than 8 KiB");
        }
        let now_s = now_ms / 1_000;
        let recent = RECENT.with_borrow_mut(|recent| {
            recent.serve(self.id);
            recent.get(token)
        });
        // A token whose key has left the set since is verified again.
        if let Some(verified) = recent.filter(|v| !v.revoked()) {
            self.in_time(&verified, now_s)?;
            return Ok(verified);
        }
        let verified = self.shared(token, now_s, resolve)?;
        // The thread's own copy: its reference count is this thread's alone.
        let own = Arc::new(Verified::clone(&verified));
        RECENT.with_borrow_mut(|recent| {
            recent.serve(self.id);
            recent.put(token, Arc::clone(&own));
        });
        Ok(own)
    }

    /// [`Self::verify`] through the cache all threads share, by the token's SHA-256.
    fn shared(
        &self,
        token: &[u8],
        now_s: u64,
        resolve: impl FnOnce(&str, PlanId) -> Who,
    ) -> Result<Arc<Verified>, &'static str> {
        let hash: [u8; 32] = Sha256::digest(token).into();
        let cached = self.cache.lock().get(&hash).cloned();
        if let Some(verified) = cached.filter(|v| !v.revoked()) {
            self.in_time(&verified, now_s)?;
            return Ok(verified);
        }
        let mut verified = self.verify_new(token)?;
        verified.who = resolve(&verified.consumer, verified.plan);
        let verified = Arc::new(verified);
        self.in_time(&verified, now_s)?;
        if verified.revoked() {
            // Its key left the set while it was being verified.
            return Err("no key can verify the token");
        }
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
        let (claims, key) = self.verified_claims(token)?;
        let mut verified = self.read_claims(claims)?;
        verified.key = key;
        Ok(verified)
    }

    /// The claims of `token`, once a key accepted for it verified its signature,
    /// with the life of that key if it is a fetched one.
    fn verified_claims(&self, token: &[u8]) -> Result<Claims, &'static str> {
        let header =
            decode_header(token).map_err(|_| "the token's header is not valid (or alg none)")?;
        let alg = header.alg;
        if !self.algorithms.is_empty() && !self.algorithms.contains(&alg) {
            return Err("the token's algorithm is not accepted");
        }
        // No header extension is understood here, so one marked critical refuses the
        // token (RFC 7515 section 4.1.11); an empty list is not allowed either.
        if header.crit.is_some() {
            return Err("the token names critical header extensions");
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
        // iss and aud are checked below on the claims as sent: jsonwebtoken passes one
        // that is absent or that it cannot read unless it is required.
        validation.validate_aud = false;
        let remote = self.remote.as_ref().map(|r| r.keys());
        let fetched = remote.iter().flat_map(|k| k.iter());
        let keys = || {
            let configured = self.keys.iter().map(|key| (key, None));
            configured.chain(fetched.clone().map(|k| (&k.key, Some(&k.life))))
        };
        if let (Some(kid), Some(source)) = (&header.kid, &self.remote)
            && !keys().any(|(k, _)| k.kid.as_ref() == Some(kid))
        {
            // A kid the set lacks: perhaps the provider rotated; fetch soon.
            source.wake();
        }
        let mut tried = false;
        let mut claims = None;
        // A JWK that names its alg verifies that algorithm only.
        let by_alg = |k: &&JwtKey| k.alg.is_none_or(|a| a == alg);
        let usable = keys().filter(|(k, _)| k.key.family() == family);
        for (key, life) in usable.filter(|(k, _)| by_kid(k) && by_alg(k)) {
            tried = true;
            match decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some((data.claims, life.cloned()));
                    break;
                }
                Err(err) if matches!(err.kind(), ErrorKind::InvalidSignature) => continue,
                Err(_) => return Err("the token is malformed or its claims are not valid"),
            }
        }
        claims.ok_or(match tried {
            true => "the token's signature does not verify",
            false => "no key can verify the token",
        })
    }

    /// What verified `claims` say: the issuer and audience are checked, `exp` and
    /// `nbf` read, the consumer and plan named.
    fn read_claims(&self, claims: Map<String, Value>) -> Result<Verified, &'static str> {
        // A NumericDate may have a fraction (RFC 7519 section 2): `exp` is rounded
        // down and `nbf` up to the second the clock counts in, the strict way, and
        // an instant before 1970 is 1970.
        let seconds = |name: &str, round: fn(f64) -> f64| match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(Some(n.as_u64().unwrap_or_else(|| {
                // Saturating: a date beyond u64 seconds is the end of time.
                n.as_f64().map_or(0, |f| round(f).max(0.0) as u64)
            }))),
            Some(_) => Err("exp and nbf must be numbers"),
        };
        if !self.issuer.is_empty()
            && !matches!(claims.get("iss"), Some(Value::String(iss)) if self.issuer.contains(iss))
        {
            return Err("the token's issuer is not accepted");
        }
        if !self.audience.is_empty() && !audience_accepted(claims.get("aud"), &self.audience) {
            return Err("the token's audience is not accepted");
        }
        let exp_s = seconds("exp", f64::floor)?.ok_or("the token has no exp")?;
        let nbf_s = seconds("nbf", f64::ceil)?;
        let consumer = match claims.get(&self.consumer_claim) {
            Some(Value::String(name)) if super::is_caller_name(name.as_bytes()) => {
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
            who: Who::Disabled,
            exp_s,
            nbf_s,
            key: None,
        })
    }
}

/// A token's verified claims, and the life of the fetched key that verified them.
type Claims = (Map<String, Value>, Option<Arc<KeyLife>>);

/// Whether a token's `aud` (a string, or an array of strings) holds one of
/// `accepted`; any other shape, or an array with something else in it, is not.
fn audience_accepted(aud: Option<&Value>, accepted: &[String]) -> bool {
    match aud {
        Some(Value::String(one)) => accepted.contains(one),
        Some(Value::Array(many)) => {
            many.iter().all(Value::is_string)
                && many
                    .iter()
                    .any(|v| v.as_str().is_some_and(|a| accepted.iter().any(|x| x == a)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
