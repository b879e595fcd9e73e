//! sluice: a rate-limiting API gateway.
//!
//! The map, layer by layer from the bottom; each module imports only modules of its
//! own layer or below (`scripts/check-layers` fails on a cycle), and
//! `docs/architecture.md` tells the life of a request through them.
//!
//! **Foundations**, which know nothing of gateways. `clock` is the only wall-clock
//! reader. `limit` is the pure limiter core (windows, runs, reports; calendar days):
//! state and instant in, verdict and new state out. `tls` loads PEM files, picks the
//! listener's certificate by SNI, and makes the client side for https upstreams.
//! `http` is HTTP as sluice speaks it below any decision: the head checks, path
//! normalisation, the HTTP/1 wire scanner, request ids, the `RateLimit` headers,
//! every response's body, every refusal turned into a response, and sluice's own
//! outbound requests.
//!
//! **Config.** `config` turns `gateway.toml` into validated runtime types (the
//! route table, the ids of routes, policies, consumers and upstreams), every
//! problem with its file, line and key. It is a leaf: it imports only foundations.
//!
//! **Engines and services**, bound together per config. `store` keeps callers'
//! counters and bans behind one contract (memory, Redis). `identity` finds who is
//! calling; `concurrency` holds the policies' caps; `proxy` keeps the upstream pools
//! and builds the request an upstream gets; `meter` reads what an answer says it
//! cost; `observe` is the metrics and the access log. `snapshot` is one compiled
//! config bound to the store, pools, caps and metrics: a request uses one throughout.
//!
//! **Decision.** `admission` is the only place that decides: whether a request (or
//! a caller asked about by name) may go ahead and on what terms, and what it costs
//! once answered.
//!
//! **Serving.** `server` accepts connections and speaks HTTP (timeouts, floods,
//! worker threads), knowing nothing of routes or limits; `gateway` is the request
//! story it hands each request to: admit, respond or forward, settle, answer.
//!
//! **Operating.** `admin` is the admin listener (metrics, probes, bans, usage, the
//! decision API, config reloads, the status page and its JSON); `app` wires everything: the listeners, workers,
//! file watching, maintenance and the orderly stop.

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
