//! What sluice tells its operators: the Prometheus metrics (`metrics`) and the access
//! log (`access_log`).
//!
//! Neither decides anything: they are told what happened.

pub(crate) mod access_log;
pub mod metrics;
