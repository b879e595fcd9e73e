//! What goes wrong when forwarding ([`ProxyError`]), and what the client is told of it:
//! each error becomes its [`Refusal`] here, in one `From`.

use crate::http::refusal::{Oversize, Refusal};

/// Why a request could not be forwarded, or its response not passed on. Each carries
/// what the client's answer and the access log need: the upstream's name and the
/// target tried last.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// No connection to the target could be made: refused, not made within
    /// `connect_timeout`, or a failed TLS handshake.
    #[error("upstream {upstream}: no connection to {target}: {source}")]
    Connect {
        upstream: String,
        target: String,
        source: std::io::Error,
    },
    /// The connection failed while the request was sent or before the response head.
    #[error("upstream {upstream}: the exchange with {target} failed: {source}")]
    Exchange {
        upstream: String,
        target: String,
        source: hyper::Error,
    },
    /// The response must not reach the client: framing its parser could read
    /// differently from hyper's, or a protocol switch nobody asked for.
    #[error("upstream {upstream}: the response of {target} was refused: {reason}")]
    BadResponse {
        upstream: String,
        target: String,
        reason: &'static str,
    },
    /// The path makes no valid request target with the target's base path.
    #[error("upstream {upstream}: no valid request target for {target}")]
    BadUri { upstream: String, target: String },
    /// No response head within the upstream's `timeout`; `target` is none if the
    /// request could not be addressed to any.
    #[error("upstream {upstream} did not answer in time")]
    Timeout {
        upstream: String,
        target: Option<String>,
    },
    /// A gRPC call for an upstream that speaks HTTP/1.1.
    #[error("upstream {upstream} speaks HTTP/1.1, a gRPC call needs HTTP/2")]
    NeedsH2 { upstream: String },
    /// The client's body grew larger than `max_body_bytes`.
    #[error("the request body is larger than server.max_body_bytes")]
    BodyTooLarge,
    /// The client's body paused longer than `body_timeout`, or came slower than
    /// `min_body_rate`.
    #[error("the request body arrived too slowly (server.body_timeout, server.min_body_rate)")]
    BodyTooSlow,
    /// The client's body broke off or was not valid chunked framing.
    #[error("the request body is malformed or was cut off")]
    BadBody,
}

impl From<ProxyError> for Refusal {
    /// What the client is answered when forwarding failed: 502 for a target that
    /// could not be reached or answered what must not reach the client, 504 for no
    /// answer in time, and the refusals of a client body cut by a limit.
    fn from(err: ProxyError) -> Refusal {
        match err {
            ProxyError::Connect {
                upstream, target, ..
            }
            | ProxyError::Exchange {
                upstream, target, ..
            }
            | ProxyError::BadResponse {
                upstream, target, ..
            }
            | ProxyError::BadUri { upstream, target } => Refusal::BadGateway {
                upstream,
                target: Some(target),
                rate: None,
            },
            ProxyError::Timeout { upstream, target } => Refusal::GatewayTimeout {
                upstream,
                target,
                rate: None,
            },
            ProxyError::NeedsH2 { upstream } => Refusal::NeedsH2 { upstream },
            ProxyError::BodyTooLarge => Refusal::TooLarge(Oversize::Body),
            ProxyError::BodyTooSlow => Refusal::BodyTimeout,
            ProxyError::BadBody => Refusal::BadBody,
        }
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::http::refusal::Outcome;

    #[test]
    fn proxy_errors_become_gateway_answers_and_client_body_refusals() {
        let (upstream, target) = (|| "shop".to_string(), || "127.0.0.1:9".to_string());
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let cases = [
            (
                ProxyError::Connect {
                    upstream: upstream(),
                    target: target(),
                    source: refused,
                },
                StatusCode::BAD_GATEWAY,
                Some("127.0.0.1:9"),
            ),
            (
                ProxyError::BadResponse {
                    upstream: upstream(),
                    target: target(),
                    reason: "more than one Content-Length",
                },
                StatusCode::BAD_GATEWAY,
                Some("127.0.0.1:9"),
            ),
            (
                ProxyError::BadUri {
                    upstream: upstream(),
                    target: target(),
                },
                StatusCode::BAD_GATEWAY,
                Some("127.0.0.1:9"),
            ),
            (
                ProxyError::Timeout {
                    upstream: upstream(),
                    target: Some(target()),
                },
                StatusCode::GATEWAY_TIMEOUT,
                Some("127.0.0.1:9"),
            ),
            (
                ProxyError::BodyTooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
            ),
            (ProxyError::BodyTooSlow, StatusCode::REQUEST_TIMEOUT, None),
            (ProxyError::BadBody, StatusCode::BAD_REQUEST, None),
        ];
        for (err, status, logged) in cases {
            let client_body = logged.is_none();
            let refusal = Refusal::from(err);
            assert_eq!(refusal.status(), status, "{refusal:?}");
            assert_eq!(refusal.target(), logged, "{refusal:?}");
            assert_eq!(refusal.closes_connection(), client_body, "{refusal:?}");
            if !client_body {
                assert_eq!(refusal.outcome(), Outcome::UpstreamError);
                assert!(
                    refusal.to_string().starts_with("upstream shop "),
                    "{refusal}"
                );
            }
        }
    }
}
