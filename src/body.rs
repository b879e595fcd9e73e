//! The response body type: bytes sluice wrote itself, or an upstream's stream.

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;

/// Body of every response sluice sends: a local `Full` or the upstream's `Incoming`.
pub type Body = Either<Full<Bytes>, Incoming>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Either::Left(Full::new(bytes.into()))
}
