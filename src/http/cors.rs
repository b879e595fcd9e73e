//! CORS as sluice answers it for browsers ([`Cors`]): which preflights are allowed
//! (origin, method, headers) and what they are answered, and the headers every
//! response for an allowed origin carries, sluice's own refusals included, so that
//! browser code can read why it was limited and when to retry.
//!
//! A route's `cors` (or `[server] cors`) compiles into a [`Cors`]; this module
//! decides nothing about limits and routes: the gateway asks it.

use std::time::Duration;

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};

/// What sluice always exposes to browser code: why and when to retry.
pub(crate) const EXPOSED: &str = "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id";

/// The methods a route's `cors` allows when neither it nor the route names any.
pub(crate) const DEFAULT_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// Preflights a client IP may send upstream a second, by default.
pub(crate) const DEFAULT_PREFLIGHT_LIMIT: u32 = 10;

/// Who answers an allowed preflight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preflight {
    /// sluice: 204 with the `Access-Control-*` headers.
    Sluice,
    /// The upstream, at most this many a second per client IP (429 beyond).
    Upstream { per_second: u32 },
}

/// One route's CORS rules, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cors {
    /// `origins`, compared byte for byte; `None` for `["*"]`.
    pub(crate) origins: Option<Vec<HeaderValue>>,
    /// `methods` (or the route's, or [`DEFAULT_METHODS`]).
    pub(crate) methods: Vec<Method>,
    /// `methods` as a preflight answer lists them.
    pub(crate) allow_methods: HeaderValue,
    /// `headers`, lower-case; `None` allows any.
    pub(crate) headers: Option<Vec<HeaderName>>,
    /// [`EXPOSED`] and `expose`.
    pub(crate) expose: HeaderValue,
    pub(crate) credentials: bool,
    /// `max_age`, in whole seconds.
    pub(crate) max_age: Option<HeaderValue>,
    pub(crate) preflight: Preflight,
}

/// Why a preflight is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    Origin,
    Method,
    Header,
}

impl Denied {
    /// The problem's detail.
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Denied::Origin => "this origin may not call this route from a browser",
            Denied::Method => "this method is not allowed from a browser on this route",
            Denied::Header => "a requested header is not allowed from a browser on this route",
        }
    }
}

/// Whether `request` is a CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`.
pub(crate) fn is_preflight<B>(request: &Request<B>) -> bool {
    request.method() == Method::OPTIONS
        && request.headers().contains_key(ORIGIN)
        && request
            .headers()
            .contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The method a preflight asks about (the one that picks its route).
pub(crate) fn requested_method<B>(request: &Request<B>) -> Option<Method> {
    let value = request.headers().get(ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(value.as_bytes()).ok()
}

impl Cors {
    /// Builds the rules; `max_age` is sent in whole seconds.
    pub(crate) fn new(
        origins: Option<Vec<HeaderValue>>,
        methods: Vec<Method>,
        headers: Option<Vec<HeaderName>>,
        expose: &[HeaderName],
        credentials: bool,
        max_age: Option<Duration>,
        preflight: Preflight,
    ) -> Cors {
        let list = |names: Vec<&str>| HeaderValue::try_from(names.join(", ")).ok();
        let allow_methods = list(methods.iter().map(Method::as_str).collect())
            .expect("method names are header values");
        let mut exposed = vec![EXPOSED];
        exposed.extend(expose.iter().map(HeaderName::as_str));
        Cors {
            origins,
            allow_methods,
            methods,
            headers,
            expose: list(exposed).expect("header names are header values"),
            credentials,
            max_age: max_age.map(|age| HeaderValue::from(age.as_secs())),
            preflight,
        }
    }

    /// Whether `origin` may call the route from a browser.
    pub(crate) fn allows(&self, origin: &HeaderValue) -> bool {
        match &self.origins {
            None => true,
            Some(origins) => origins.iter().any(|allowed| allowed == origin),
        }
    }

    /// Checks a preflight's origin, method and requested headers.
    pub(crate) fn check_preflight(&self, request: &HeaderMap) -> Result<(), Denied> {
        let origin = request.get(ORIGIN).ok_or(Denied::Origin)?;
        if !self.allows(origin) {
            return Err(Denied::Origin);
        }
        let method = request
            .get(ACCESS_CONTROL_REQUEST_METHOD)
            .ok_or(Denied::Method)?;
        if !self
            .methods
            .iter()
            .any(|m| m.as_str().as_bytes() == method.as_bytes())
        {
            return Err(Denied::Method);
        }
        if let Some(allowed) = &self.headers {
            for value in request.get_all(ACCESS_CONTROL_REQUEST_HEADERS) {
                let names = value.to_str().map_err(|_| Denied::Header)?;
                for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !allowed
                        .iter()
                        .any(|a| a.as_str().eq_ignore_ascii_case(name))
                    {
                        return Err(Denied::Header);
                    }
                }
            }
        }
        Ok(())
    }

    /// The headers of an allowed preflight's answer, for `request`'s headers.
    pub(crate) fn answer_preflight(&self, request: &HeaderMap, headers: &mut HeaderMap) {
        strip(headers);
        let origin = request.get(ORIGIN).cloned();
        self.allow_origin(origin, headers);
        headers.insert(ACCESS_CONTROL_ALLOW_METHODS, self.allow_methods.clone());
        if let Some(requested) = request.get(ACCESS_CONTROL_REQUEST_HEADERS) {
            // Allowed (checked): named back as asked.
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, requested.clone());
        }
        if let Some(max_age) = &self.max_age {
            headers.insert(ACCESS_CONTROL_MAX_AGE, max_age.clone());
        }
    }

    /// Puts sluice's CORS headers on a response to a request from `origin` (its
    /// `Origin`, if it sent one): the upstream's own `Access-Control-*` go, and for
    /// an allowed origin sluice's come in.
    pub(crate) fn answer(&self, origin: Option<HeaderValue>, headers: &mut HeaderMap) {
        strip(headers);
        if let Some(origin) = origin.filter(|o| self.allows(o)) {
            self.allow_origin(Some(origin), headers);
            headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, self.expose.clone());
        }
    }

    /// `Access-Control-Allow-Origin` (`*`, or the origin itself with `Vary:
    /// Origin`) and `-Credentials`.
    fn allow_origin(&self, origin: Option<HeaderValue>, headers: &mut HeaderMap) {
        match (&self.origins, self.credentials, origin) {
            (None, false, _) | (_, _, None) => {
                headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            }
            (_, _, Some(origin)) => {
                headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                headers.append(VARY, HeaderValue::from_static("Origin"));
            }
        }
        if self.credentials {
            let yes = HeaderValue::from_static("true");
            headers.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, yes);
        }
    }
}

