//! Operating a running gateway: the admin listener and the decision API (`admin`),
//! reloads, metrics, draining and the state file (`operability`), and the dashboard
//! and alert rules checked against what a gateway exports (`monitoring`).

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod admin;
mod monitoring;
mod open_admin;
mod operability;
mod usage_unknown;
