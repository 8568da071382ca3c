//! nthpool: a single-threaded concurrency governor for callers of rate-limited APIs.
//!
//! Layers, from the inside out:
//! - `wheel`: the one hierarchical timer wheel;
//! - `governor`: pools, leases, queues, gates and learning — pure, driven by `now`;
//! - `report`: outcome reports and the upstream rate-limit header dialects;
//! - `http`: request parsing and response writing — pure byte work;
//! - `api`: the lock routes, credentials and the answers they give;
//! - `server`: the mio reactor that owns sockets and the clock;
//! - `state`: what is kept on disk between runs (the slot secret).

pub mod access;
pub mod accesslog;
pub mod api;
pub mod config;
pub mod dashboard;
pub mod governor;
pub mod http;
pub mod report;
pub mod server;
pub mod state;
pub mod time;
pub mod wheel;
