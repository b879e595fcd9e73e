//! The `[server]` section's runtime types, split by when a setting takes effect:
//! [`ServerStartup`] is read once, when the listeners start, and [`ServerLive`] is
//! read from the config snapshot by every request.
//!
//! The split is what a reload goes by: a changed start-up setting is reported as
//! restart-only under its TOML key ([`ServerStartup::changed`]), a changed live one
//! applies to the next request. The TOML schema is flat (`[server]` holds both);
//! `settings` compiles it into these types. This module does not read the file.

use std::net::SocketAddr;
use std::time::Duration;

use super::TlsConfig;
use crate::http::head::SizeLimits;

/// `[server]`: the client-facing listeners and their limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Settings the listeners are started with; a reload reports their changes and
    /// keeps the running values until a restart.
    pub startup: ServerStartup,
    /// Settings every request reads from the config snapshot; a reload applies them.
    pub live: ServerLive,
}

impl ServerConfig {
    /// The sizes a request head is checked against.
    pub(crate) fn size_limits(&self) -> SizeLimits {
        SizeLimits {
            uri_bytes: self.live.max_uri_bytes,
            header_bytes: self.startup.max_header_bytes,
            body_bytes: self.live.max_body_bytes,
        }
    }
}

/// The `[server]` settings that take effect only when the listeners start: sockets,
/// threads, hyper's buffers and per-connection timers are set up with them.
///
/// Every field is a `server.<field>` TOML key, listed in [`ServerStartup::KEYS`]; a
/// field added here must be added to that list (it does not compile otherwise), so
/// a reload reports its changes as restart-only without further code.
#[derive(Debug, Clone)]
pub struct ServerStartup {
    /// The plain-HTTP listen addresses.
    pub listen: Vec<SocketAddr>,
    /// Worker threads serving client connections; 0 = one per core.
    pub worker_threads: usize,
    /// Connections served at once per listen address; further clients wait in the
    /// kernel's backlog.
    pub max_connections: usize,
    /// How long a request head may take, counted from the connection's open (TLS
    /// handshake included) or its previous response's end.
    pub header_timeout: Duration,
    /// A connection that moves no byte for this long is closed.
    pub idle_timeout: Duration,
    /// The largest request head (431 above): hyper's read buffer and HTTP/2 header
    /// list are sized from it at start.
    pub max_header_bytes: usize,
    /// `[server.tls]`, if TLS is terminated (the certificate files themselves are
    /// re-read when they change).
    pub tls: Option<TlsConfig>,
    /// Concurrent streams per HTTP/2 connection.
    pub h2_max_streams: u32,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub drain_timeout: Duration,
}

/// The `[server]` settings read per request from the config snapshot: a reload
/// applies them to the next request.
#[derive(Debug, Clone)]
pub struct ServerLive {
    /// Longest request target (414 above).
    pub max_uri_bytes: usize,
    /// Largest request body (413 above); 0 = no limit.
    pub max_body_bytes: u64,
    /// Longest pause between two pieces of a request body (408).
    pub body_timeout: Duration,
    /// Bytes a second a request body must average once it has taken 10 s (408
    /// below); 0 = no minimum.
    pub min_body_rate: u64,
    /// An open WebSocket that moves no byte either way for this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// `cors`: browsers' rules for every route without its own (and for answers
    /// made before a route is known).
    pub(crate) cors: Option<std::sync::Arc<crate::http::cors::Cors>>,
}

/// Implements `KEYS` and `changed` for a settings struct whose fields are the TOML
/// keys of `$section`. The struct is destructured without `..`, so a field left out
/// of the list is a compile error, and each key is spelled from its field's name.
macro_rules! keyed_settings {
    ($settings:ident in $section:literal: $($field:ident),+ $(,)?) => {
        impl $settings {
            /// The TOML key of every setting, in declaration order.
            pub const KEYS: &'static [&'static str] =
                &[$(concat!($section, ".", stringify!($field))),+];

            /// The TOML keys of the settings whose values differ in `new`.
            pub fn changed(&self, new: &$settings) -> Vec<&'static str> {
                let $settings { $($field),+ } = self;
                let mut changed = Vec::new();
                $(
                    if *$field != new.$field {
                        changed.push(concat!($section, ".", stringify!($field)));
                    }
                )+
                changed
            }
        }
    };
}

keyed_settings!(ServerStartup in "server":
    listen,
    worker_threads,
    max_connections,
    header_timeout,
    idle_timeout,
    max_header_bytes,
    tls,
    h2_max_streams,
    drain_timeout,
);

/// One changed copy of `base` per start-up setting, under its TOML key: what tests
/// of the restart-only report go through. A setting added to [`ServerStartup`]
/// needs an entry here (a test checks that every key has one).
#[cfg(test)]
pub(crate) fn one_change_each(base: &ServerStartup) -> Vec<(&'static str, ServerStartup)> {
    let change = |key, edit: fn(&mut ServerStartup)| {
        let mut changed = base.clone();
        edit(&mut changed);
        (key, changed)
    };
    let tls = TlsConfig {
        listen: vec![SocketAddr::from(([127, 0, 0, 1], 8443))],
        cert: "cert.pem".into(),
        key: "key.pem".into(),
        sni: Vec::new(),
        tls13_only: false,
    };
    vec![
        change("server.listen", |s| {
            s.listen.push(([127, 0, 0, 1], 1).into())
        }),
        change("server.worker_threads", |s| s.worker_threads += 1),
        change("server.max_connections", |s| s.max_connections += 1),
        change("server.header_timeout", |s| {
            s.header_timeout += Duration::from_secs(1)
        }),
        change("server.idle_timeout", |s| {
            s.idle_timeout += Duration::from_secs(1)
        }),
        change("server.max_header_bytes", |s| s.max_header_bytes += 1),
        {
            let mut changed = base.clone();
            changed.tls = match &base.tls {
                None => Some(tls),
                Some(_) => None,
            };
            ("server.tls", changed)
        },
        change("server.h2_max_streams", |s| s.h2_max_streams += 1),
        change("server.drain_timeout", |s| {
            s.drain_timeout += Duration::from_secs(1)
        }),
    ]
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn defaults() -> ServerStartup {
        Config::parse(Path::new("gateway.toml"), "")
            .expect("an empty file compiles")
            .server
            .startup
    }

    #[test]
    fn every_startup_setting_has_a_change_in_the_tests() {
        let keys: Vec<&str> = one_change_each(&defaults())
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(keys, ServerStartup::KEYS);
    }

    #[test]
    fn a_changed_startup_setting_is_named_by_its_key_alone() {
        let base = defaults();
        assert!(base.changed(&base.clone()).is_empty());
        for (key, changed) in one_change_each(&base) {
            assert_eq!(base.changed(&changed), [key], "changing {key}");
        }
    }

    #[test]
    fn every_startup_key_is_a_key_of_the_server_section() {
        for key in ServerStartup::KEYS {
            let field = key.strip_prefix("server.").expect("a [server] key");
            // A value no setting takes: an error about the key, not an unknown key.
            let text = format!("[server]\n{field} = []\n");
            let err = Config::parse(Path::new("gateway.toml"), &text)
                .expect_err("an empty array fits no setting")
                .to_string();
            assert!(err.contains(key), "{key}: {err}");
            assert!(!err.contains("unknown key"), "{key}: {err}");
        }
    }
}
