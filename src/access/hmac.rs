//! Request signing (SPEC §8 `hmac`): checks the `X-Nthpool-Timestamp`,
//! `X-Nthpool-Nonce` and `X-Nthpool-Signature` headers of one request.
//!
//! The signature is `v1=` + hex(HMAC-SHA256(secret, canonical)) where canonical is
//!
//! ```text
//! "v1\n" + METHOD + "\n" + PATH + "\n" + timestamp + "\n" + nonce + "\n" + hex(sha256(body))
//! ```
//!
//! with the timestamp and nonce exactly as sent (after the usual trimming of
//! surrounding spaces and tabs from a header value) and lower-case body hex. PATH is
//! whatever the caller passes; the server passes the request-target path.
//!
//! This module owns the format and the MAC; it does not remember nonces. After
//! [`verify`] succeeds the caller must insert [`Verified::nonce`] into the pool's
//! `NonceStore` until [`Verified::nonce_expires_ms`]: only a MAC-verified nonce
//! may occupy the bounded store, or anyone could fill it. The success path does
//! not allocate: hex is decoded and encoded in stack buffers.
//! [`check_headers`] is the part of [`verify`] a head decides alone (for
//! `Expect: 100-continue`): every refusal before the MAC, and no nonce.

use ::hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::denied::Denied;
use crate::http::{hex_digit, trim};

type HmacSha256 = Hmac<Sha256>;

/// Longest nonce accepted, in bytes.
pub const MAX_NONCE_BYTES: usize = 128;

const SIGNATURE_PREFIX: &[u8] = b"v1=";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

/// A request whose signature and timestamp checked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified<'a> {
    /// The nonce as signed, to insert into the nonce store.
    pub nonce: &'a [u8],
    /// The signed timestamp, epoch milliseconds.
    pub timestamp_ms: u64,
    /// When the nonce may be forgotten (exclusive), epoch milliseconds.
    ///
    /// A request is accepted while `|now - timestamp| <= tolerance`, so a replay
    /// of it could be accepted up to and including `timestamp + tolerance`; the
    /// nonce is remembered until exactly then and no longer, which keeps the
    /// bounded store as small as replay protection allows.
    pub nonce_expires_ms: u64,
}

/// Checks one request's signing headers. Each header is `None` when absent.
///
/// Rejections, in order of checking: missing or malformed headers, a timestamp
/// more than `tolerance_ms` away from `now_epoch_ms` in either direction, then the
/// MAC (compared in constant time). Nonce replay is the caller's check, after this.
#[allow(clippy::too_many_arguments)] // one argument per signed input; a struct would only rename them
pub fn verify<'a>(
    secret: &[u8],
    method: &str,
    path: &str,
    timestamp: Option<&[u8]>,
    nonce: Option<&'a [u8]>,
    signature: Option<&[u8]>,
    body: &[u8],
    now_epoch_ms: u64,
    tolerance_ms: u64,
) -> Result<Verified<'a>, Denied> {
    let headers = read_headers(timestamp, nonce, signature, now_epoch_ms, tolerance_ms)?;
    let mac = keyed_mac(secret, method, path, headers.timestamp, headers.nonce, body);
    mac.verify_slice(&headers.mac).map_err(|_| Denied::SIGNATURE_MISMATCH)?;

    let timestamp_ms = headers.timestamp_ms;
    Ok(Verified {
        nonce: headers.nonce,
        timestamp_ms,
        nonce_expires_ms: timestamp_ms.saturating_add(tolerance_ms).saturating_add(1),
    })
}

/// The part of [`verify`] that needs no body: every refusal it gives before
/// the MAC, the same one and in the same order, so a request can be refused
/// from its head (`Expect: 100-continue`). A pass here decides nothing: the
/// request still goes through [`verify`] once its body is in.
pub fn check_headers(
    timestamp: Option<&[u8]>,
    nonce: Option<&[u8]>,
    signature: Option<&[u8]>,
    now_epoch_ms: u64,
    tolerance_ms: u64,
) -> Result<(), Denied> {
    read_headers(timestamp, nonce, signature, now_epoch_ms, tolerance_ms).map(drop)
}

/// The signing headers, each present and well formed, the timestamp inside the window.
struct Headers<'t, 'a> {
    timestamp: &'t [u8],
    timestamp_ms: u64,
    nonce: &'a [u8],
    mac: [u8; 32],
}

