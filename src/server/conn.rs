//! What a request knows about the connection it came on: the peer, the listener's
//! address, and what was negotiated (scheme, ALPN protocol).
//!
//! The server builds one [`ConnInfo`] per accepted connection and hands a copy to the
//! handler with every request; nothing here is read from the request itself, so a
//! client cannot forge it.

use std::net::SocketAddr;

/// The scheme a client used to reach sluice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// `http` or `https`, as `X-Forwarded-Proto` carries it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// The application protocol a TLS handshake settled on (RFC 7301).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alpn {
    H2,
    Http11,
}

/// One connection's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    /// The address the connection came from (a proxy's, when behind one).
    pub peer: SocketAddr,
    /// The listener's address the connection was accepted on.
    pub local: SocketAddr,
    pub scheme: Scheme,
    /// What ALPN negotiated; `None` without TLS or without ALPN.
    pub alpn: Option<Alpn>,
}

impl ConnInfo {
    /// A plain-TCP connection from `peer` accepted on `local`.
    pub(crate) fn plain(peer: SocketAddr, local: SocketAddr) -> ConnInfo {
        ConnInfo {
            peer,
            local,
            scheme: Scheme::Http,
            alpn: None,
        }
    }
}
