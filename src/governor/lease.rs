//! Leases and the `slotId` that names one.
//!
//! A `slotId` is 42 bytes shown as 56 URL-safe base64 characters, and it
//! describes itself (SPEC §11): the lease's slab index and generation, a tag
//! of its pool's name, its lease and request deadlines at grant (Unix ms,
//! 48 bits each), 64 random bits from the OS source, and an 80-bit
//! SipHash-2-4 tag (128-bit output, truncated) over all of that, under a key
//! derived from the server's 32-byte slot secret.
//! The index makes lookup O(1); the generation makes a stale id miss instead
//! of hitting a newer lease in the same slab slot; random part and MAC make
//! 144 bits no client can guess. A server that does not know the lease (after
//! a crash, or a standby sharing the secret) can still check the MAC and read
//! the deadlines, so it can re-adopt the slot instead of granting it twice.
//!
//! A known lease keeps its whole id, and its text too: renew and release read
//! the index from the first eight characters and compare all 56 with the
//! lease's in constant time, so they decode nothing and cost no MAC; only
//! grant and re-adoption do. (The text costs 56 bytes per held slot and saves
//! a 56-character decode per renew and release.)
//!
//! Why SipHash and not HMAC-SHA256: the MAC covers one fixed 32-byte body,
//! the case SipHash was designed for (a keyed PRF for short inputs, 128-bit
//! key). HMAC-SHA256 over 32 bytes takes two SHA-256 compressions even with
//! its pads precomputed, about 8,000 instructions per grant without the CPU's
//! SHA extensions; SipHash-2-4 over 32 bytes is four message rounds and
//! eight finalisation rounds of additions, rotations and xors, a few hundred
//! instructions on any CPU. The 80-bit tag is what a forger must guess, as
//! before; the key comes from the secret through HMAC-SHA256, once per start.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use siphasher::sip128::SipHasher24;

use super::id::PoolId;
pub use crate::ct::secret_eq;
use crate::time::Ms;
use crate::wheel::TimerKey;

pub const SLOT_ID_BYTES: usize = 42;
pub const SLOT_ID_CHARS: usize = 56;
/// The bytes the MAC covers; the tag follows them.
const BODY: usize = 32;
const TAG: usize = SLOT_ID_BYTES - BODY;
/// Deadlines are stored as 48-bit Unix milliseconds (good until year 10889).
const DEADLINE_BYTES: usize = 6;

/// The raw bytes of a `slotId`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(pub [u8; SLOT_ID_BYTES]);

/// What a `slotId` says about itself; deadlines in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFields {
    pub index: u32,
    pub generation: u32,
    pub pool_tag: u32,
    pub lease_deadline_unix: u64,
    pub request_deadline_unix: u64,
    pub random: [u8; 8],
}

/// Names what the derived key is for, so it is never the key of anything else.
const KEY_LABEL: &[u8] = b"nthpool slotId SipHash-2-4-128 key v1";

/// The MAC key of slot ids, derived from the server's slot secret.
#[derive(Clone)]
pub struct SlotKey {
    sip: SipHasher24,
}

impl SlotKey {
    pub fn new(secret: &[u8; 32]) -> SlotKey {
        let mut kdf = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
        kdf.update(KEY_LABEL);
        let derived = kdf.finalize().into_bytes();
        let key: &[u8; 16] = derived[..16].try_into().expect("16 of 32 bytes");
        SlotKey { sip: SipHasher24::new_with_key(key) }
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG] {
        let full = self.sip.hash(body).as_bytes();
        let mut out = [0u8; TAG];
        out.copy_from_slice(&full[..TAG]);
        out
    }

    /// Builds and signs an id.
    pub fn sign(&self, f: &SlotFields) -> SlotId {
        let mut raw = [0u8; SLOT_ID_BYTES];
        raw[..4].copy_from_slice(&f.index.to_le_bytes());
        raw[4..8].copy_from_slice(&f.generation.to_le_bytes());
        raw[8..12].copy_from_slice(&f.pool_tag.to_le_bytes());
        raw[12..18].copy_from_slice(&f.lease_deadline_unix.to_le_bytes()[..DEADLINE_BYTES]);
        raw[18..24].copy_from_slice(&f.request_deadline_unix.to_le_bytes()[..DEADLINE_BYTES]);
        raw[24..BODY].copy_from_slice(&f.random);
        let tag = self.tag(&raw[..BODY]);
        raw[BODY..].copy_from_slice(&tag);
        SlotId(raw)
    }

    /// The fields of an id whose MAC is right under this key; `None` for a
    /// tampered or forged id, or one signed under another secret.
    pub fn verify(&self, id: &SlotId) -> Option<SlotFields> {
        let tag = self.tag(&id.0[..BODY]);
        secret_eq(&tag, &id.0[BODY..]).then(|| id.fields())
    }
}

