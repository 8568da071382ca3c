//! Leases and the `slotId` that names one.
//!
//! A `slotId` is 24 bytes shown as 32 URL-safe base64 characters: the lease's
//! slab index, its generation, and 128 random bits from the OS source. The
//! index makes lookup O(1); the generation makes a stale id miss instead of
//! hitting a newer lease in the same slab slot; the random part makes ids
//! unguessable, and is compared in constant time.

use super::pool::PoolId;
use super::Ms;
use crate::wheel::TimerKey;

pub const SLOT_ID_BYTES: usize = 24;
pub const SLOT_ID_CHARS: usize = 32;

/// The raw bytes of a `slotId`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SlotId(pub [u8; SLOT_ID_BYTES]);

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const INVALID: u8 = 0xff;
const B64URL_INV: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 64 {
        table[B64URL[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// Debug output shows only the log reference: ids are secrets.
impl std::fmt::Debug for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotId(#{:08x})", self.log_ref())
    }
}

impl SlotId {
    pub fn new(index: u32, generation: u32, secret: [u8; 16]) -> SlotId {
        let mut raw = [0u8; SLOT_ID_BYTES];
        raw[..4].copy_from_slice(&index.to_le_bytes());
        raw[4..8].copy_from_slice(&generation.to_le_bytes());
        raw[8..].copy_from_slice(&secret);
        SlotId(raw)
    }

    pub fn index(&self) -> u32 {
        u32::from_le_bytes(self.0[..4].try_into().expect("4 bytes"))
    }

    pub fn generation(&self) -> u32 {
        u32::from_le_bytes(self.0[4..8].try_into().expect("4 bytes"))
    }

    pub fn secret(&self) -> &[u8] {
        &self.0[8..]
    }

    /// Writes the 32-character text form: unpadded URL-safe base64 (RFC 4648
    /// §5). 24 bytes are exactly eight 3-byte groups, so this is a plain
    /// table walk; it runs on every grant, renew and release.
    pub fn encode(&self) -> [u8; SLOT_ID_CHARS] {
        let mut out = [0u8; SLOT_ID_CHARS];
        for g in 0..SLOT_ID_BYTES / 3 {
            let b = &self.0[3 * g..3 * g + 3];
            let n = (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize;
            out[4 * g] = B64URL[n >> 18];
            out[4 * g + 1] = B64URL[n >> 12 & 63];
            out[4 * g + 2] = B64URL[n >> 6 & 63];
            out[4 * g + 3] = B64URL[n & 63];
        }
        out
    }

    /// Parses the text form; anything else is `None` (and answers 404).
    pub fn decode(text: &[u8]) -> Option<SlotId> {
        let text: &[u8; SLOT_ID_CHARS] = text.try_into().ok()?;
        let mut raw = [0u8; SLOT_ID_BYTES];
        // Invalid characters map to 0xff; OR-ing everything finds one at the end.
        let mut invalid = 0u8;
        for g in 0..SLOT_ID_BYTES / 3 {
            let v = [0, 1, 2, 3].map(|i| B64URL_INV[text[4 * g + i] as usize]);
            invalid |= v[0] | v[1] | v[2] | v[3];
            let n = (v[0] as u32) << 18 | (v[1] as u32) << 12 | (v[2] as u32) << 6 | v[3] as u32;
            raw[3 * g..3 * g + 3].copy_from_slice(&n.to_be_bytes()[1..]);
        }
        (invalid & 0xc0 == 0).then_some(SlotId(raw))
    }

    /// A short reference for logs: a non-reversible hash of the id, never the id itself.
    pub fn log_ref(&self) -> u32 {
        // FNV-1a over the secret part; enough to correlate lines, useless to forge an id.
        self.secret().iter().fold(0x811c_9dc5u32, |h, &b| (h ^ b as u32).wrapping_mul(0x0100_0193))
    }
}

/// One held slot.
pub struct Lease {
    pub pool: PoolId,
    pub generation: u32,
    pub secret: [u8; 16],
    pub lease_deadline: Ms,
    pub request_deadline: Ms,
    /// The pool's congestion epoch when granted: reports about leases from an
    /// older epoch do not cut the limit again.
    pub epoch: u32,
    /// When it was granted, and the pool's grant count right after: a report
    /// is placed among the grants by these.
    pub granted_at: Ms,
    pub grant_seq: u64,
    /// The wheel entry that reclaims the lease. Renew does not move it: the
    /// entry fires at the old deadline, sees the newer one and re-arms.
    pub timer: TimerKey,
}

impl Lease {
    /// The renewed deadline; a lease never outlives its request deadline.
    pub fn renewed_deadline(&self, now: Ms, term_ms: u64) -> Ms {
        now.saturating_add(term_ms).min(self.request_deadline)
    }

    pub fn is_capped(&self) -> bool {
        self.lease_deadline >= self.request_deadline
    }
}

/// Constant-time equality for the secret part of an id.
pub fn secret_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// OS randomness, fetched a page at a time so a grant does not cost a syscall.
pub struct Entropy {
    buf: [u8; 4096],
    pos: usize,
}

impl Default for Entropy {
    fn default() -> Self {
        Entropy { buf: [0; 4096], pos: 4096 }
    }
}

impl Entropy {
    pub fn secret(&mut self) -> [u8; 16] {
        if self.pos + 16 > self.buf.len() {
            getrandom::getrandom(&mut self.buf).expect("the OS random source is available");
            self.pos = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.buf[self.pos..self.pos + 16]);
        // Never hand the same bytes out twice.
        self.buf[self.pos..self.pos + 16].fill(0);
        self.pos += 16;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_id_round_trips_and_is_url_safe() {
        let id = SlotId::new(7, 3, [0xfb; 16]);
        let text = id.encode();
        assert!(text.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
        let back = SlotId::decode(&text).unwrap();
        assert_eq!(back.index(), 7);
        assert_eq!(back.generation(), 3);
        assert_eq!(back.secret(), &[0xfb; 16]);
    }

    #[test]
    fn encoding_matches_standard_base64url() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let id = SlotId::new(0xdead_beef, 0x0102_0304, *b"\x00\xff\x10 any 16 bytes");
        assert_eq!(id.encode().as_slice(), URL_SAFE_NO_PAD.encode(id.0).as_bytes());
        for i in 0..=255u8 {
            let id = SlotId([i; SLOT_ID_BYTES]);
            assert_eq!(SlotId::decode(&id.encode()), Some(id));
        }
    }

    #[test]
    fn malformed_slot_ids_are_rejected() {
        assert!(SlotId::decode(b"").is_none());
        assert!(SlotId::decode(b"short").is_none());
        assert!(SlotId::decode(&[b'!'; SLOT_ID_CHARS]).is_none());
        assert!(SlotId::decode(&[b'A'; SLOT_ID_CHARS + 1]).is_none());
    }

    #[test]
    fn entropy_never_repeats_within_a_page() {
        let mut e = Entropy::default();
        let a = e.secret();
        let b = e.secret();
        assert_ne!(a, b);
        for _ in 0..600 {
            e.secret();
        }
    }

    #[test]
    fn renew_is_capped_by_request_deadline() {
        let lease = Lease {
            pool: PoolId(0),
            generation: 0,
            secret: [0; 16],
            lease_deadline: 100,
            request_deadline: 150,
            epoch: 0,
            granted_at: 0,
            grant_seq: 0,
            timer: crate::wheel::Wheel::<()>::new().insert(0, ()),
        };
        assert_eq!(lease.renewed_deadline(90, 30), 120);
        assert_eq!(lease.renewed_deadline(130, 30), 150);
    }
}
