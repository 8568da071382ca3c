//! The credential checks must not panic on any header values: HMAC request
//! signing, HS256 JWTs, Cloudflare Access RS256 assertions and the
//! `X-Forwarded-For` walk.
//!
//! Input: fields separated by `0xFF` bytes —
//! `timestamp, nonce, signature, body, jwt, cf-token, method+path, xff...`.
//! When the jwt field starts with `{`, it is split at the first `|` into a
//! JOSE header and a claims set, and the harness signs it correctly, so the
//! claim checks behind the signature are reached.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use nthpool::access::cloudflare::{self, Jwks};
use nthpool::access::hmac as signing;
use nthpool::access::ip::{client_addr, CidrSet};
use nthpool::access::jwt::JwtPolicy;
use sha2::Sha256;

const NOW_EPOCH_MS: u64 = 1_700_000_000_000;
const SECRET: &[u8] = b"fuzzing-secret-0123456789";

/// The RSA key of `src/access/cloudflare.rs`'s known-answer test.
const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"kat","alg":"RS256","use":"sig","e":"AQAB","n":"z6qRHwmhx7mePW7K4hO0VunQvTrLss8HWRq269qHIt-Judt7-tvm0DTUkd5FGG8OYT6N5QM4iJf2623gbT5Ls_V7hp8Og1CMfzDlAel4cM5jH6jcm6pCxsYAmJgE57qxrilGiL14JA8AAFPoYQo-s2H7OtrLHXy4PvivhI-Q25gknXzWT7dwdmEtkfUgraW0haBhqhdk8bFq8H_Ocz3EsFxjMTNjStZg1ifdsZBe1h4ddkXUxUf5iCgz6iLxcSLYT-Uc_qlaVZqZJeR18q3TEkO8YX7umxPsM0u_v3xKl66UqIZnfzSHITxAqkO01GHK1RhELsegk8eM47hy16stfw"}]}"#;

fn jwks() -> &'static Jwks {
    static JWKS_CELL: OnceLock<Jwks> = OnceLock::new();
    JWKS_CELL.get_or_init(|| Jwks::from_json(JWKS.as_bytes()).expect("the fixed JWKS is valid"))
}

fn trusted() -> &'static CidrSet {
    static TRUSTED: OnceLock<CidrSet> = OnceLock::new();
    TRUSTED.get_or_init(|| CidrSet::parse(["10.0.0.0/8", "::1/128", "fd00::/8"]).expect("valid CIDRs"))
}

fn policy() -> &'static JwtPolicy {
    static POLICY: OnceLock<JwtPolicy> = OnceLock::new();
    POLICY.get_or_init(|| JwtPolicy {
        secret: SECRET.to_vec(),
        issuer: Some("iss".into()),
        audience: Some("aud".into()),
        leeway_ms: 30_000,
    })
}

/// A compact HS256 JWS over `header` and `claims`, correctly signed.
fn sign(header: &[u8], claims: &[u8]) -> Vec<u8> {
    let mut token = URL_SAFE_NO_PAD.encode(header);
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(claims));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).expect("any key length");
    mac.update(token.as_bytes());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()));
    token.into_bytes()
}

fuzz_target!(|input: &[u8]| {
    let fields: Vec<&[u8]> = input.split(|&b| b == 0xff).collect();
    let field = |i: usize| fields.get(i).copied();

    let request_line = String::from_utf8_lossy(field(6).unwrap_or(b"POST /v1/p/acquire"));
    let (method, path) = request_line.split_once(' ').unwrap_or(("POST", &request_line));
    let _ = signing::verify(
        SECRET,
        method,
        path,
        field(0),
        field(1),
        field(2),
        field(3).unwrap_or_default(),
        NOW_EPOCH_MS,
        300_000,
    );

    if let Some(jwt) = field(4) {
        let _ = policy().verify(jwt, NOW_EPOCH_MS);
        if jwt.first() == Some(&b'{') {
            let (header, claims) = match jwt.iter().position(|&b| b == b'|') {
                Some(bar) => (&jwt[..bar], &jwt[bar + 1..]),
                None => (&br#"{"alg":"HS256"}"#[..], jwt),
            };
            let _ = policy().verify(&sign(header, claims), NOW_EPOCH_MS);
        }
    }

    if let Some(token) = field(5) {
        let _ = cloudflare::verify(token, jwks(), "aud", "https://team.cloudflareaccess.com", NOW_EPOCH_MS, 30_000);
    }

    let xff: Vec<&[u8]> = fields.iter().skip(7).copied().collect();
    for peer in [
        IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
    ] {
        let addr = client_addr(peer, &xff, trusted());
        // `X-Forwarded-For` is believed only from a trusted proxy.
        if !trusted().contains(peer) {
            assert_eq!(addr, peer, "an untrusted peer's X-Forwarded-For was believed");
        }
    }
});
