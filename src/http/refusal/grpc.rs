//! A refusal in gRPC's own terms: a gRPC client reads `grpc-status`, not an HTTP
//! status, so a refused call is answered HTTP 200, trailers-only (one HEADERS frame
//! that ends the stream), with the status DESIGN.md's table gives the refusal, its
//! detail as a percent-encoded `grpc-message`, and the headers the HTTP answer would
//! carry (`RateLimit`, `Retry-After`) plus `grpc-retry-pushback-ms`.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::Refusal;
use crate::http::body::Body;
use crate::http::grpc;

impl Refusal {
    /// The refusal's answer to a gRPC call.
    pub(crate) fn into_grpc_response(self) -> Response<Body> {
        let message = grpc::message(&self.to_string());
        let (mut head, _) = self.into_response().into_parts();
        let code = grpc::status_of_refusal(head.status);
        head.status = StatusCode::OK;
        let h = &mut head.headers;
        h.remove(CONTENT_LENGTH);
        h.remove(CONNECTION);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(
            HeaderName::from_static(grpc::STATUS),
            HeaderValue::from(u16::from(code)),
        );
        h.insert(HeaderName::from_static(grpc::MESSAGE), message);
        let pushback = h
            .get(RETRY_AFTER)
            .and_then(|secs| secs.to_str().ok()?.parse::<u64>().ok());
        if let Some(secs) = pushback {
            h.insert(
                HeaderName::from_static(grpc::PUSHBACK),
                HeaderValue::from(secs.saturating_mul(1000)),
            );
        }
        Response::from_parts(head, Body::full(Bytes::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_call_is_a_trailers_only_answer_with_its_grpc_status() {
        let response = Refusal::Banned {
            until_ms: 30_500,
            now_ms: 0,
        }
        .into_grpc_response();
        assert_eq!(response.status(), StatusCode::OK);
        let h = response.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "7");
        assert_eq!(
            h["grpc-message"],
            "this caller is banned; Retry-After says for how long"
        );
        assert_eq!(h["retry-after"], "31");
        assert_eq!(h["grpc-retry-pushback-ms"], "31000");
        assert!(!h.contains_key("content-length"));
        assert!(hyper::body::Body::is_end_stream(response.body()));

        let response = Refusal::NeedsH2 {
            upstream: "greeter".to_string(),
        }
        .into_grpc_response();
        let h = response.headers();
        assert_eq!(h["grpc-status"], "14");
        assert_eq!(
            h["grpc-message"],
            "upstream greeter speaks HTTP/1.1; a gRPC call needs protocol = \"h2\" in [upstreams.greeter]"
        );
        assert!(!h.contains_key("grpc-retry-pushback-ms"));
    }
}
