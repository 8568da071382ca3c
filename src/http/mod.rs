//! HTTP/1.1 byte work: parsing request heads and chunked bodies, writing
//! responses. Pure: no sockets, no clock, no governor.

pub mod chunked;
pub mod memo;
pub mod request;
pub mod response;

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

const LO: u64 = 0x0101_0101_0101_0101;

/// The high bit of every byte of `x` that is zero, and no other bit.
pub(crate) fn zero_bytes(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// The high bit of every byte of `word` equal to `byte`.
pub(crate) fn bytes_equal(word: u64, byte: u8) -> u64 {
    zero_bytes(word ^ (LO * byte as u64))
}

/// The first position of `a` or `b` in `hay`, eight bytes per step (request
/// paths are searched on every request).
pub fn find_byte_of(hay: &[u8], a: u8, b: u8) -> Option<usize> {
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let found = bytes_equal(w, a) | bytes_equal(w, b);
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words.remainder().iter().position(|&c| c == a || c == b).map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_byte_of_agrees_with_position() {
        let hay: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        for len in 0..hay.len() {
            for needle in [0u8, 1, 47, 63, 128, 200, 255] {
                let one = hay[..len].iter().position(|&b| b == needle);
                assert_eq!(find_byte_of(&hay[..len], needle, needle), one);
                let either = hay[..len].iter().position(|&b| b == needle || b == 63);
                assert_eq!(find_byte_of(&hay[..len], needle, 63), either);
            }
        }
    }
}