fn read_headers<'t, 'a>(
    timestamp: Option<&'t [u8]>,
    nonce: Option<&'a [u8]>,
    signature: Option<&[u8]>,
    now_epoch_ms: u64,
    tolerance_ms: u64,
) -> Result<Headers<'t, 'a>, Denied> {
    let timestamp = trim(timestamp.ok_or(Denied::TIMESTAMP_MISSING)?);
    let timestamp_ms = parse_epoch_ms(timestamp).ok_or(Denied::TIMESTAMP_MALFORMED)?;
    let nonce = trim(nonce.ok_or(Denied::NONCE_MISSING)?);
    if !valid_nonce(nonce) {
        return Err(Denied::NONCE_MALFORMED);
    }
    let signature = trim(signature.ok_or(Denied::SIGNATURE_MISSING)?);
    let mac = parse_signature(signature).ok_or(Denied::SIGNATURE_MALFORMED)?;

    if now_epoch_ms > timestamp_ms && now_epoch_ms - timestamp_ms > tolerance_ms {
        return Err(Denied::TIMESTAMP_STALE);
    }
    if timestamp_ms > now_epoch_ms && timestamp_ms - now_epoch_ms > tolerance_ms {
        return Err(Denied::TIMESTAMP_FUTURE);
    }
    Ok(Headers { timestamp, timestamp_ms, nonce, mac })
}

/// The lower-case hex signature for these inputs, without the `v1=` prefix.
///
/// The client side of [`verify`], for tests, the load tool and documentation.
pub fn sign(secret: &[u8], method: &str, path: &str, timestamp: &[u8], nonce: &[u8], body: &[u8]) -> [u8; 64] {
    let tag = keyed_mac(secret, method, path, timestamp, nonce, body).finalize().into_bytes();
    hex_lower(tag.as_slice())
}

fn keyed_mac(secret: &[u8], method: &str, path: &str, timestamp: &[u8], nonce: &[u8], body: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    let body_hex = hex_lower(Sha256::digest(body).as_slice());
    for part in [
        b"v1\n".as_slice(),
        method.as_bytes(),
        b"\n",
        path.as_bytes(),
        b"\n",
        timestamp,
        b"\n",
        nonce,
        b"\n",
        &body_hex,
    ] {
        mac.update(part);
    }
    mac
}

fn hex_lower(bytes: &[u8]) -> [u8; 64] {
    debug_assert_eq!(bytes.len(), 32);
    let mut out = [0u8; 64];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX_LOWER[usize::from(b >> 4)];
        out[2 * i + 1] = HEX_LOWER[usize::from(b & 0x0f)];
    }
    out
}

/// `v1=` then exactly 64 hex digits of either case.
fn parse_signature(value: &[u8]) -> Option<[u8; 32]> {
    let hex = value.strip_prefix(SIGNATURE_PREFIX)?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
    }
    Some(out)
}

/// Epoch milliseconds: 1–20 ASCII digits that fit a `u64`, nothing else.
fn parse_epoch_ms(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &c| {
        if !c.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(c - b'0'))
    })
}

