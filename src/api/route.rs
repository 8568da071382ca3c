//! The lock routes: `/pools/{pool}/lock/acquire`,
//! `/pools/{pool}/lock/{slotId}/renew`, `/pools/{pool}/lock/{slotId}/release`.

use crate::http::{find_slash_or_query, hex_digit};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Acquire { pool: &'a [u8] },
    Renew { pool: &'a [u8], slot: &'a [u8] },
    Release { pool: &'a [u8], slot: &'a [u8] },
}

impl<'a> Route<'a> {
    /// The `{pool}` segment of the path, as written (percent-encoding kept).
    pub fn pool(&self) -> &'a [u8] {
        match *self {
            Route::Acquire { pool } | Route::Renew { pool, .. } | Route::Release { pool, .. } => pool,
        }
    }
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

/// Whether `target` is a renew or release path with its slot id left out
/// (`/pools/p/lock//release`, what an unset shell variable makes of one).
pub fn lacks_slot(target: &[u8]) -> bool {
    let Some(rest) = target.strip_prefix(b"/pools/") else {
        return false;
    };
    let Some(pool_len) = segment_len(rest).filter(|&n| n > 0) else {
        return false;
    };
    rest[pool_len + 1..]
        .strip_prefix(b"lock//")
        .is_some_and(|last| ends_path(last, b"renew") || ends_path(last, b"release"))
}

/// The `{pool}` of any path under `/pools/{pool}` (`/pools/{pool}` itself,
/// `/pools/{pool}/...`, `/pools/{pool}?...`), as a proxy that shards by it
/// reads it; `None` outside `/pools/` or for an empty segment.
pub fn pool_segment(path: &[u8]) -> Option<&[u8]> {
    let rest = path.strip_prefix(b"/pools/")?;
    let pool = &rest[..find_slash_or_query(rest).unwrap_or(rest.len())];
    (!pool.is_empty()).then_some(pool)
}

/// The longest pool name: a pool name is a DNS label (`config::is_dns_label`).
pub const POOL_NAME_MAX: usize = 63;

/// A pool segment with its percent-encoding decoded, in a fixed buffer: a
/// segment that decodes to more than `POOL_NAME_MAX` bytes names no pool,
/// so no name needs more room.
#[derive(Clone, Copy)]
pub struct DecodedName {
    bytes: [u8; POOL_NAME_MAX],
    len: u8,
}

impl DecodedName {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Why a pool segment's percent-encoding can name no pool whatever the
/// configuration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadEscape {
    /// A `%` not followed by two hex digits (RFC 3986 §2.1).
    NotHex,
    /// A `%XX` that stands for a byte no pool name holds (a `/`, a NUL, an
    /// upper-case letter, anything but `a-z`, `0-9` and `-`).
    NotInPoolNames,
}

impl BadEscape {
    /// The sentence of the `400 bad_request` that refuses it.
    pub fn message(self) -> &'static str {
        match self {
            BadEscape::NotHex => "The pool name in the path has a '%' that is not followed by two hex digits.",
            BadEscape::NotInPoolNames => {
                "The pool name in the path percent-encodes a character no pool name holds (only a-z, 0-9 and '-')."
            }
        }
    }
}

/// `segment` (the `{pool}` of a path) with each `%XX` replaced by the byte
/// it stands for, hex digits in either case: RFC 3986 §6.2.2.2 makes
/// `d%65mo` and `demo` one name. `Ok(None)` when the name is longer than
/// any pool's. Bytes that are not escaped are kept as they are; whether
/// they name a pool is the look-up's business, as for a segment without
/// `%`. Callers decode only a segment no pool is named by as it stands, so
/// a request whose path holds no `%` never comes here.
pub fn decode_pool(segment: &[u8]) -> Result<Option<DecodedName>, BadEscape> {
    let mut name = DecodedName { bytes: [0; POOL_NAME_MAX], len: 0 };
    let mut fits = true;
    let mut rest = segment;
    while let Some((&first, after)) = rest.split_first() {
        let byte = match first {
            b'%' => {
                let high = after.first().copied().and_then(hex_digit).ok_or(BadEscape::NotHex)?;
                let low = after.get(1).copied().and_then(hex_digit).ok_or(BadEscape::NotHex)?;
                let byte = high << 4 | low;
                if !(byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-') {
                    return Err(BadEscape::NotInPoolNames);
                }
                rest = &after[2..];
                byte
            }
            other => {
                rest = after;
                other
            }
        };
        // Past the longest name the rest is still read, so a bad escape
        // anywhere in the segment is refused as such.
        match name.bytes.get_mut(name.len as usize) {
            Some(slot) if fits => {
                *slot = byte;
                name.len += 1;
            }
            _ => fits = false,
        }
    }
    Ok(fits.then_some(name))
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
    fn a_renew_or_release_path_without_its_slot_id_is_told_apart() {
        for lacking in ["/pools/demo/lock//renew", "/pools/demo/lock//release", "/pools/demo/lock//release?x=1"] {
            assert!(lacks_slot(lacking.as_bytes()), "{lacking}");
            assert_eq!(route(lacking.as_bytes()), None, "{lacking}");
        }
        for other in [
            "/pools/demo/lock/abc/release",
            "/pools/demo/lock//cancel",
            "/pools//lock//release",
            "/pools/demo/lock///release",
            "/pools/demo/lock//release/",
            "/pools/demo/lock/acquire",
            "/",
        ] {
            assert!(!lacks_slot(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn percent_encoded_pool_names_decode_to_the_name() {
        let decoded = |s: &str| decode_pool(s.as_bytes()).map(|n| n.map(|n| n.as_bytes().to_vec()));
        for (segment, name) in [
            ("d%65mo", "demo"),
            ("%64%65%6D%6F", "demo"),
            ("%64%65%6d%6f", "demo"),
            ("prod%2Dacme", "prod-acme"),
            ("prod%2dacme", "prod-acme"),
            ("%30", "0"),
            ("demo", "demo"),
            // Bytes left as they are: the look-up finds no pool with them.
            ("De%6Do", "Demo"),
            ("a.b%2d", "a.b-"),
        ] {
            assert_eq!(decoded(segment), Ok(Some(name.as_bytes().to_vec())), "{segment}");
        }
        let longest = format!("{}%61", "a".repeat(POOL_NAME_MAX - 1));
        assert_eq!(decoded(&longest), Ok(Some(vec![b'a'; POOL_NAME_MAX])));
        let longer = format!("{}%61", "a".repeat(POOL_NAME_MAX));
        assert_eq!(decoded(&longer), Ok(None), "longer than any pool name");
        assert_eq!(decoded(&format!("{longer}%zz")), Err(BadEscape::NotHex), "read to its end");
        for bad in ["%", "%6", "d%6", "%g5", "%6g", "%%65", "de%-1mo", "%+1", "%\u{e9}"] {
            assert_eq!(decoded(bad), Err(BadEscape::NotHex), "{bad}");
        }
        for bad in ["%2F", "%2f", "%00", "%41", "%5F", "%2E", "%7E", "%20", "%25", "%3F", "%FF", "%C3%A9", "demo%0A"] {
            assert_eq!(decoded(bad), Err(BadEscape::NotInPoolNames), "{bad}");
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
