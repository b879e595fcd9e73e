//! The store behind its contract: one conformance suite run against the memory
//! store and a private `redis-server`, and the limiter's hot path that allocates
//! nothing.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod conformance;
mod hot_path;
