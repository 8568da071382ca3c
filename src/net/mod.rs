//! Outbound connections to upstreams: TLS over a non-blocking socket and
//! host-name resolution off the event loop. Both are driven by the reactor;
//! neither reads the clock (they take `now`) nor knows about HTTP.

pub mod dns;
pub mod nameserver;
pub mod resolve;
pub mod tls;