/// A 32-bit tag of a pool name (FNV-1a), so an id names its pool across
/// restarts and reloads that renumber pools. Not a secret: the MAC covers it.
pub fn pool_tag(name: &str) -> u32 {
    fnv1a(name.as_bytes())
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ b as u32).wrapping_mul(0x0100_0193))
}

fn read_u48(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..DEADLINE_BYTES].copy_from_slice(b);
    u64::from_le_bytes(w)
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/// Two characters per 12 bits, the first in the high byte.
const B64URL_PAIRS: [u16; 4096] = {
    let mut table = [0u16; 4096];
    let mut i = 0;
    while i < 4096 {
        table[i] = (B64URL[i >> 6] as u16) << 8 | B64URL[i & 63] as u16;
        i += 1;
    }
    table
};
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
    pub fn index(&self) -> u32 {
        u32::from_le_bytes(self.0[..4].try_into().expect("4 bytes"))
    }

    pub fn generation(&self) -> u32 {
        u32::from_le_bytes(self.0[4..8].try_into().expect("4 bytes"))
    }

    /// The fields, unchecked: only `SlotKey::verify` vouches for them.
    pub fn fields(&self) -> SlotFields {
        SlotFields {
            index: self.index(),
            generation: self.generation(),
            pool_tag: u32::from_le_bytes(self.0[8..12].try_into().expect("4 bytes")),
            lease_deadline_unix: read_u48(&self.0[12..18]),
            request_deadline_unix: read_u48(&self.0[18..24]),
            random: self.0[24..BODY].try_into().expect("8 bytes"),
        }
    }

    /// Writes the 56-character text form: unpadded URL-safe base64 (RFC 4648
    /// §5). 42 bytes are exactly seven 6-byte groups of eight characters; each
    /// group is read as one big-endian word and written two characters (12
    /// bits) per table look-up. It runs on every grant.
    pub fn encode(&self) -> SlotText {
        let mut out = [0u8; SLOT_ID_CHARS];
        let raw = &self.0;
        let word = |at: usize| u64::from_be_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        for (g, chars) in out.chunks_exact_mut(8).enumerate() {
            // The group's six bytes as the low 48 bits of one word read in
            // place: the two bytes after it, or for the last group the two
            // before it, fall outside.
            let n = if 6 * g + 8 <= SLOT_ID_BYTES { word(6 * g) >> 16 } else { word(6 * g - 2) & 0xffff_ffff_ffff };
            let pair = |shift: u32| B64URL_PAIRS[(n >> shift) as usize & 0xfff];
            let text =
                u64::from(pair(36)) << 48 | u64::from(pair(24)) << 32 | u64::from(pair(12)) << 16 | u64::from(pair(0));
            chars.copy_from_slice(&text.to_be_bytes());
        }
        out
    }

    /// Parses the text form; anything else is `None` (and answers 404).
    pub fn decode(text: &[u8]) -> Option<SlotId> {
        let text: &SlotText = text.try_into().ok()?;
        let mut raw = [0u8; SLOT_ID_BYTES];
        // Invalid characters map to 0xff; OR-ing everything finds one at the end.
        let mut invalid = 0u8;
        for g in 0..SLOT_ID_BYTES / 3 {
            let (n, bad) = decode_group(text, g);
            invalid |= bad;
            raw[3 * g..3 * g + 3].copy_from_slice(&n.to_be_bytes()[1..]);
        }
        (invalid & 0xc0 == 0).then_some(SlotId(raw))
    }

    /// A short reference for logs: a non-reversible hash of the id, never the id itself.
    pub fn log_ref(&self) -> u32 {
        // The random part and the tag folded a word at a time by multiply and
        // xor: enough to correlate lines, useless to forge an id.
        const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
        let word = |at: usize| u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"));
        let last = u64::from(u16::from_le_bytes([self.0[40], self.0[41]]));
        let h = (word(24).wrapping_mul(MIX) ^ word(32)).wrapping_mul(MIX) ^ last;
        let h = h.wrapping_mul(MIX);
        (h >> 32) as u32
    }
}

/// The 24 bits of the `g`-th four characters of a slot id's text, and the OR
/// of their six-bit values (a bit above the sixth marks a character that is
/// not base64url).
fn decode_group(text: &SlotText, g: usize) -> (u32, u8) {
    let v = [0, 1, 2, 3].map(|i| B64URL_INV[text[4 * g + i] as usize]);
    let n = (v[0] as u32) << 18 | (v[1] as u32) << 12 | (v[2] as u32) << 6 | v[3] as u32;
    (n, v[0] | v[1] | v[2] | v[3])
}

/// The text form of a slot id: what a grant answers and a renew or release names.
pub type SlotText = [u8; SLOT_ID_CHARS];

