//! Browser sessions for the status page: `POST /login` with the admin token in a
//! form sets a session cookie, which then authorises what the bearer token does.
//!
//! The token never travels in a URL: only in an `Authorization` header or the login
//! form's body. The cookie is `HttpOnly` (no script reads it) and `SameSite=Strict`
//! (no other site's page sends it); its value is 32 random bytes, of which this
//! process keeps only the SHA-256, at most [`MAX_SESSIONS`] of them, each for
//! [`LIFETIME`]. A restart ends every session.
//!
//! Requests that change something (any method but GET and HEAD) and are authorised
//! by the cookie alone must also carry `X-CSRF-Token`, a value derived from the
//! session that the page holds and another site cannot read, and, when they carry
//! `Origin`, this listener's own. A bearer-authorised request needs neither: a
//! browser never adds that header by itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use http::header::{COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::status::{html, nonce};
use super::{Admin, problem, read_body};
use crate::http::body::Body;

/// The session cookie's name.
pub(super) const COOKIE_NAME: &str = "sluice_admin";
/// The header a cookie-authorised change must carry.
pub(super) const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lasts: a working day, so an incident does not log anyone out.
pub(super) const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; a new one past it replaces the one closest to its end.
const MAX_SESSIONS: usize = 256;

/// The live sessions, by the SHA-256 of their cookie's value.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    live: Mutex<HashMap<[u8; 32], Instant>>,
}

/// A session found on a request.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The value the page must send back in `X-CSRF-Token`.
    pub csrf: String,
}

impl Sessions {
    /// Opens a session; returns the cookie's value (64 hex digits), or `None` if no
    /// random bytes could be had.
    pub(super) fn open(&self) -> Option<String> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).ok()?;
        let value = const_hex::encode(secret);
        let now = Instant::now();
        let mut live = self.live.lock();
        live.retain(|_, until| *until > now);
        if live.len() >= MAX_SESSIONS
            && let Some(oldest) = live
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(k, _)| *k)
        {
            live.remove(&oldest);
        }
        live.insert(digest(&value), now + LIFETIME);
        Some(value)
    }

    /// The live session whose cookie `headers` carry, if any.
    pub(super) fn find(&self, headers: &HeaderMap) -> Option<Session> {
        let value = cookie(headers)?;
        let until = *self.live.lock().get(&digest(value))?;
        (until > Instant::now()).then(|| Session { csrf: csrf(value) })
    }

    /// Ends the session whose cookie `headers` carry.
    pub(super) fn close(&self, headers: &HeaderMap) {
        if let Some(value) = cookie(headers) {
            self.live.lock().remove(&digest(value));
        }
    }
}

impl Session {
    /// Whether a change authorised by this session comes from its page: the
    /// `X-CSRF-Token` it was given, and no foreign `Origin`.
    pub(super) fn allows_change(&self, headers: &HeaderMap) -> bool {
        let presented = headers
            .get(CSRF_HEADER)
            .map_or(&b""[..], HeaderValue::as_bytes);
        let matches = bool::from(presented.ct_eq(self.csrf.as_bytes()));
        matches && same_origin(headers)
    }
}

/// Whether `Origin`, when present, names the host the request was sent to.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(ORIGIN) else {
        return true;
    };
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    let origin = origin.to_str().ok();
    let origin_host = origin
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

