//! `cors = { ... }` (a route's, or `[server]`'s for every route) into the
//! [`Cors`] rules the gateway answers browsers with, every problem with its key.

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};

use super::diagnostic::Diagnostics;
use super::raw;
use super::values::{duration_of, int_in};
use crate::http::cors::{Cors, DEFAULT_METHODS, DEFAULT_PREFLIGHT_LIMIT, Preflight};

/// The rules of `raw` at `key`; `route_methods` are what `methods` defaults to
/// (else GET, HEAD, POST, PUT, PATCH, DELETE). `None` when they cannot be used.
pub(super) fn compile_cors(
    d: &mut Diagnostics,
    key: &str,
    raw: &raw::Cors,
    route_methods: Option<&[Method]>,
) -> Option<Arc<Cors>> {
    let errors_before = d.error_count();
    let origins = compile_origins(d, key, raw);
    let methods = match &raw.methods {
        Some(methods) => methods
            .iter()
            .filter_map(|m| match Method::from_bytes(m.get_ref().as_bytes()) {
                Ok(method) => Some(method),
                Err(_) => {
                    let why = format!("\"{}\" is not an HTTP method", m.get_ref());
                    d.error(Some(m.span()), &format!("{key}.methods"), why);
                    None
                }
            })
            .collect(),
        None => route_methods.map_or_else(|| DEFAULT_METHODS.to_vec(), <[Method]>::to_vec),
    };
    let names = |d: &mut Diagnostics, field: &str, list: &[toml::Spanned<String>]| {
        list.iter()
            .filter_map(|name| match HeaderName::try_from(name.get_ref().as_str()) {
                Ok(name) => Some(name),
                Err(_) => {
                    let why = format!("\"{}\" is not a header name", name.get_ref());
                    d.error(Some(name.span()), &format!("{key}.{field}"), why);
                    None
                }
            })
            .collect::<Vec<_>>()
    };
    let headers = raw.headers.as_ref().map(|h| names(d, "headers", h));
    let expose = raw
        .expose
        .as_ref()
        .map(|e| names(d, "expose", e))
        .unwrap_or_default();
    let credentials = raw.credentials.unwrap_or(false);
    if credentials && origins.is_none() {
        let why = "origins = [\"*\"] with credentials = true: browsers refuse a wildcard \
                   origin with credentials; list the origins";
        d.error(Some(raw.origins.span()), &format!("{key}.credentials"), why);
    }
    let max_age = raw.max_age.as_ref().map(|age| {
        duration_of(
            d,
            &format!("{key}.max_age"),
            Some(age),
            std::time::Duration::ZERO,
        )
    });
    let preflight = compile_preflight(d, key, raw);
    if d.error_count() > errors_before {
        return None;
    }
    let cors = Cors::new(
        origins,
        methods,
        headers,
        &expose,
        credentials,
        max_age,
        preflight,
    );
    Some(Arc::new(cors))
}

/// `origins`: exact `scheme://host[:port]` strings, or `["*"]` (`None`).
fn compile_origins(d: &mut Diagnostics, key: &str, raw: &raw::Cors) -> Option<Vec<HeaderValue>> {
    let list = raw.origins.get_ref();
    if list.iter().any(|o| o == "*") {
        if list.len() > 1 {
            let why = "\"*\" allows every origin: it stands alone";
            d.error(Some(raw.origins.span()), &format!("{key}.origins"), why);
        }
        return None;
    }
    if list.is_empty() {
        let why = "no origin: list the origins browsers may call from, or [\"*\"]";
        d.error(Some(raw.origins.span()), &format!("{key}.origins"), why);
    }
    let origins = list
        .iter()
        .filter_map(|origin| {
            if !is_origin(origin) {
                let why = format!(
                    "\"{origin}\" is not an origin: scheme://host[:port], no path, no trailing slash"
                );
                d.error(Some(raw.origins.span()), &format!("{key}.origins"), why);
                return None;
            }
            HeaderValue::try_from(origin.as_str()).ok()
        })
        .collect();
    Some(origins)
}

/// Whether `text` is an origin as browsers send it: `scheme://host[:port]`.
fn is_origin(text: &str) -> bool {
    let Some((scheme, rest)) = text.split_once("://") else {
        return false;
    };
    let scheme_ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    let host_ok = !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' '])
        && rest.parse::<http::uri::Authority>().is_ok();
    scheme_ok && host_ok
}

/// `preflight` (`"sluice"` or `"upstream"`) and `preflight_limit`.
fn compile_preflight(d: &mut Diagnostics, key: &str, raw: &raw::Cors) -> Preflight {
    let limit = raw.preflight_limit.as_ref().map(|limit| {
        int_in(d, &format!("{key}.preflight_limit"), limit, 1, 1_000_000)
            .map_or(DEFAULT_PREFLIGHT_LIMIT, |l| l as u32)
    });
    match raw.preflight.as_ref().map(|p| (p, p.get_ref().as_str())) {
        None | Some((_, "sluice")) => {
            if let Some(limit) = &raw.preflight_limit {
                let why = "preflight_limit bounds preflights passed upstream: \
                           set preflight = \"upstream\" too";
                d.warn(Some(limit.span()), &format!("{key}.preflight_limit"), why);
            }
            Preflight::Sluice
        }
        Some((_, "upstream")) => Preflight::Upstream {
            per_second: limit.unwrap_or(DEFAULT_PREFLIGHT_LIMIT),
        },
        Some((spanned, other)) => {
            let why = format!("\"{other}\": expected \"sluice\" or \"upstream\"");
            d.error(Some(spanned.span()), &format!("{key}.preflight"), why);
            Preflight::Sluice
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_origin;

    #[test]
    fn an_origin_is_a_scheme_and_an_authority_only() {
        for good in [
            "https://app.example.com",
            "http://127.0.0.1:8080",
            "http://[::1]:3000",
        ] {
            assert!(is_origin(good), "{good}");
        }
        for bad in [
            "https://app.example.com/",
            "app.example.com",
            "https://",
            "https://a/b",
            "HTTPS://a",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }
}
