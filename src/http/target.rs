//! Request targets and `Host` values: a target's path and authority in the
//! origin and absolute forms (RFC 9112 §3.2), the bytes a target may hold,
//! and what a valid `host[:port]` is (RFC 9112 §3.2, RFC 3986 §3.2.2). Pure
//! byte work with no error type of its own (a refusal is its sentence), read
//! by the head parser (`request`, which imports it, never the reverse) and
//! by whoever writes a path back out.

use super::{any_zero_byte, or_over_words, LO};

/// Whether a target's path and query hold only bytes a request target may.
/// httparse takes any visible byte and UTF-8 in a target; of those, a URI
/// (RFC 3986 §2) has no `#` in a request (a fragment is the client's own,
/// RFC 9112 §3.2), no `\`, `"`, `<`, `>` or `` ` ``, and nothing past
/// ASCII. `{`, `}`, `|`, `^`, `[` and `]`, also outside the grammar, are
/// let through: clients send them unencoded in queries, and they do not
/// change how a path is read.
///
/// Eight bytes at a time (a target is read on every request whose line is
/// parsed): `"` and `#` differ only in bit 0 and `<` and `>` only in bit 1,
/// so with those bits set one compare finds each pair.
pub(super) fn valid_target_bytes(target: &[u8]) -> bool {
    if target.len() < 8 {
        return !target.iter().any(|&b| outside_target(b));
    }
    let bad = |w: u64| {
        any_zero_byte((w | LO) ^ (LO * 0x23))
            | any_zero_byte((w | (LO * 2)) ^ (LO * 0x3e))
            | any_zero_byte(w ^ (LO * u64::from(b'\\')))
            | any_zero_byte(w ^ (LO * u64::from(b'`')))
            | (w & (LO << 7))
    };
    or_over_words(target, bad) == 0
}

/// A byte `valid_target_bytes` refuses.
fn outside_target(b: u8) -> bool {
    matches!(b, b'#' | b'\\' | b'"' | b'<' | b'>' | b'`') || !b.is_ascii()
}

/// The path of a request target and, for the absolute form
/// (`http://host[:port]/path`), its authority; else why it is malformed.
pub(crate) fn split_target(target: &[u8]) -> Result<(&[u8], Option<&[u8]>), &'static str> {
    let (path, authority) = target_parts(target)?;
    if let Some(authority) = authority {
        if authority.is_empty() || !valid_host(authority) {
            return Err("The request target's authority is not a valid host[:port].");
        }
    }
    Ok((path, authority))
}

/// A request target cut into its path and, for the absolute form, its
/// authority, which is not checked: the access log reads the path of a
/// target refused for its authority this way.
pub(crate) fn target_parts(target: &[u8]) -> Result<(&[u8], Option<&[u8]>), &'static str> {
    if target.starts_with(b"/") {
        return Ok((target, None));
    }
    let scheme_len = if target.len() >= 7 && target[..7].eq_ignore_ascii_case(b"http://") {
        7
    } else if target.len() >= 8 && target[..8].eq_ignore_ascii_case(b"https://") {
        8
    } else {
        return Err("The request target must be a path starting with '/'.");
    };
    let rest = &target[scheme_len..];
    match rest.iter().position(|b| matches!(b, b'/' | b'?' | b'#')) {
        Some(i) if rest[i] == b'/' => {
            let (authority, path) = rest.split_at(i);
            Ok((path, Some(authority)))
        }
        // An empty path before a query (`http://h?q`) is the path `/` (RFC
        // 9110 §4.2.3). The path is then the query alone, from its `?`, which
        // lies in the buffer; who writes a path out puts the `/` before it
        // (`implied_slash`), and no route starts with `?`.
        Some(i) if rest[i] == b'?' => {
            let (authority, query) = rest.split_at(i);
            Ok((query, Some(authority)))
        }
        Some(_) => Err("An absolute request target needs a path."),
        // No path is the path `/` (RFC 9112 §3.2.2): the scheme's own `/`,
        // so that the path, like every part of a head, lies within its
        // buffer (a remembered head keeps it as an offset there).
        None => Ok((&target[scheme_len - 1..scheme_len], Some(rest))),
    }
}

/// What goes before a head's path when it is written out: `/` for the
/// query of an absolute-form target with an empty path (`target_parts`),
/// nothing for any other path.
pub fn implied_slash(path: &[u8]) -> &'static [u8] {
    if path.first() == Some(&b'?') {
        b"/"
    } else {
        b""
    }
}

