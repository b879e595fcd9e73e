//! Edge and HTTP: what a client and an upstream see of the front door. Hostile
//! bytes and framing (`edge`), forwarding (`proxy`), HTTP/1.1 keep-alive, TLS
//! termination, HTTP/2 floods, fuzzed request heads and configs, and the access log
//! with its request ids.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod access_log;
mod edge;
mod flood;
mod fuzz;
mod goaway;
mod keep_alive;
mod proxy;
mod tls;
