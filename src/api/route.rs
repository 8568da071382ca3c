//! The lock routes: `/pools/{pool}/lock/acquire`,
//! `/pools/{pool}/lock/{slotId}/renew`, `/pools/{pool}/lock/{slotId}/release`.

use crate::http::find_byte;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Acquire { pool: &'a str },
    Renew { pool: &'a str, slot: &'a str },
    Release { pool: &'a str, slot: &'a str },
}

/// Matches a request target (query string ignored); `None` for any other path.
/// Runs on every request, so segments are found eight bytes at a time.
pub fn route(target: &str) -> Option<Route<'_>> {
    let b = target.as_bytes();
    let path = &b[..find_byte(b, b'?').unwrap_or(b.len())];
    let rest = path.strip_prefix(b"/pools/")?;
    let pool_len = find_byte(rest, b'/')?;
    let rest = rest[pool_len + 1..].strip_prefix(b"lock/")?;
    if pool_len == 0 {
        return None;
    }
    // Every cut is next to an ASCII byte, so the pieces stay valid UTF-8.
    let pool = &target[7..7 + pool_len];
    if rest == b"acquire" {
        return Some(Route::Acquire { pool });
    }
    let slot_len = find_byte(rest, b'/')?;
    let slot_start = 7 + pool_len + 1 + 5;
    let slot = &target[slot_start..slot_start + slot_len];
    match &rest[slot_len + 1..] {
        _ if slot.is_empty() => None,
        b"renew" => Some(Route::Renew { pool, slot }),
        b"release" => Some(Route::Release { pool, slot }),
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
        assert_eq!(route("/pools/demo/lock/abc/release?a/b"), Some(Route::Release { pool: "demo", slot: "abc" }));
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
            "/pools/demo/lock/abc/renew/",
            "/pools/demo/lock/abc/renew/x",
            "/pool/demo/lock/acquire",
        ] {
            assert_eq!(route(other), None, "{other}");
        }
    }
}
