//! Leases and the `slotId` that names one.
//!
//! A `slotId` is 42 bytes shown as 56 URL-safe base64 characters, and it
//! describes itself (SPEC §11): the lease's slab index, its lease and request
//! deadlines at grant (Unix ms, 48 bits each), 128 random bits from the OS
//! source, and an 80-bit AES-128-CMAC tag (RFC 4493, truncated) under a key
//! derived from the server's 32-byte slot secret. The tag covers a 16-byte
//! digest of the pool's name followed by those 32 bytes, so an id is good for
//! its own pool only; the name is not in the id because every route that
//! takes an id names its pool too.
//! The index makes lookup O(1); the random part makes every id unique and
//! unguessable on its own (a stale id misses a newer lease in the same slab
//! slot because their random parts differ), and the MAC lets a server that
//! does not know the lease (after a crash, or a standby sharing the secret)
//! trust the deadlines it reads, so it can re-adopt the slot instead of
//! granting it twice.
//!
//! A known lease keeps its whole id, and its text too: renew and release read
//! the index from the first eight characters and compare all 56 with the
//! lease's in constant time, so they decode nothing and cost no MAC; only
//! grant and re-adoption do. (The text costs 56 bytes per held slot and saves
//! a 56-character decode per renew and release.)
//!
//! Why AES-CMAC: the MAC covers one 48-byte message whose first block, the
//! pool's digest, is the same for every id of a pool: its encryption is done
//! once per pool and start (`PoolSeal`), so a tag is two block encryptions
//! and three xors. With the CPU's AES instructions (detected at start; any
//! x86-64 of the last decade has them) that is about 80 instructions per
//! grant, against about 310 for SipHash-2-4-128 and 8,000 for HMAC-SHA256
//! (two SHA-256 compressions without the CPU's SHA extensions).
//! Without AES instructions the `aes` crate falls back to a constant-time
//! software AES, slower but still correct. The 80-bit tag is what a forger
//! must guess; the key comes from the secret through HMAC-SHA256, once per
//! start.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::{Aes128, Block};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::id::PoolId;
pub use crate::ct::secret_eq;
use crate::time::Ms;
use crate::wheel::TimerKey;

pub const SLOT_ID_BYTES: usize = 42;
pub const SLOT_ID_CHARS: usize = 56;
/// The id's bytes the MAC covers (after its pool's digest); the tag follows them.
const BODY: usize = 32;
const TAG: usize = SLOT_ID_BYTES - BODY;
/// Deadlines are stored as 48-bit Unix milliseconds (good until year 10889).
const DEADLINE_BYTES: usize = 6;
/// Where the fields lie in the body.
const LEASE_AT: usize = 4;
const REQUEST_AT: usize = LEASE_AT + DEADLINE_BYTES;
const RANDOM_AT: usize = REQUEST_AT + DEADLINE_BYTES;
/// Random bits per id: SPEC §5 asks for at least 128.
pub const RANDOM_BYTES: usize = BODY - RANDOM_AT;
const _: () = assert!(RANDOM_BYTES * 8 >= 128);

/// The raw bytes of a `slotId`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(pub [u8; SLOT_ID_BYTES]);

/// What a `slotId` says about itself; deadlines in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFields {
    pub index: u32,
    pub lease_deadline_unix: u64,
    pub request_deadline_unix: u64,
    pub random: [u8; RANDOM_BYTES],
}

/// Names what the derived key is for, so it is never the key of anything else.
/// (v1 keyed SipHash-2-4; v2 signed a layout with 64 random bits and a pool
/// tag in the id: ids signed under either do not verify.)
const KEY_LABEL: &[u8] = b"nthpool slotId AES-128-CMAC key v3";
/// Prefixes a pool's name in the digest its ids' MAC starts from.
const POOL_LABEL: &[u8] = b"nthpool slotId pool v3\0";

/// A pool's part of every one of its ids' MAC: the CMAC state after the
/// first block, the digest of the pool's name, under one `SlotKey`. Made once
/// per pool and key, so binding an id to its pool costs a grant nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSeal(u128);

/// The MAC key of slot ids, derived from the server's slot secret.
#[derive(Clone)]
pub struct SlotKey {
    cmac: Cmac,
}

