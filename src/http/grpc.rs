//! gRPC as sluice meets it: which requests are gRPC calls, what their `grpc-timeout`
//! says, the gRPC status each of sluice's refusals becomes, and `grpc-message`'s
//! percent-encoding.
//!
//! A gRPC call is an HTTP/2 request whose `content-type` is `application/grpc` or
//! `application/grpc+proto`, `+json`, ... (`application/grpc-web*` is another
//! protocol, passed as plain HTTP). This module reads heads; it forwards nothing and
//! builds no response (the refusal's gRPC form is `refusal`'s).

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, Version};
use percent_encoding::{AsciiSet, CONTROLS};

/// `grpc-timeout`.
pub(crate) const TIMEOUT: &str = "grpc-timeout";
/// `grpc-status`.
pub(crate) const STATUS: &str = "grpc-status";
/// `grpc-message`.
pub(crate) const MESSAGE: &str = "grpc-message";
/// `grpc-retry-pushback-ms`: how long a client's retry policy waits.
pub(crate) const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Whether a request of `version` with `headers` is a gRPC call.
#[inline]
pub(crate) fn is_call(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_2
        && headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|value| is_grpc_type(value.as_bytes()))
}

/// `application/grpc`, alone or with a `+` subtype or parameters, in any case.
fn is_grpc_type(value: &[u8]) -> bool {
    const TYPE: &[u8] = b"application/grpc";
    value.len() >= TYPE.len()
        && value[..TYPE.len()].eq_ignore_ascii_case(TYPE)
        && matches!(value.get(TYPE.len()), None | Some(b'+' | b';'))
}

/// A `grpc-timeout` that is not `1*8DIGIT` and one of the units `H M S m u n`, or
/// that is sent twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("grpc-timeout must be 1 to 8 digits and a unit (H, M, S, m, u, n)")]
pub(crate) struct BadTimeout;

/// The call's `grpc-timeout`, if it sent one.
pub(crate) fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, BadTimeout> {
    let mut values = headers.get_all(TIMEOUT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(BadTimeout);
    }
    let bytes = value.as_bytes();
    let (unit, digits) = bytes.split_last().ok_or(BadTimeout)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BadTimeout);
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Ok(Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(BadTimeout),
    }))
}

/// The gRPC status codes' names, by code (`sluice_grpc_responses_total{code}`).
pub(crate) const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// `CANCELLED`: what a stream that ended without a status counts as when it was cut.
pub(crate) const CANCELLED: u8 = 1;
/// `UNKNOWN`: a stream that ended without a status (what a client makes of it).
pub(crate) const UNKNOWN: u8 = 2;

/// The gRPC status of a refusal sluice answers with HTTP `status` (DESIGN.md's
/// table): limits and sizes are RESOURCE_EXHAUSTED, capacity and upstream failures
/// UNAVAILABLE, a timeout DEADLINE_EXCEEDED, and so on.
pub(crate) fn status_of_refusal(status: StatusCode) -> u8 {
    match status.as_u16() {
        429 | 413 | 414 | 431 => 8,
        502 | 503 => 14,
        504 | 408 => 4,
        401 => 16,
        403 => 7,
        404 => 12,
        400 => 3,
        _ => UNKNOWN,
    }
}

/// A `grpc-status` value as its code, if it is one.
pub(crate) fn code_of(value: &HeaderValue) -> Option<u8> {
    let code = std::str::from_utf8(value.as_bytes())
        .ok()?
        .parse::<u8>()
        .ok()?;
    (usize::from(code) < CODE_NAMES.len()).then_some(code)
}

/// What `grpc-message` percent-encodes: anything outside visible ASCII and space,
/// and `%` itself (the gRPC over HTTP/2 specification).
const MESSAGE_ESCAPED: &AsciiSet = &CONTROLS.add(b'%');

/// `text` as a `grpc-message` value.
pub(crate) fn message(text: &str) -> HeaderValue {
    let encoded = percent_encoding::utf8_percent_encode(text, MESSAGE_ESCAPED).to_string();
    HeaderValue::try_from(encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_calls_and_grpc_web_is_not() {
        let call = |version, content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::try_from(content_type).unwrap(),
            );
            is_call(version, &headers)
        };
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "Application/GRPC",
            "application/grpc;charset=utf-8",
        ] {
            assert!(call(Version::HTTP_2, yes), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "application/grpcx",
            "application/json",
        ] {
            assert!(!call(Version::HTTP_2, no), "{no}");
        }
        assert!(
            !call(Version::HTTP_11, "application/grpc"),
            "gRPC is HTTP/2"
        );
        assert!(!is_call(Version::HTTP_2, &HeaderMap::new()));
    }

    #[test]
    fn grpc_timeouts_are_read_in_every_unit_and_malformed_ones_refused() {
        let read = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(TIMEOUT, HeaderValue::try_from(*value).unwrap());
            }
            timeout(&headers)
        };
        assert_eq!(read(&[]), Ok(None));
        for (value, expected) in [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("250m", Duration::from_millis(250)),
            ("99999999u", Duration::from_micros(99_999_999)),
            ("5n", Duration::from_nanos(5)),
            ("0S", Duration::ZERO),
        ] {
            assert_eq!(read(&[value]), Ok(Some(expected)), "{value}");
        }
        for bad in [
            "",
            "S",
            "10",
            "10s",
            "123456789S",
            "-1S",
            "1.5S",
            " 1S",
            "1 S",
            "1SS",
        ] {
            assert_eq!(read(&[bad]), Err(BadTimeout), "{bad:?}");
        }
        assert_eq!(read(&["1S", "2S"]), Err(BadTimeout), "sent twice");
    }

    #[test]
    fn refusals_map_to_designs_grpc_statuses() {
        for (status, code) in [
            (429, "RESOURCE_EXHAUSTED"),
            (503, "UNAVAILABLE"),
            (502, "UNAVAILABLE"),
            (504, "DEADLINE_EXCEEDED"),
            (401, "UNAUTHENTICATED"),
            (403, "PERMISSION_DENIED"),
            (404, "UNIMPLEMENTED"),
            (400, "INVALID_ARGUMENT"),
            (413, "RESOURCE_EXHAUSTED"),
            (431, "RESOURCE_EXHAUSTED"),
        ] {
            let got = status_of_refusal(StatusCode::from_u16(status).unwrap());
            assert_eq!(CODE_NAMES[usize::from(got)], code, "{status}");
        }
    }

    #[test]
    fn a_grpc_message_is_percent_encoded() {
        assert_eq!(
            message("per_minute limit of 5 for plan anonymous: 100% ✓\n"),
            "per_minute limit of 5 for plan anonymous: 100%25 %E2%9C%93%0A"
        );
        assert_eq!(code_of(&HeaderValue::from_static("8")), Some(8));
        assert_eq!(code_of(&HeaderValue::from_static("17")), None);
        assert_eq!(code_of(&HeaderValue::from_static("x")), None);
    }
}