/// Removes every `Access-Control-*` header (the upstream's own).
fn strip(headers: &mut HeaderMap) {
    let found = headers
        .keys()
        .any(|name| name.as_str().starts_with("access-control-"));
    if found {
        let names: Vec<HeaderName> = (headers.keys())
            .filter(|name| name.as_str().starts_with("access-control-"))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: Option<&[&str]>, credentials: bool, headers: Option<&[&str]>) -> Cors {
        let origins = origins.map(|o| {
            o.iter()
                .map(|o| HeaderValue::from_str(o).unwrap())
                .collect()
        });
        let headers = headers.map(|h| {
            h.iter()
                .map(|h| HeaderName::try_from(*h).unwrap())
                .collect()
        });
        let expose = [HeaderName::from_static("x-trace")];
        let max_age = Some(Duration::from_secs(600));
        let methods = DEFAULT_METHODS.to_vec();
        Cors::new(
            origins,
            methods,
            headers,
            &expose,
            credentials,
            max_age,
            Preflight::Sluice,
        )
    }

    fn preflight(origin: &str, method: &str, headers: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(ORIGIN, origin.parse().unwrap());
        map.insert(ACCESS_CONTROL_REQUEST_METHOD, method.parse().unwrap());
        if !headers.is_empty() {
            map.insert(ACCESS_CONTROL_REQUEST_HEADERS, headers.parse().unwrap());
        }
        map
    }

    #[test]
    fn origins_compare_byte_for_byte_and_methods_and_headers_must_be_allowed() {
        let rules = cors(
            Some(&["https://app.example.com"]),
            true,
            Some(&["x-api-key"]),
        );
        let ok = preflight("https://app.example.com", "POST", "X-API-Key");
        assert_eq!(rules.check_preflight(&ok), Ok(()));
        let cases = [
            (
                preflight("https://app.example.com/", "POST", ""),
                Denied::Origin,
            ),
            (
                preflight("https://APP.example.com", "POST", ""),
                Denied::Origin,
            ),
            (
                preflight("https://app.example.com", "TRACE", ""),
                Denied::Method,
            ),
            (
                preflight("https://app.example.com", "post", ""),
                Denied::Method,
            ),
            (
                preflight("https://app.example.com", "GET", "x-api-key, x-other"),
                Denied::Header,
            ),
        ];
        for (request, denied) in cases {
            assert_eq!(rules.check_preflight(&request), Err(denied), "{request:?}");
        }
    }

    #[test]
    fn an_allowed_preflight_is_answered_with_what_it_asked_for() {
        let rules = cors(Some(&["https://app.example.com"]), true, None);
        let request = preflight("https://app.example.com", "PUT", "x-api-key, content-type");
        let mut headers = HeaderMap::new();
        headers.insert(
            "access-control-allow-origin",
            "https://evil.example".parse().unwrap(),
        );
        rules.answer_preflight(&request, &mut headers);
        assert_eq!(
            headers["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(headers["access-control-allow-credentials"], "true");
        assert_eq!(
            headers["access-control-allow-methods"],
            "GET, HEAD, POST, PUT, PATCH, DELETE"
        );
        assert_eq!(
            headers["access-control-allow-headers"],
            "x-api-key, content-type"
        );
        assert_eq!(headers["access-control-max-age"], "600");
        assert_eq!(headers["vary"], "Origin");
    }

    #[test]
    fn responses_expose_the_limit_headers_to_allowed_origins_only() {
        let rules = cors(None, false, None);
        let mut headers = HeaderMap::new();
        rules.answer(Some("http://a.test".parse().unwrap()), &mut headers);
        assert_eq!(headers["access-control-allow-origin"], "*");
        assert_eq!(
            headers["access-control-expose-headers"],
            "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, x-trace"
        );
        let listed = cors(Some(&["http://a.test"]), false, None);
        let mut headers = HeaderMap::new();
        headers.insert("access-control-allow-origin", "*".parse().unwrap());
        listed.answer(Some("http://b.test".parse().unwrap()), &mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }
}
