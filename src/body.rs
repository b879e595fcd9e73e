//! The response body type: bytes sluice wrote itself, or an upstream's stream.

use crate::pool::UpstreamBody;
use bytes::Bytes;
use http_body_util::{Either, Full};

/// Body of every response sluice sends: a local `Full` or an upstream's stream.
pub type Body = Either<Full<Bytes>, UpstreamBody>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Either::Left(Full::new(bytes.into()))
}
