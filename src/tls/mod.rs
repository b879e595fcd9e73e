//! TLS on both sides: the PEM files (`pki`), the TLS listener's certificates chosen by
//! SNI (`certificates`), and the client side for https upstreams (`upstream`).
//!
//! This module does not accept connections (`server` runs the handshake) nor watch
//! files itself.

pub mod certificates;
pub mod pki;
pub(crate) mod upstream;
