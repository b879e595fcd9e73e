//! HTTP as sluice speaks it, below any decision: the checks a request head must pass,
//! path normalisation, the HTTP/1 wire scanner, request ids, the `RateLimit` headers,
//! every response's body, every refusal turned into a response, the headers sluice
//! rewrites on the way upstream (`rewritten`), sluice's own outbound requests
//! (`client`), which requests ask for a WebSocket and how their connection is
//! given over (`upgrade`), the CORS rules browsers are answered with (`cors`), and
//! which requests are gRPC calls and what their heads say (`grpc`).
//!
//! Nothing here decides whether a request may go ahead (admission does), forwards
//! it (proxy does) or accepts connections (server does).

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod cors;
pub(crate) mod grpc;
pub(crate) mod head;
pub(crate) mod path;
pub(crate) mod rate_headers;
pub(crate) mod refusal;
pub(crate) mod request_id;
pub(crate) mod rewritten;
pub(crate) mod upgrade;
pub(crate) mod wire;
