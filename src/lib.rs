//! nthpool: a single-threaded concurrency governor for callers of rate-limited APIs.
//!
//! Layers, from the outside in; each imports only what is below it, and
//! `tests/layers.rs` checks that from the source:
//! - `server`: the mio reactor that owns sockets and the clock;
//! - `net`: outbound connections to upstreams: TLS client streams and name
//!   resolution off the loop, driven by the reactor;
//! - `dashboard`: the admin dashboard's routes, read from `api`;
//! - `api`: the lock routes, credentials and the answers they give;
//! - `http`: request parsing and response writing — pure byte work;
//! - `governor`: pools, leases, queues, gates and learning — pure, driven by `now`;
//! - below what uses them: `config` (the file), `access` (the policies
//!   beyond the pool key), `report` (outcome reports and the upstream
//!   rate-limit header dialects), `accesslog`, `state` (what is kept on disk
//!   between runs: the slot secret, the snapshot; the OS random source) and
//!   `proxy` (proxy mode's exchanges);
//! - leaves: `wheel` (the one hierarchical timer wheel), `time` (the units of
//!   time and the one monotonic → wall conversion), `calendar` (date
//!   arithmetic), `ct` (constant-time comparison), `files` (the bounded
//!   read of a file the configuration names), `metrics` (the histograms
//!   and the Prometheus text, rendered from plain data) and `stdio`
//!   (standard output and error written without blocking).
//!
//! The README's code map lists every module and the table in
//! `tests/layers.rs` every import between them.

#![forbid(unsafe_code)]

pub mod access;
pub mod accesslog;
pub mod api;
pub mod calendar;
pub mod config;
pub mod ct;
pub mod dashboard;
pub mod files;
pub mod governor;
pub mod http;
pub mod metrics;
pub mod net;
pub mod proxy;
pub mod report;
pub mod server;
pub mod state;
pub mod stdio;
pub mod time;
pub mod wheel;
