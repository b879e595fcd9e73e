//! gRPC as the decision listener speaks it: one unary message in, one out.
//!
//! A request's message is read whole, up to a size bound (beyond it:
//! `RESOURCE_EXHAUSTED`, as gRPC servers answer a message over their maximum), from
//! its 5-byte length prefix; a compressed, cut or doubled message is refused. An
//! answer is the message and a `grpc-status: 0` trailer, or a trailers-only status.
//! The messages themselves are Envoy's generated types (`envoy-types`, prost);
//! this module only frames them.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::http::body::Body;

/// The gRPC status codes the listener answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// Whether `request` is a gRPC call (`application/grpc`, `application/grpc+proto`).
pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    (request.headers().get(CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The one message of `request`'s body, at most `limit` bytes.
pub(super) async fn read_message(
    request: Request<Incoming>,
    limit: usize,
) -> Result<Bytes, (Code, String)> {
    let compressed = request
        .headers()
        .get("grpc-encoding")
        .is_some_and(|e| e.as_bytes() != b"identity");
    let body = Limited::new(request.into_body(), limit + 5);
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            let reason = format!("the request message is larger than {limit} bytes");
            return Err((Code::ResourceExhausted, reason));
        }
        Err(err) => {
            return Err((
                Code::InvalidArgument,
                format!("cannot read the request: {err}"),
            ));
        }
    };
    let Some((&[flag, a, b, c, d], message)) = bytes.split_first_chunk::<5>() else {
        return Err((Code::InvalidArgument, "no request message".into()));
    };
    if flag != 0 || compressed {
        let reason = "compressed messages are not accepted (send grpc-encoding identity)";
        return Err((Code::Unimplemented, reason.into()));
    }
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if length != message.len() {
        let reason = "the request must be exactly one whole message";
        return Err((Code::InvalidArgument, reason.into()));
    }
    Ok(bytes.slice(5..))
}

/// An answer carrying `message` (encoded) and status OK.
pub(super) fn message(message: &impl prost::Message) -> Response<Body> {
    let length = message.encoded_len();
    let mut framed = BytesMut::with_capacity(5 + length);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    if message.encode(&mut framed).is_err() {
        return status(Code::Internal, "cannot encode the answer");
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(Body::trailed(framed.freeze(), trailers));
    (response.headers_mut()).insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A trailers-only answer: `code` and `reason`, no message.
pub(super) fn status(code: Code, reason: &str) -> Response<Body> {
    let mut response = Response::new(Body::full(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code as u16));
    let encoded = percent_encoding::utf8_percent_encode(reason, MESSAGE).to_string();
    if let Ok(value) = HeaderValue::try_from(encoded) {
        headers.insert("grpc-message", value);
    }
    response
}

/// What `grpc-message` percent-encodes: anything but printable ASCII, and `%`.
const MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