impl SlotKey {
    pub fn new(secret: &[u8; 32]) -> SlotKey {
        let mut kdf = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
        kdf.update(KEY_LABEL);
        let derived = kdf.finalize().into_bytes();
        let key: &[u8; 16] = derived[..16].try_into().expect("16 of 32 bytes");
        SlotKey { cmac: Cmac::new(key) }
    }

    /// The seal of the pool named `name` under this key.
    pub fn seal(&self, name: &str) -> PoolSeal {
        let digest = Sha256::new().chain_update(POOL_LABEL).chain_update(name).finalize();
        PoolSeal(self.cmac.encrypt(u128::from_be_bytes(digest[..16].try_into().expect("16 of 32 bytes"))))
    }

    /// The tag of an id's body in `seal`'s pool: AES-CMAC of the pool's
    /// digest followed by the body, from the state after the digest.
    fn tag(&self, seal: PoolSeal, body: &[u8]) -> [u8; TAG] {
        let full = self.cmac.tag_after(seal.0, body);
        let mut out = [0u8; TAG];
        out.copy_from_slice(&full[..TAG]);
        out
    }

    /// Builds and signs an id of `seal`'s pool.
    pub fn sign(&self, seal: PoolSeal, f: &SlotFields) -> SlotId {
        let mut raw = [0u8; SLOT_ID_BYTES];
        raw[..LEASE_AT].copy_from_slice(&f.index.to_le_bytes());
        raw[LEASE_AT..REQUEST_AT].copy_from_slice(&f.lease_deadline_unix.to_le_bytes()[..DEADLINE_BYTES]);
        raw[REQUEST_AT..RANDOM_AT].copy_from_slice(&f.request_deadline_unix.to_le_bytes()[..DEADLINE_BYTES]);
        raw[RANDOM_AT..BODY].copy_from_slice(&f.random);
        let tag = self.tag(seal, &raw[..BODY]);
        raw[BODY..].copy_from_slice(&tag);
        SlotId(raw)
    }

    /// The fields of an id whose MAC is right under this key for `seal`'s
    /// pool; `None` for a tampered or forged id, one of another pool, or one
    /// signed under another secret.
    pub fn verify(&self, seal: PoolSeal, id: &SlotId) -> Option<SlotFields> {
        let tag = self.tag(seal, &id.0[..BODY]);
        secret_eq(&tag, &id.0[BODY..]).then(|| id.fields())
    }
}

/// AES-128-CMAC (RFC 4493, NIST SP 800-38B): AES-128 in CBC mode from a
/// zero block, the last block xor-ed with a subkey first (`k1` when it is
/// whole, else `k2` after padding it with 0x80 and zeros).
#[derive(Clone)]
struct Cmac {
    aes: Aes128,
    k1: u128,
    k2: u128,
}

impl Cmac {
    fn new(key: &[u8; 16]) -> Cmac {
        let aes = Aes128::new(&(*key).into());
        // The subkeys double E(K, 0) in GF(2^128), twice.
        let double = |b: u128| b << 1 ^ if b >> 127 == 1 { 0x87 } else { 0 };
        let mut cmac = Cmac { aes, k1: 0, k2: 0 };
        cmac.k1 = double(cmac.encrypt(0));
        cmac.k2 = double(cmac.k1);
        cmac
    }

    /// One block through AES, blocks read as big-endian numbers.
    fn encrypt(&self, block: u128) -> u128 {
        let mut b = Block::from(block.to_be_bytes());
        self.aes.encrypt_block(&mut b);
        u128::from_be_bytes(b.into())
    }

    /// The tag of `message`.
    #[cfg(test)]
    fn tag(&self, message: &[u8]) -> [u8; 16] {
        self.tag_after(0, message)
    }