/// 1–128 printable ASCII characters (space through `~`). Control characters,
/// newlines in particular, would let one canonical string be read two ways.
fn valid_nonce(nonce: &[u8]) -> bool {
    (1..=MAX_NONCE_BYTES).contains(&nonce.len()) && nonce.iter().all(|&c| (0x20..=0x7e).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"pool-secret";
    const NOW: u64 = 1_710_000_000_000;
    const TOL: u64 = 300_000;
    const BODY: &[u8] = br#"{"wait":true}"#;

    struct Req {
        method: &'static str,
        path: &'static str,
        timestamp: Option<Vec<u8>>,
        nonce: Option<Vec<u8>>,
        signature: Option<Vec<u8>>,
        body: Vec<u8>,
    }

    fn signed_at(ts: u64) -> Req {
        let timestamp = ts.to_string().into_bytes();
        let nonce = b"n-0001".to_vec();
        let hex = sign(SECRET, "POST", "/pools/p/lock/acquire", &timestamp, &nonce, BODY);
        let mut signature = b"v1=".to_vec();
        signature.extend_from_slice(&hex);
        Req {
            method: "POST",
            path: "/pools/p/lock/acquire",
            timestamp: Some(timestamp),
            nonce: Some(nonce),
            signature: Some(signature),
            body: BODY.to_vec(),
        }
    }

    fn good() -> Req {
        signed_at(NOW)
    }

    fn check(r: &Req) -> Result<Verified<'_>, Denied> {
        check_under(SECRET, r)
    }

    fn check_under<'a>(secret: &[u8], r: &'a Req) -> Result<Verified<'a>, Denied> {
        verify(
            secret,
            r.method,
            r.path,
            r.timestamp.as_deref(),
            r.nonce.as_deref(),
            r.signature.as_deref(),
            &r.body,
            NOW,
            TOL,
        )
    }

    fn check_head_of(r: &Req) -> Result<(), Denied> {
        check_headers(r.timestamp.as_deref(), r.nonce.as_deref(), r.signature.as_deref(), NOW, TOL)
    }

    #[test]
    fn the_headers_alone_refuse_as_the_whole_check_does_up_to_the_mac() {
        type Edit = fn(&mut Req);
        let edits: [(Edit, Denied); 10] = [
            (|r| r.timestamp = None, Denied::TIMESTAMP_MISSING),
            (|r| r.nonce = None, Denied::NONCE_MISSING),
            (|r| r.signature = None, Denied::SIGNATURE_MISSING),
            (|r| (r.timestamp, r.nonce, r.signature) = (None, None, None), Denied::TIMESTAMP_MISSING),
            (|r| r.timestamp = Some(b"1e12".to_vec()), Denied::TIMESTAMP_MALFORMED),
            (|r| r.nonce = Some(b"a\nb".to_vec()), Denied::NONCE_MALFORMED),
            (|r| r.signature = Some(b"v1=abc".to_vec()), Denied::SIGNATURE_MALFORMED),
            (|r| *r = signed_at(NOW - TOL - 1), Denied::TIMESTAMP_STALE),
            (|r| *r = signed_at(NOW + TOL + 1), Denied::TIMESTAMP_FUTURE),
            // Stale and malformed at once: the malformed header is named first.
            (
                |r| (r.timestamp, r.signature) = (Some(b"0".to_vec()), Some(b"v2=00".to_vec())),
                Denied::SIGNATURE_MALFORMED,
            ),
        ];
        for (edit, denied) in edits {
            let mut r = good();
            edit(&mut r);
            assert_eq!(check(&r), Err(denied));
            assert_eq!(check_head_of(&r), Err(denied), "{}", denied.reason());
        }
        // What only the body and the MAC decide passes the head check.
        let edits: [Edit; 3] = [
            |r| r.body = b"{}".to_vec(),
            |r| r.path = "/pools/q/lock/acquire",
            |r| r.signature = Some([b"v1=".as_slice(), &[b'0'; 64]].concat()),
        ];
        for edit in edits {
            let mut r = good();
            edit(&mut r);
            assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
            assert_eq!(check_head_of(&r), Ok(()));
        }
        assert_eq!(check_head_of(&good()), Ok(()));
    }

    #[test]
    fn accepts_a_good_signature() {
        let r = good();
        let v = check(&r).unwrap();
        assert_eq!(v.nonce, b"n-0001");
        assert_eq!(v.timestamp_ms, NOW);
        assert_eq!(v.nonce_expires_ms, NOW + TOL + 1);
    }

    #[test]
    fn signature_hex_is_case_insensitive() {
        let mut r = good();
        let upper = r.signature.as_ref().unwrap()[3..].to_ascii_uppercase();
        r.signature = Some([b"v1=".as_slice(), &upper].concat());
        assert!(check(&r).is_ok());
    }

    #[test]
    fn surrounding_whitespace_is_trimmed() {
        let mut r = good();
        r.timestamp = Some([b" ".as_slice(), r.timestamp.as_ref().unwrap(), b"\t"].concat());
        r.signature = Some([r.signature.as_ref().unwrap().as_slice(), b" "].concat());
        assert!(check(&r).is_ok());
    }

    #[test]
    fn known_answer() {
        // Pins the canonical string so clients in other languages can be checked against it.
        let mut mac = HmacSha256::new_from_slice(b"k").unwrap();
        mac.update(b"v1\nGET\n/x\n1\nn\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let expected = hex_lower(mac.finalize().into_bytes().as_slice());
        assert_eq!(sign(b"k", "GET", "/x", b"1", b"n", b""), expected);
    }

    #[test]
    fn bad_signature() {
        let mut r = good();
        let sig = r.signature.as_mut().unwrap();
        let last = sig.len() - 1;
        sig[last] = if sig[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
    }

    #[test]
    fn wrong_secret() {
        let r = good();
        assert_eq!(check_under(b"other-secret", &r), Err(Denied::SIGNATURE_MISMATCH));
    }

    #[test]
    fn changed_body() {
        let mut r = good();
        r.body = br#"{"wait":false}"#.to_vec();
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
    }

    #[test]
    fn changed_path_or_method() {
        let mut r = good();
        r.path = "/pools/q/lock/acquire";
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
        let mut r = good();
        r.method = "PUT";
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
    }

    #[test]
    fn changed_nonce_or_timestamp() {
        let mut r = good();
        r.nonce = Some(b"n-0002".to_vec());
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
        let mut r = good();
        r.timestamp = Some((NOW + 1).to_string().into_bytes());
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISMATCH));
    }

    #[test]
    fn stale_timestamp() {
        assert!(check(&signed_at(NOW - TOL)).is_ok());
        assert_eq!(check(&signed_at(NOW - TOL - 1)), Err(Denied::TIMESTAMP_STALE));
        assert_eq!(check(&signed_at(0)), Err(Denied::TIMESTAMP_STALE));
    }

    #[test]
    fn future_timestamp() {
        assert!(check(&signed_at(NOW + TOL)).is_ok());
        assert_eq!(check(&signed_at(NOW + TOL + 1)), Err(Denied::TIMESTAMP_FUTURE));
        assert_eq!(check(&signed_at(u64::MAX)), Err(Denied::TIMESTAMP_FUTURE));
    }

    #[test]
    fn missing_headers() {
        let mut r = good();
        r.timestamp = None;
        assert_eq!(check(&r), Err(Denied::TIMESTAMP_MISSING));
        let mut r = good();
        r.nonce = None;
        assert_eq!(check(&r), Err(Denied::NONCE_MISSING));
        let mut r = good();
        r.signature = None;
        assert_eq!(check(&r), Err(Denied::SIGNATURE_MISSING));
    }

    #[test]
    fn malformed_timestamp() {
        for bad in [
            &b""[..],
            b"   ",
            b"-1",
            b"+1710000000000",
            b"1710000000000.0",
            b"1e12",
            b"0x1f",
            b"18446744073709551616", // u64::MAX + 1
            b"171000000000000000000000",
            b"17100 00000000",
        ] {
            let mut r = good();
            r.timestamp = Some(bad.to_vec());
            assert_eq!(check(&r), Err(Denied::TIMESTAMP_MALFORMED), "{bad:?}");
        }
    }

    #[test]
    fn malformed_nonce() {
        for bad in [Vec::new(), vec![b'a'; 129], b"a\nb".to_vec(), b"a\x7fb".to_vec(), "é".into()] {
            let mut r = good();
            r.nonce = Some(bad.clone());
            assert_eq!(check(&r), Err(Denied::NONCE_MALFORMED), "{bad:?}");
        }
    }

    #[test]
    fn longest_nonce_is_accepted() {
        let mut r = good();
        let nonce = vec![b'~'; MAX_NONCE_BYTES];
        let ts = r.timestamp.clone().unwrap();
        let hex = sign(SECRET, r.method, r.path, &ts, &nonce, BODY);
        r.nonce = Some(nonce);
        r.signature = Some([b"v1=".as_slice(), &hex].concat());
        assert!(check(&r).is_ok());
    }

    #[test]
    fn malformed_signature() {
        let hex = good().signature.unwrap()[3..].to_vec();
        for bad in [
            hex.clone(),                                    // no prefix
            [b"v2=".as_slice(), &hex].concat(),             // unknown version
            [b"V1=".as_slice(), &hex].concat(),             // prefix is case-sensitive
            [b"v1=".as_slice(), &hex[..62]].concat(),       // short
            [b"v1=".as_slice(), &hex, b"00"].concat(),      // long
            [b"v1=".as_slice(), &hex[..63], b"g"].concat(), // not hex
            [b"v1=".as_slice(), &hex, b",v1=", &hex].concat(),
        ] {
            let mut r = good();
            r.signature = Some(bad.clone());
            assert_eq!(check(&r), Err(Denied::SIGNATURE_MALFORMED), "{:?}", String::from_utf8_lossy(&bad));
        }
    }
}
