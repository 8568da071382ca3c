//! The lock routes: `/pools/{pool}/lock/acquire`,
//! `/pools/{pool}/lock/{slotId}/renew`, `/pools/{pool}/lock/{slotId}/release`.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Acquire { pool: &'a str },
    Renew { pool: &'a str, slot: &'a str },
    Release { pool: &'a str, slot: &'a str },
}

/// Matches a request target (query string ignored); `None` for any other path.
pub fn route(target: &str) -> Option<Route<'_>> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let rest = path.strip_prefix("/pools/")?;
    let (pool, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("lock/")?;
    if pool.is_empty() {
        return None;
    }
    if rest == "acquire" {
        return Some(Route::Acquire { pool });
    }
    let (slot, action) = rest.split_once('/')?;
    if slot.is_empty() || slot.contains('/') {
        return None;
    }
    match action {
        "renew" => Some(Route::Renew { pool, slot }),
        "release" => Some(Route::Release { pool, slot }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_routes() {
        assert_eq!(route("/pools/demo/lock/acquire"), Some(Route::Acquire { pool: "demo" }));
        assert_eq!(route("/pools/demo/lock/acquire?x=1"), Some(Route::Acquire { pool: "demo" }));
        assert_eq!(route("/pools/demo/lock/abc/renew"), Some(Route::Renew { pool: "demo", slot: "abc" }));
        assert_eq!(route("/pools/demo/lock/abc/release"), Some(Route::Release { pool: "demo", slot: "abc" }));
        for other in [
            "/",
            "/pools",
            "/pools/demo",
            "/pools/demo/lock",
            "/pools/demo/lock/",
            "/pools/demo/lock/acquire/",
            "/pools//lock/acquire",
            "/pools/demo/lock//renew",
            "/pools/demo/lock/a/b/renew",
            "/pools/demo/lock/abc/cancel",
            "/pool/demo/lock/acquire",
        ] {
            assert_eq!(route(other), None, "{other}");
        }
    }
}
