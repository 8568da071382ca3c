//! Constant-time comparison of secrets: pool keys, admin tokens, slot ids
//! and MAC tags. A leaf, so every layer that compares a secret uses this one
//! function.

/// Equality that takes the same time wherever the inputs differ (only a
/// difference in length shows, and lengths are not secret here): every byte
/// is looked at, eight at a time, then the tail one by one.
pub fn secret_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = wa.remainder().iter().zip(wb.remainder()).fold(0u64, |acc, (x, y)| acc | u64::from(x ^ y));
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().expect("8 bytes"));
    wa.zip(wb).fold(tail, |acc, (x, y)| acc | (word(x) ^ word(y))) == 0
}

#[cfg(test)]
mod tests {
    use super::secret_eq;

    #[test]
    fn equal_only_when_every_byte_and_the_length_match() {
        assert!(secret_eq(b"abc", b"abc"));
        assert!(secret_eq(b"", b""));
        assert!(!secret_eq(b"abc", b"abd"));
        assert!(!secret_eq(b"abc", b"ab"));
    }

    #[test]
    fn secret_eq_sees_every_byte() {
        // Whole words and a tail, the length of a slot id.
        let a: Vec<u8> = (0..42).collect();
        assert!(secret_eq(&a, &a));
        for i in 0..a.len() {
            let mut b = a.clone();
            b[i] ^= 0x80;
            assert!(!secret_eq(&a, &b), "byte {i}");
        }
        assert!(!secret_eq(&a, &a[1..]));
    }
}
