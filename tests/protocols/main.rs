//! The protocols sluice carries besides plain HTTP: WebSockets (upgrades, the
//! joined socket, its limits and its edges), browsers' CORS, HTTP/2 upstreams and
//! gRPC, with real clients and servers the tests start themselves (grpcio's,
//! hyper's and h2's, and raw HTTP/2 frames where a client library would not send
//! what is tested).

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod cors;
mod grpc;
mod h2_upstream;
mod message_limits;
mod sockets;
mod websocket;
mod websocket_edges;
mod websocket_h2;
