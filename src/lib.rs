//! nthpool: a single-threaded concurrency governor for callers of rate-limited APIs.
//!
//! Layers, from the inside out:
//! - `wheel`: the one hierarchical timer wheel;
//! - `governor`: pools, leases, queues, gates and learning — pure, driven by `now`;
//! - `http`: request parsing and response writing — pure byte work;
//! - `server`: the mio reactor that owns sockets and the clock.

pub mod config;
pub mod governor;
pub mod wheel;
