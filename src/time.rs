//! The units of time every layer speaks: monotonic milliseconds.
//!
//! A leaf: it imports nothing from the crate, so the governor, the wheel
//! and the reactor can all name the same unit without importing each other.

/// Monotonic milliseconds since the server started.
pub type Ms = u64;
