//! Open-descriptor limits: `maxConnections` is only a promise if the
//! process may open that many sockets. At start the soft limit is raised to
//! the hard one (a shell's default 1024 is far under the default 10 000
//! connections); where even that is too low, the connection cap is lowered
//! to what fits, so a client over it is refused with a `503` like any other
//! over the cap, instead of the server running out of descriptors, when
//! health checks and every new client would wait for one to come free.

use log::warn;

use super::{ADMIN_MAX_CONNECTIONS, REFUSED_LINGERING_MAX};

/// Descriptors besides the connections: listeners, the poller, signals,
/// the access log, snapshots, the resolver's socket, and some to spare.
const OTHERS: u64 = 64;

/// Raises the soft limit on open descriptors to the hard one; the soft
/// limit in force after (`None`: unlimited or unknown).
pub fn raise_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            warn!("cannot raise the open-descriptor limit to {:?}: {e}", limit.maximum);
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The client connections `limit` descriptors allow at most, beside the
/// admin connections, the refused ones still lingering and `OTHERS`; half
/// that when proxying, as each proxied exchange holds an upstream
/// connection too.
pub fn connections_allowed(limit: u64, proxies: bool) -> usize {
    let reserved = OTHERS + (ADMIN_MAX_CONNECTIONS + REFUSED_LINGERING_MAX) as u64;
    let room = limit.saturating_sub(reserved).max(1);
    let room = if proxies { (room / 2).max(1) } else { room };
    usize::try_from(room).unwrap_or(usize::MAX)
}

/// The connection cap in force, and the `maxConnections` it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionCap {
    pub configured: usize,
    /// `configured`, or fewer when the descriptor limit allows fewer.
    pub cap: usize,
}

impl ConnectionCap {
    /// The cap for `configured` connections under the descriptor `limit`.
    /// A cap lower than configured is said once: at start (`before` is
    /// `None`), or at a reload that changes it, not at every reload.
    pub fn new(configured: usize, limit: Option<u64>, proxies: bool, before: Option<ConnectionCap>) -> ConnectionCap {
        let cap = limit.map_or(configured, |limit| configured.min(connections_allowed(limit, proxies)));
        let now = ConnectionCap { configured, cap };
        if let Some(limit) = limit.filter(|_| cap < configured && before != Some(now)) {
            warn!(
                "maxConnections is {configured}, but {limit} open descriptors allow about {cap}{}: \
                 accepting {cap} at most (clients beyond get 503); raise the limit \
                 (systemd LimitNOFILE, ulimit -n) to serve more",
                if proxies { " with proxying" } else { "" }
            );
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_what_the_descriptors_allow_beside_the_rest() {
        let reserved = 64 + 16 + 64;
        let cap = |configured, limit, proxies| ConnectionCap::new(configured, limit, proxies, None).cap;
        assert_eq!(cap(10_000, Some(1024), false), 1024 - reserved);
        assert_eq!(cap(10_000, Some(1024), true), (1024 - reserved) / 2);
        assert_eq!(cap(500, Some(1024), false), 500, "within the limit: as configured");
        assert_eq!(cap(10_000, None, false), 10_000, "no known limit");
        assert_eq!(cap(10_000, Some(10), false), 1, "never none");
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let unlimited = |l: Option<u64>| l.unwrap_or(u64::MAX);
        let before = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let after = raise_limit();
        assert!(unlimited(after) >= unlimited(before), "{before:?} -> {after:?}");
    }
}
