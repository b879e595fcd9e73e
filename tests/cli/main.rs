//! The `sluice` binary as an operator runs it: its commands (`cli`), the container
//! image's way of starting and probing it, and every example config.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod check_more;
mod cli;
mod container;
mod examples;
mod log_flood;
