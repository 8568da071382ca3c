//! The lock routes: `/pools/{pool}/lock/acquire`,
//! `/pools/{pool}/lock/{slotId}/renew`, `/pools/{pool}/lock/{slotId}/release`.

use crate::http::find_slash_or_query;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Acquire { pool: &'a [u8] },
    Renew { pool: &'a [u8], slot: &'a [u8] },
    Release { pool: &'a [u8], slot: &'a [u8] },
}

/// Matches a request target (query string ignored); `None` for any other path.
/// Runs on every request, so each segment's end (`/`, or `?` where the path
/// ends) is found eight bytes at a time, and the query is never scanned.
pub fn route(target: &[u8]) -> Option<Route<'_>> {
    let rest = target.strip_prefix(b"/pools/")?;
    let pool_len = segment_len(rest)?;
    let rest = rest[pool_len + 1..].strip_prefix(b"lock/")?;
    if pool_len == 0 {
        return None;
    }
    let pool = &target[7..7 + pool_len];
    if ends_path(rest, b"acquire") {
        return Some(Route::Acquire { pool });
    }
    let slot_len = segment_len(rest)?;
    let slot_start = 7 + pool_len + 1 + 5;
    let slot = &target[slot_start..slot_start + slot_len];
    let last = &rest[slot_len + 1..];
    match () {
        _ if slot.is_empty() => None,
        _ if ends_path(last, b"renew") => Some(Route::Renew { pool, slot }),
        _ if ends_path(last, b"release") => Some(Route::Release { pool, slot }),
        _ => None,
    }
}

/// The `{pool}` of any path under `/pools/{pool}` (`/pools/{pool}` itself,
/// `/pools/{pool}/...`, `/pools/{pool}?...`), as a proxy that shards by it
/// reads it; `None` outside `/pools/` or for an empty segment.
pub fn pool_segment(path: &[u8]) -> Option<&[u8]> {
    let rest = path.strip_prefix(b"/pools/")?;
    let pool = &rest[..find_slash_or_query(rest).unwrap_or(rest.len())];
    (!pool.is_empty()).then_some(pool)
}

/// The length of the segment at the start of `rest` when a `/` ends it;
/// `None` when the path ends first (a `?` or the end of the target).
fn segment_len(rest: &[u8]) -> Option<usize> {
    find_slash_or_query(rest).filter(|&at| rest[at] == b'/')
}

/// Whether `rest` is `segment` and nothing more of the path (a query may follow).
fn ends_path(rest: &[u8], segment: &[u8]) -> bool {
    rest.strip_prefix(segment).is_some_and(|after| matches!(after.first(), None | Some(b'?')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_routes() {
        assert_eq!(route(b"/pools/demo/lock/acquire"), Some(Route::Acquire { pool: b"demo" }));
        assert_eq!(route(b"/pools/demo/lock/acquire?x=1"), Some(Route::Acquire { pool: b"demo" }));
        assert_eq!(route(b"/pools/demo/lock/abc/release?a/b"), Some(Route::Release { pool: b"demo", slot: b"abc" }));
        assert_eq!(route(b"/pools/demo/lock/abc/renew"), Some(Route::Renew { pool: b"demo", slot: b"abc" }));
        assert_eq!(route(b"/pools/demo/lock/abc/renew?"), Some(Route::Renew { pool: b"demo", slot: b"abc" }));
        assert_eq!(route(b"/pools/demo/lock/acquire?/x/y"), Some(Route::Acquire { pool: b"demo" }));
        assert_eq!(route(b"/pools/demo/lock/abc/release"), Some(Route::Release { pool: b"demo", slot: b"abc" }));
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
            "/pools/de?mo/lock/acquire",
            "/pools/demo?/lock/acquire",
            "/pools/demo/lock?/acquire",
            "/pools/demo/lock/acquire/?x",
            "/pools/demo/lock/ab?c/release",
            "/pools/demo/lock/abc/release/?x",
            "/pools/demo/lock/abc/releasex",
            "/pools/?x",
            "/pools",
        ] {
            assert_eq!(route(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn pool_segments() {
        for (path, pool) in [
            ("/pools/demo/lock/acquire", Some("demo")),
            ("/pools/demo/lock/acquire/", Some("demo")),
            ("/pools/demo", Some("demo")),
            ("/pools/demo?x=/y", Some("demo")),
            ("/pools/demo/", Some("demo")),
            ("/pools/", None),
            ("/pools//lock/acquire", None),
            ("/pools?x", None),
            ("/v1/pools/demo", None),
        ] {
            assert_eq!(pool_segment(path.as_bytes()), pool.map(str::as_bytes), "{path}");
        }
    }
}
