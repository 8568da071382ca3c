//! HTTP/1.1 byte work: parsing request heads and chunked bodies, writing
//! responses. Pure: no sockets, no clock, no governor.

pub mod chunked;
pub mod memo;
pub mod request;
pub mod response;
pub mod target;

/// The value of an ASCII hex digit, either case.
pub fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// A header value without surrounding optional white space (spaces and
/// tabs only, RFC 9110's OWS).
pub fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The credentials of an `Authorization` value in `scheme` (lower case):
/// `auth-scheme 1*SP credentials` (RFC 9110 §11.4), the scheme compared
/// without case (§11.1), white space around the credentials dropped.
pub fn credentials<'v>(value: &'v [u8], scheme: &str) -> Option<&'v [u8]> {
    debug_assert!(!scheme.bytes().any(|b| b.is_ascii_uppercase()));
    let value = trim(value);
    let split = value.iter().position(|&b| b == b' ')?;
    let (given, rest) = value.split_at(split);
    given.eq_ignore_ascii_case(scheme.as_bytes()).then(|| trim(rest))
}

/// A byte of a `token` (RFC 9110 §5.6.2): a method, a field name, a
/// transfer coding, a chunk extension's name.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

const LO: u64 = 0x0101_0101_0101_0101;

/// The high bit of every byte of `x` that is zero, and no other bit.
pub(crate) fn zero_bytes(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// The high bit of some byte of `x` when any byte is zero, else 0: fewer
/// steps than `zero_bytes`, whose marks are exact byte by byte; here a
/// borrow may mark bytes above a zero byte, but only when there is one.
pub(crate) fn any_zero_byte(x: u64) -> u64 {
    x.wrapping_sub(LO) & !x & (LO << 7)
}

/// The high bit of every byte of `word` equal to `byte`.
pub(crate) fn bytes_equal(word: u64, byte: u8) -> u64 {
    zero_bytes(word ^ (LO * byte as u64))
}

/// The first `/` or `?` in `hay` (where a path segment ends), eight bytes per
/// step. The two differ only in bit 4 (0x2f, 0x3f) and no other byte becomes
/// 0x3f with that bit set, so one compare per word finds either.
pub fn find_slash_or_query(hay: &[u8]) -> Option<usize> {
    const BIT4: u64 = 0x1010_1010_1010_1010;
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let found = bytes_equal(w | BIT4, b'?');
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words.remainder().iter().position(|&c| c | 0x10 == b'?').map(|i| at + i)
}

/// `a == b` for slices of one length, eight bytes per compare (the last
/// word overlapping the one before it), or one byte at a time when shorter,
/// instead of a call to `memcmp`.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    if a.len() < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    words_equal(a, b, 0)
}

/// `a | fold == b` eight bytes at a time, for slices of one length of at
/// least eight bytes; the last word overlaps the one before it.
pub(crate) fn words_equal(a: &[u8], b: &[u8], fold: u64) -> bool {
    let n = a.len();
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let mut at = 0;
    while at + 8 < n {
        if word(a, at) | fold != word(b, at) {
            return false;
        }
        at += 8;
    }
    word(a, n - 8) | fold == word(b, n - 8)
}

/// `mark` of every eight-byte word of `bytes` (at least eight long), OR-ed:
/// the last word overlaps the one before it, so no byte is left out.
#[inline(always)]
fn or_over_words(bytes: &[u8], mark: impl Fn(u64) -> u64) -> u64 {
    let n = bytes.len();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let mut found = mark(word(n - 8));
    let mut at = 0;
    while at + 8 < n {
        found |= mark(word(at));
        at += 8;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_take_any_case_of_the_scheme_and_any_spaces_after_it() {
        for value in ["Bearer t0k", "bearer t0k", "BEARER   t0k", " bEaReR t0k \t"] {
            assert_eq!(credentials(value.as_bytes(), "bearer"), Some(&b"t0k"[..]), "{value:?}");
        }
        for value in ["Bearert0k", "Bearer", "Basic t0k", "Bearer\tt0k", "", "Nthbouncer t0k"] {
            assert_eq!(credentials(value.as_bytes(), "bearer"), None, "{value:?}");
        }
        assert_eq!(credentials(b"NthBouncer k", "nthbouncer"), Some(&b"k"[..]));
    }

    #[test]
    fn find_slash_or_query_agrees_with_position() {
        // Every byte value, at every offset within and across words.
        let hay: Vec<u8> = (0..300u32).map(|i| (i * 37 % 256) as u8).collect();
        for start in 0..16 {
            for len in 0..hay.len() - start {
                let part = &hay[start..start + len];
                let expected = part.iter().position(|&b| b == b'/' || b == b'?');
                assert_eq!(find_slash_or_query(part), expected, "start {start}, len {len}");
            }
        }
        assert_eq!(find_slash_or_query(b"bench/lock/acquire"), Some(5));
        assert_eq!(find_slash_or_query(b"abcdefghijklmnop?x"), Some(16));
        assert_eq!(find_slash_or_query(b"\x1f\x2e\x30\x3e\x4f\xaf\xbf"), None);
    }

    #[test]
    fn same_bytes_agrees_with_slice_equality() {
        let base: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for len in 0..base.len() {
            let a = &base[..len];
            assert!(same_bytes(a, a));
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x01;
                assert!(!same_bytes(a, &b), "length {len}, byte {at}");
            }
        }
    }
}