/// The bytes of a registered name or IPv4 address in `Host`: unreserved
/// and the sub-delimiters but `,` (a `%` must start a percent-encoding,
/// which `valid_host` checks apart).
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b';' | b'='
            );
        i += 1;
    }
    t
};

/// `host[:port]` as RFC 9112 §3.2 allows in `Host`: a registered name or IPv4
/// address (unreserved, percent-encoded and sub-delimiter characters, but no
/// comma: a list is not one host), or a bracketed IP literal (an IPv6
/// address or an `IPvFuture`, RFC 3986 §3.2.2); an optional port of at most
/// five digits up to 65535. An empty host is refused: an `http` URI with an
/// empty host is invalid (RFC 9110 §4.2.1), and every client of this server
/// knows the host it called (RFC 9112 §3.2 has an empty `Host` only for
/// targets without an authority).
pub fn valid_host(value: &[u8]) -> bool {
    let (name_ok, rest) = if let Some(literal) = value.strip_prefix(b"[") {
        match literal.iter().position(|&b| b == b']') {
            Some(end) => (valid_ip_literal(&literal[..end]), &literal[end + 1..]),
            None => return false,
        }
    } else {
        // One pass: the name ends at the first byte a name cannot hold, which
        // must then be the port's colon or nothing; a `%` must start `%XX`.
        let name_end =
            |from: usize| value[from..].iter().position(|&b| !REG_NAME[b as usize]).map_or(value.len(), |at| from + at);
        let mut end = name_end(0);
        while value.get(end) == Some(&b'%') {
            match value.get(end + 1..end + 3) {
                Some([hi, lo]) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => end = name_end(end + 3),
                _ => return false,
            }
        }
        // An empty name is no host (RFC 9110 §4.2.1), with or without a port.
        (end > 0, &value[end..])
    };
    let port_ok = match rest {
        [] => true,
        [b':', port @ ..] => {
            // Digits and value in one pass: any number of digits (RFC 3986
            // §3.2.3, `000080` is 80), the value held at 65 536 once past.
            let mut n = 0u32;
            port.iter().all(|&d| {
                n = (n * 10 + u32::from(d.wrapping_sub(b'0'))).min(65_536);
                d.is_ascii_digit()
            }) && n <= 65_535
        }
        _ => false,
    };
    name_ok && port_ok
}

/// The inside of `[...]` in a host: an IPv6 address, or
/// `v<hex>.<unreserved / sub-delims / ":">` (`IPvFuture`).
fn valid_ip_literal(inner: &[u8]) -> bool {
    if let [b'v' | b'V', future @ ..] = inner {
        let Some(dot) = future.iter().position(|&b| b == b'.') else {
            return false;
        };
        let (version, tail) = (&future[..dot], &future[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !tail.is_empty()
            && tail.iter().all(|&b| REG_NAME[b as usize] || b == b',' || b == b':');
    }
    std::str::from_utf8(inner).is_ok_and(|text| text.parse::<std::net::Ipv6Addr>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_bytes_word_by_word_agree_with_byte_by_byte() {
        // Every byte value, at every offset within and across words.
        let hay: Vec<u8> = (0..600u32).map(|i| (i * 37 % 256) as u8).collect();
        for start in 0..16 {
            for len in 0..40 {
                let part = &hay[start * 31..start * 31 + len];
                assert_eq!(valid_target_bytes(part), !part.iter().any(|&b| outside_target(b)), "{part:?}");
            }
        }
        for b in 0..=255u8 {
            for len in 1..20 {
                for at in 0..len {
                    let mut t = vec![b'a'; len];
                    t[at] = b;
                    assert_eq!(valid_target_bytes(&t), !outside_target(b), "{b:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn host_values() {
        for good in [
            "h",
            "127.0.0.1:7070",
            "[::1]",
            "[::1]:80",
            "[::ffff:1.2.3.4]",
            "[v1.fe80::a+en1]",
            "a-b.example_c~d",
            "x:",
            "%41b%2fc",
            "a%2F:80",
            "a:000080",
            "a:0000000000000000000065535",
        ] {
            assert!(valid_host(good.as_bytes()), "{good}");
        }
        for bad in [
            "",
            ":80",
            "exa mple",
            "user@h",
            "h/p",
            "a, b",
            "a,b",
            "x:abc",
            "[::1",
            "[]",
            "[::1]x",
            "x:65536",
            "x:123456",
            "x:99999999999999999999999",
            "[1]",
            "[:::::]",
            "[1.2.3.4]",
            "[::1::2]",
            "[12345::]",
            "[v.x]",
            "[v1.]",
            "[vz.x]",
            "%",
            "a%4",
            "%zz",
            "a%4g:80",
            "[fe80::1%25en1]",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }
}
