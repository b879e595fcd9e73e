//! sluice: a rate-limiting API gateway.
//!
//! `docs/architecture.md` draws the whole picture.

#![forbid(unsafe_code)]

pub(crate) mod admin;
pub(crate) mod admission;
pub mod app;
pub mod clock;
pub(crate) mod concurrency;
pub mod config;
pub mod gateway;
pub(crate) mod http;
pub(crate) mod identity;
pub mod limit;
pub(crate) mod meter;
pub(crate) mod observe;
pub(crate) mod proxy;
pub(crate) mod server;
pub(crate) mod snapshot;
pub mod store;
pub mod tls;