    /// The tag of a message whose leading whole blocks left the chain at
    /// `state`, given the rest of it (non-empty when `state` is not 0).
    fn tag_after(&self, state: u128, message: &[u8]) -> [u8; 16] {
        let block = |bytes: &[u8]| u128::from_be_bytes(bytes.try_into().expect("16 bytes"));
        // The last block is the last 1 to 16 bytes (none for an empty message).
        let whole = (message.len().max(1) - 1) / 16 * 16;
        let (first, last) = message.split_at(whole);
        let mut x = state;
        for b in first.chunks_exact(16) {
            x = self.encrypt(x ^ block(b));
        }
        let last = if last.len() == 16 {
            block(last) ^ self.k1
        } else {
            let mut padded = [0u8; 16];
            padded[..last.len()].copy_from_slice(last);
            padded[last.len()] = 0x80;
            u128::from_be_bytes(padded) ^ self.k2
        };
        self.encrypt(x ^ last).to_be_bytes()
    }
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

    /// The fields, unchecked: only `SlotKey::verify` vouches for them.
    pub fn fields(&self) -> SlotFields {
        SlotFields {
            index: self.index(),
            lease_deadline_unix: read_u48(&self.0[LEASE_AT..REQUEST_AT]),
            request_deadline_unix: read_u48(&self.0[REQUEST_AT..RANDOM_AT]),
            random: self.0[RANDOM_AT..BODY].try_into().expect("16 bytes"),
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
        // The second half of the random part and the tag, folded a word at a
        // time by multiply and xor: enough to correlate lines, useless to
        // forge an id.
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
    /// The term it was granted with, which every renewal extends it by: a
    /// reload's new `termMs` is for new grants, since the holder renews on
    /// the `renewIntervalMs` its grant told it. (It fits in the padding: a
    /// lease is no larger for it.)
    pub term_ms: u32,
    /// The pool's congestion epoch when granted: reports about leases from an
    /// older epoch do not cut the limit again.
    pub epoch: u32,
    /// When it was granted, and the pool's grant count right after: a report
    /// is placed among the grants by these.
    pub granted_at: Ms,
    pub grant_seq: u64,
    /// `Learning::oks` at its grant: its report tells how many calls
    /// succeeded while it was held.
    pub oks_seq: u32,
    /// The wheel entry that reclaims the lease. Renew does not move it: the
    /// entry fires at the old deadline, sees the newer one and re-arms.
    pub timer: TimerKey,
    /// Taken back from an id another process granted (SPEC §11).
    pub adopted: bool,
    /// Restored from a snapshot taken while running, and neither renewed
    /// nor released since (see `Pool::unconfirmed`).
    pub unconfirmed: bool,
    /// Restored from a snapshot: when it ends here it stays dead, as a
    /// re-adopted one does, so a renewal after its release or reclaim is
    /// not taken for a holder this process never saw (a window may be open).
    /// Reclaimed while `unconfirmed`, it was not seen to end (`take_back`).
    pub restored: bool,
    /// The answers that carried it: its grant, and each idempotent retry
    /// answered with it since. One that could not be delivered takes one
    /// off; the last one's failing releases it, since then none arrived
    /// (`Governor::release_undelivered`). A lease restored or re-adopted
    /// counts its holder's one. At `u16::MAX` it stops counting, and the
    /// lease is left to its term.
    pub answers: u16,
    /// Its `Idempotency-Key`'s entry in the pool's store, or `NO_KEY`.
    pub idem: u32,
}

/// A lease's deadline granted, renewed or re-adopted at `now`: one term
/// away, and never past its request deadline.
pub fn lease_deadline(now: Ms, term_ms: Ms, request_deadline: Ms) -> Ms {
    now.saturating_add(term_ms).min(request_deadline)
}

impl Lease {
    /// The renewed deadline: one of its own terms from `now`.
    pub fn renewed_deadline(&self, now: Ms) -> Ms {
        lease_deadline(now, self.term_ms as Ms, self.request_deadline)
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
            lease_deadline_unix: 1_800_000_030_000,
            request_deadline_unix: 1_800_000_600_000,
            random: std::array::from_fn(|i| 0xf0 | i as u8),
        }
    }

    #[test]
    fn slot_id_round_trips_and_is_url_safe() {
        let key = SlotKey::new(&[9; 32]);
        let seal = key.seal("openai");
        let id = key.sign(seal, &fields());
        let text = id.encode();
        assert!(text.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
        let back = SlotId::decode(&text).unwrap();
        assert_eq!(back, id);
        assert_eq!(key.verify(seal, &back), Some(fields()));
    }

    #[test]
    fn an_id_carries_128_random_bits_and_both_deadlines() {
        let id = SlotKey::new(&[9; 32]).sign(SlotKey::new(&[9; 32]).seal("p"), &fields());
        assert_eq!(id.0[RANDOM_AT..BODY], fields().random);
        assert_eq!(id.fields(), fields());
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
        let seal = key.seal("openai");
        let id = key.sign(seal, &fields());
        for byte in 0..SLOT_ID_BYTES {
            let mut bad = id;
            bad.0[byte] ^= 1;
            assert_eq!(key.verify(seal, &bad), None, "flipped byte {byte}");
        }
        let other = SlotKey::new(&[8; 32]);
        assert_eq!(other.verify(other.seal("openai"), &id), None, "another secret");
        assert_eq!(key.verify(key.seal("openai2"), &id), None, "another pool");
        assert_eq!(key.verify(key.seal("OpenAI"), &id), None, "another pool");
        assert_eq!(key.verify(seal, &SlotId([0; SLOT_ID_BYTES])), None);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn the_mac_is_aes_128_cmac() {
        // RFC 4493 §4: its subkeys and its four examples (0, 16, 40 and 64
        // bytes), and the 32-byte case slot ids use (the first 32 bytes of the
        // same message, tag from OpenSSL's CMAC).
        let key: [u8; 16] = hex("2b7e151628aed2a6abf7158809cf4f3c").try_into().unwrap();
        let cmac = Cmac::new(&key);
        assert_eq!(cmac.k1.to_be_bytes().to_vec(), hex("fbeed618357133667c85e08f7236a8de"));
        assert_eq!(cmac.k2.to_be_bytes().to_vec(), hex("f7ddac306ae266ccf90bc11ee46d513b"));
        let message = hex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        for (len, tag) in [
            (0, "bb1d6929e95937287fa37d129b756746"),
            (16, "070a16b46b4d4144f79bdd9dd04a287c"),
            (32, "ce0cbf1738f4df6428b1d93bf12081c9"),
            (40, "dfa66747de9ae63030ca32611497c827"),
            (64, "51f0bebf7e3b9d92fc49741779363cfe"),
        ] {
            assert_eq!(cmac.tag(&message[..len]).to_vec(), hex(tag), "{len} bytes");
        }
        // The same tags from the state after the first block or two.
        let first = cmac.encrypt(u128::from_be_bytes(message[..16].try_into().unwrap()));
        assert_eq!(cmac.tag_after(first, &message[16..40]).to_vec(), hex("dfa66747de9ae63030ca32611497c827"));
        let second = cmac.encrypt(first ^ u128::from_be_bytes(message[16..32].try_into().unwrap()));
        assert_eq!(cmac.tag_after(second, &message[32..]).to_vec(), hex("51f0bebf7e3b9d92fc49741779363cfe"));
    }

    #[test]
    fn an_id_is_tagged_with_the_cmac_of_its_pools_digest_and_its_body() {
        let key = SlotKey::new(&[9; 32]);
        let id = key.sign(key.seal("openai"), &fields());
        let digest = Sha256::new().chain_update(POOL_LABEL).chain_update("openai").finalize();
        let message = [&digest[..16], &id.0[..BODY]].concat();
        assert_eq!(id.0[BODY..], key.cmac.tag(&message)[..TAG]);
    }

    #[test]
    fn encoding_matches_standard_base64url() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let key = SlotKey::new(&[1; 32]);
        let id = key.sign(key.seal("p"), &fields());
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
            let id = key.sign(key.seal("p"), &SlotFields { index, ..fields() });
            assert_eq!(text_index(&id.encode()), Some(index));
        }
        let mut text = key.sign(key.seal("p"), &fields()).encode();
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
            term_ms: 30,
            epoch: 0,
            granted_at: 0,
            grant_seq: 0,
            oks_seq: 0,
            timer: crate::wheel::Wheel::<()>::new().insert(0, ()),
            adopted: false,
            unconfirmed: false,
            restored: false,
            answers: 1,
            idem: super::super::idempotency::NO_KEY,
        };
        assert_eq!(lease.renewed_deadline(90), 120);
        assert_eq!(lease.renewed_deadline(130), 150);
    }
}