/// The lease-table index a slot id's text names (its first four bytes, in
/// its first eight characters), without decoding the rest; `None` when
/// those characters are not base64url. Renew and release look the lease up
/// by it and compare the whole text with the one kept there, so the other
/// 48 characters need no decoding.
pub fn text_index(text: &SlotText) -> Option<u32> {
    let (first, bad_first) = decode_group(text, 0);
    let (second, bad_second) = decode_group(text, 1);
    let [_, a, b, c] = first.to_be_bytes();
    ((bad_first | bad_second) & 0xc0 == 0).then(|| u32::from_le_bytes([a, b, c, (second >> 16) as u8]))
}

/// One held slot.
pub struct Lease {
    pub pool: PoolId,
    /// The id it was granted (or re-adopted) under; renew and release must present it whole.
    pub id: SlotId,
    /// `id` as text, as renew and release present it: compared whole, in
    /// constant time, so a known lease's id is never decoded.
    pub text: SlotText,
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
    /// Taken back from an id another process granted (SPEC §11).
    pub adopted: bool,
    /// Its `Idempotency-Key`'s entry in the pool's store, or `NO_KEY`.
    pub idem: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> SlotFields {
        SlotFields {
            index: 7,
            generation: 3,
            pool_tag: pool_tag("openai"),
            lease_deadline_unix: 1_800_000_030_000,
            request_deadline_unix: 1_800_000_600_000,
            random: [0xfb; 8],
        }
    }

    #[test]
    fn slot_id_round_trips_and_is_url_safe() {
        let key = SlotKey::new(&[9; 32]);
        let id = key.sign(&fields());
        let text = id.encode();
        assert!(text.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
        let back = SlotId::decode(&text).unwrap();
        assert_eq!(back, id);
        assert_eq!(key.verify(&back), Some(fields()));
    }

    /// Unpadded base64url, six bits at a time: what `encode` must agree with.
    fn reference_base64url(raw: &[u8]) -> Vec<u8> {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let bits: Vec<u8> = raw.iter().flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1)).collect();
        bits.chunks(6).map(|c| ALPHABET[c.iter().fold(0, |acc, &b| acc << 1 | b as usize)]).collect()
    }

    #[test]
    fn encode_is_base64url_for_every_byte_in_every_place() {
        for place in 0..SLOT_ID_BYTES {
            for value in [0u8, 1, 0x3f, 0x80, 0xa5, 0xfe, 0xff] {
                let mut raw: [u8; SLOT_ID_BYTES] = std::array::from_fn(|i| (i as u8).wrapping_mul(37));
                raw[place] = value;
                let id = SlotId(raw);
                assert_eq!(id.encode().to_vec(), reference_base64url(&raw), "byte {place} = {value:#x}");
                assert_eq!(SlotId::decode(&id.encode()), Some(id));
            }
        }
    }

    #[test]
    fn tampered_forged_and_foreign_ids_fail_the_mac() {
        let key = SlotKey::new(&[9; 32]);
        let id = key.sign(&fields());
        for byte in 0..SLOT_ID_BYTES {
            let mut bad = id;
            bad.0[byte] ^= 1;
            assert_eq!(key.verify(&bad), None, "flipped byte {byte}");
        }
        assert_eq!(SlotKey::new(&[8; 32]).verify(&id), None);
        assert_eq!(key.verify(&SlotId([0; SLOT_ID_BYTES])), None);
    }

    #[test]
    fn the_mac_is_siphash_2_4_128() {
        // The reference implementation's first 128-bit vector: key 00..0f, empty input.
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let out = SipHasher24::new_with_key(&key).hash(b"").as_bytes();
        assert_eq!(
            out,
            [0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93]
        );
    }

    #[test]
    fn encoding_matches_standard_base64url() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let id = SlotKey::new(&[1; 32]).sign(&fields());
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
    fn the_index_read_from_the_text_is_the_ids() {
        let key = SlotKey::new(&[3; 32]);
        for index in [0, 1, 255, 256, 65_535, 1 << 24, 0x89ab_cdef, u32::MAX] {
            let id = key.sign(&SlotFields { index, ..fields() });
            assert_eq!(text_index(&id.encode()), Some(index));
        }
        let mut text = key.sign(&fields()).encode();
        for at in 0..8 {
            let good = text[at];
            text[at] = b'=';
            assert_eq!(text_index(&text), None, "{at}");
            text[at] = good;
        }
        // Only the first eight characters are read.
        text[8] = b'=';
        assert_eq!(text_index(&text), Some(fields().index));
    }

    #[test]
    fn renew_is_capped_by_request_deadline() {
        let lease = Lease {
            pool: PoolId(0),
            id: SlotId([0; SLOT_ID_BYTES]),
            text: SlotId([0; SLOT_ID_BYTES]).encode(),
            lease_deadline: 100,
            request_deadline: 150,
            epoch: 0,
            granted_at: 0,
            grant_seq: 0,
            timer: crate::wheel::Wheel::<()>::new().insert(0, ()),
            adopted: false,
            idem: super::super::idempotency::NO_KEY,
        };
        assert_eq!(lease.renewed_deadline(90, 30), 120);
        assert_eq!(lease.renewed_deadline(130, 30), 150);
    }
}