impl Admin {
    /// `GET /login`: the form. `POST /login` with the token in the form's body: a
    /// session, and back to the page (303); a wrong token is a 401 and the form
    /// again, slowed down as wrong bearer tokens are.
    pub(super) async fn login(&self, request: Request<Incoming>, peer: IpAddr) -> Response<Body> {
        match *request.method() {
            Method::GET | Method::HEAD => return self.login_page(StatusCode::OK, false),
            Method::POST => {}
            _ => {
                let mut response = problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed on this path",
                );
                (response.headers_mut())
                    .insert(http::header::ALLOW, HeaderValue::from_static("GET, POST"));
                return response;
            }
        }
        let Some(token) = self.token else {
            return see_other(None);
        };
        if !same_origin(request.headers()) {
            return problem(
                StatusCode::FORBIDDEN,
                "a login must come from this listener's own page",
            );
        }
        let body = match read_body(request).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        let presented = form_urlencoded::parse(&body)
            .find(|(name, _)| name == "token")
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        if !self.is_token(presented.trim().as_bytes(), &token) {
            tokio::time::sleep(self.failed_from(peer)).await;
            return self.login_page(StatusCode::UNAUTHORIZED, true);
        }
        match self.sessions.open() {
            Some(value) => see_other(Some(set_cookie(&value))),
            None => problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no random bytes for a session",
            ),
        }
    }

    /// `POST /logout` (with the page's CSRF token): ends the session.
    pub(super) fn logout(&self, request: &Request<Incoming>) -> Response<Body> {
        self.sessions.close(request.headers());
        see_other(Some(clear_cookie()))
    }

    /// The login form, with `status`; `failed` says the last token was wrong.
    pub(super) fn login_page(&self, status: StatusCode, failed: bool) -> Response<Body> {
        match nonce() {
            Some(nonce) => html(status, super::status::page::login(&nonce, failed), &nonce),
            None => problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "no random bytes for a nonce",
            ),
        }
    }
}

/// 303 to the status page, setting `cookie` if given.
fn see_other(cookie: Option<String>) -> Response<Body> {
    let mut response = Response::new(Body::full(Vec::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    headers.insert(LOCATION, HeaderValue::from_static("/"));
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::try_from(c).ok()) {
        headers.insert(SET_COOKIE, cookie);
    }
    response
}

/// The `Set-Cookie` value of a new session.
pub(super) fn set_cookie(value: &str) -> String {
    format!(
        "{COOKIE_NAME}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub(super) fn clear_cookie() -> String {
    format!("{COOKIE_NAME}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

/// The session cookie's value among the request's cookies.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value)
        .filter(|value| value.len() == 64)
}

fn digest(value: &str) -> [u8; 32] {
    Sha256::digest(value.as_bytes()).into()
}

/// The CSRF token of a session: derived from its secret, so it needs no storage and
/// tells nothing of the cookie.
fn csrf(value: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"sluice csrf\0");
    hash.update(value.as_bytes());
    const_hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::{Sessions, same_origin, set_cookie};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_session_is_found_by_its_cookie_and_ends_when_closed() {
        let sessions = Sessions::default();
        let value = sessions.open().unwrap();
        assert!(set_cookie(&value).contains("HttpOnly; SameSite=Strict"));
        let cookie = format!("theme=dark; sluice_admin={value}");
        let with = headers(&[("cookie", &cookie)]);
        let session = sessions.find(&with).unwrap();
        assert_ne!(session.csrf, value);
        assert!(
            sessions
                .find(&headers(&[("cookie", "sluice_admin=00")]))
                .is_none()
        );
        let forged = format!("sluice_admin={}", "0".repeat(64));
        assert!(sessions.find(&headers(&[("cookie", &forged)])).is_none());
        sessions.close(&with);
        assert!(sessions.find(&with).is_none());
    }

    #[test]
    fn a_change_needs_the_csrf_token_and_no_foreign_origin() {
        let sessions = Sessions::default();
        let value = sessions.open().unwrap();
        let cookie = format!("sluice_admin={value}");
        let session = sessions.find(&headers(&[("cookie", &cookie)])).unwrap();
        let csrf = session.csrf.clone();
        assert!(!session.allows_change(&headers(&[])));
        assert!(!session.allows_change(&headers(&[("x-csrf-token", "nope")])));
        assert!(session.allows_change(&headers(&[("x-csrf-token", &csrf)])));
        let ours = [("x-csrf-token", csrf.as_str()), ("host", "127.0.0.1:9090")];
        let mut own = ours.to_vec();
        own.push(("origin", "http://127.0.0.1:9090"));
        assert!(session.allows_change(&headers(&own)));
        let mut foreign = ours.to_vec();
        foreign.push(("origin", "https://evil.example"));
        assert!(!session.allows_change(&headers(&foreign)));
        assert!(same_origin(&headers(&[])));
    }
}
