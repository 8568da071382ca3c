//! The `cloudflareAccess` access policy (SPEC §8): the `Cf-Access-Jwt-Assertion`
//! token, RS256-signed by one of the keys in the pool's `jwksFile`.
//!
//! This module parses a JWKS document and verifies tokens against it; reading the
//! file and reloading it on SIGHUP belong to the caller, which should keep the old
//! [`Jwks`] when a reload fails. Nothing here fetches anything: the keys are only
//! ever the ones handed in, whatever a token's `jku`/`x5u` say.
//!
//! Key selection: a token naming a `kid` is tried against every key with that
//! `kid` (so both keys of a rotation work, and a duplicated `kid` is harmless); a
//! `kid` that no key has is refused outright; a token without `kid` is tried
//! against every key.
//!
//! JWKS loading: keys whose `kty` is not `RSA`, whose `alg` is present and not
//! `RS256`, or whose `use` is present and not `sig` are skipped, since Cloudflare's
//! and other issuers' documents may carry them for other purposes. An RSA key that
//! is malformed or shorter than 2048 bits is an error rather than skipped: it is a
//! broken or weak file the operator must hear about. No usable key is an error.
//!
//! The signature check is RSASSA-PKCS1-v1_5 with SHA-256, built from the
//! explicit SHA-256 DigestInfo prefix ([`rsa::Pkcs1v15Sign`] with public fields)
//! rather than `rsa::pkcs1v15::VerifyingKey<Sha256>`, which needs `sha2`'s `oid`
//! feature; a known-answer test against an OpenSSL-made token pins the prefix.

use rsa::traits::PublicKeyParts;
use rsa::{BigUint, Pkcs1v15Sign, RsaPublicKey};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::denied::Denied;
use super::jws::{self, ClaimRules, MAX_SIGNATURE_BYTES};

/// The only algorithm accepted, compared byte for byte.
const ALG: &str = "RS256";

/// Shortest RSA modulus loaded, in bits.
pub const MIN_RSA_BITS: usize = 2048;

/// DER of `DigestInfo { AlgorithmIdentifier { id-sha256, NULL }, OCTET STRING (32) }`
/// up to the digest itself (RFC 8017 §9.2, note 1).
const SHA256_DIGEST_INFO_PREFIX: [u8; 19] =
    [0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20];

fn rs256_scheme() -> Pkcs1v15Sign {
    Pkcs1v15Sign { hash_len: Some(32), prefix: Box::new(SHA256_DIGEST_INFO_PREFIX) }
}

/// The usable keys of one JWKS document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Jwk {
    kid: Option<String>,
    key: RsaPublicKey,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    #[serde(default)]
    kty: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
}

impl RawJwk {
    /// An RSA key for RS256 signatures; any other is passed over.
    fn is_rsa_signing(&self) -> bool {
        self.kty.as_deref() == Some("RSA")
            && self.alg.as_deref().is_none_or(|a| a == ALG)
            && self.use_.as_deref().is_none_or(|u| u == "sig")
    }
}

impl Jwks {
    /// No key: every token is refused.
    pub fn none() -> Jwks {
        Jwks { keys: Vec::new() }
    }

    /// Whether `bytes` is a well-formed JWKS document that holds no RSA
    /// signing key at all (`{"keys":[]}`): a revocation, not a broken file.
    pub fn names_no_key(bytes: &[u8]) -> bool {
        serde_json::from_slice::<RawJwks>(bytes).is_ok_and(|raw| !raw.keys.iter().any(RawJwk::is_rsa_signing))
    }

    /// Parses a JWKS document (`{"keys":[...]}`); see the module docs for which
    /// keys are kept. The error is a sentence for the operator's log.
    pub fn from_json(bytes: &[u8]) -> Result<Jwks, String> {
        let raw: RawJwks = serde_json::from_slice(bytes).map_err(|e| format!("the JWKS is not valid: {e}"))?;
        let mut keys = Vec::new();
        // Keys are named by their place in `keys` counted from 1, as the
        // configuration's own lists name their entries.
        for (place, raw_key) in (1..).zip(raw.keys) {
            if !raw_key.is_rsa_signing() {
                continue;
            }
            let name = match &raw_key.kid {
                Some(kid) => format!("key {place} (kid {kid:?})"),
                None => format!("key {place}"),
            };
            let n =
                decode_uint(raw_key.n.as_deref()).ok_or_else(|| format!("{name}: n is missing or not base64url"))?;
            let e =
                decode_uint(raw_key.e.as_deref()).ok_or_else(|| format!("{name}: e is missing or not base64url"))?;
            let key = RsaPublicKey::new(n, e).map_err(|err| format!("{name}: not a usable RSA key: {err}"))?;
            if key.n().bits() < MIN_RSA_BITS {
                return Err(format!("{name}: the RSA modulus is shorter than {MIN_RSA_BITS} bits"));
            }
            keys.push(Jwk { kid: raw_key.kid, key });
        }
        if keys.is_empty() {
            return Err("the JWKS has no RSA RS256 signing key".to_owned());
        }
        Ok(Jwks { keys })
    }

    /// How many keys were kept.
    #[cfg(test)]
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

fn decode_uint(text: Option<&str>) -> Option<BigUint> {
    let bytes = URL_SAFE_NO_PAD.decode(text?).ok()?;
    Some(BigUint::from_bytes_be(&bytes))
}

/// Accepts `token` if it is an RS256 token signed by a key in `jwks`, for
/// `audience`, from `issuer`, and within its validity at `now_epoch_ms` (with
/// `leeway_ms` of clock skew).
pub fn verify(
    token: &[u8],
    jwks: &Jwks,
    audience: &str,
    issuer: &str,
    now_epoch_ms: u64,
    leeway_ms: u64,
) -> Result<(), Denied> {
    let mut buf = [0u8; MAX_SIGNATURE_BYTES];
    let (compact, header, signature) = jws::open(token, ALG, &mut buf)?;
    let digest = Sha256::digest(compact.signing_input);
    let mut candidates = jwks.keys.iter().filter(|k| header.kid.is_none() || k.kid == header.kid).peekable();
    if candidates.peek().is_none() {
        return Err(Denied::TOKEN_KEY_UNKNOWN);
    }
    if !candidates.any(|k| k.key.verify(rs256_scheme(), &digest, signature).is_ok()) {
        return Err(Denied::TOKEN_SIGNATURE_INVALID);
    }
    let rules = ClaimRules { issuer: Some(issuer), audience: Some(audience), leeway_ms };
    compact.check_claims(&rules, now_epoch_ms)
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use rsa::RsaPrivateKey;

    use super::super::jws::testing::{b64, signing_input};
    use super::*;

    const NOW: u64 = 1_710_000_000_000;
    const NOW_S: u64 = NOW / 1000;
    const AUD: &str = "4714c1358e65fe4b408ad6d432a5f878f08194bdb4752441fd56faefa9b2b6f2";
    const ISS: &str = "https://team.cloudflareaccess.com";
    const LEEWAY: u64 = 30_000;

    /// Two keys of a rotation, and one that is not in the JWKS.
    fn keys() -> &'static [RsaPrivateKey; 3] {
        static KEYS: OnceLock<[RsaPrivateKey; 3]> = OnceLock::new();
        KEYS.get_or_init(|| {
            let mut rng = StdRng::seed_from_u64(0x006e_7468_706f_6f6c);
            [(); 3].map(|()| RsaPrivateKey::new(&mut rng, 2048).expect("RSA key generation"))
        })
    }

    fn jwk_json(kid: &str, key: &RsaPrivateKey) -> String {
        format!(
            r#"{{"kty":"RSA","kid":"{kid}","alg":"RS256","use":"sig","e":"{}","n":"{}"}}"#,
            b64(&key.e().to_bytes_be()),
            b64(&key.n().to_bytes_be())
        )
    }

    fn jwks() -> Jwks {
        let [k1, k2, _] = keys();
        // Shaped like Cloudflare's certs endpoint, with extra members and a non-RSA key.
        let doc = format!(
            r#"{{"keys":[{},{{"kty":"EC","kid":"ec","crv":"P-256","x":"AA","y":"AA"}},{}],
                "public_cert":{{"kid":"k1","cert":"-----BEGIN CERTIFICATE-----"}}}}"#,
            jwk_json("k1", k1),
            jwk_json("k2", k2)
        );
        Jwks::from_json(doc.as_bytes()).unwrap()
    }

    fn sign_rs256(key: &RsaPrivateKey, header: &str, claims: &str) -> String {
        let input = signing_input(header, claims);
        let sig = key.sign(rs256_scheme(), &Sha256::digest(input.as_bytes())).unwrap();
        format!("{input}.{}", b64(&sig))
    }

    fn claims(aud: &str, iss: &str, exp: u64) -> String {
        format!(r#"{{"aud":["{aud}"],"email":"a@example.com","exp":{exp},"iat":{NOW_S},"iss":"{iss}","sub":"u1"}}"#)
    }

    fn good_claims() -> String {
        claims(AUD, ISS, NOW_S + 600)
    }

    fn header(kid: &str) -> String {
        format!(r#"{{"alg":"RS256","kid":"{kid}","typ":"JWT"}}"#)
    }

    fn check(token: &str) -> Result<(), Denied> {
        verify(token.as_bytes(), &jwks(), AUD, ISS, NOW, LEEWAY)
    }

    #[test]
    fn good_token_with_first_key() {
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &good_claims())), Ok(()));
    }

    #[test]
    fn good_token_with_second_key() {
        assert_eq!(check(&sign_rs256(&keys()[1], &header("k2"), &good_claims())), Ok(()));
    }

    #[test]
    fn token_without_kid_tries_every_key() {
        let h = r#"{"alg":"RS256"}"#;
        assert_eq!(check(&sign_rs256(&keys()[1], h, &good_claims())), Ok(()));
        assert_eq!(check(&sign_rs256(&keys()[2], h, &good_claims())), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn kid_selects_the_key() {
        // Signed by key 2 but naming key 1: only key 1 is tried.
        assert_eq!(check(&sign_rs256(&keys()[1], &header("k1"), &good_claims())), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn unknown_kid() {
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k9"), &good_claims())), Err(Denied::TOKEN_KEY_UNKNOWN));
        // The non-RSA key was skipped, so its kid is unknown too.
        assert_eq!(check(&sign_rs256(&keys()[0], &header("ec"), &good_claims())), Err(Denied::TOKEN_KEY_UNKNOWN));
    }

    #[test]
    fn signed_by_another_key() {
        assert_eq!(check(&sign_rs256(&keys()[2], &header("k1"), &good_claims())), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn wrong_audience() {
        let c = claims("another-app", ISS, NOW_S + 600);
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &c)), Err(Denied::TOKEN_WRONG_AUDIENCE));
        let c = format!(r#"{{"aud":"{AUD}","exp":{},"iss":"{ISS}"}}"#, NOW_S + 600);
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &c)), Ok(()), "aud as a string");
    }

    #[test]
    fn wrong_issuer() {
        let c = claims(AUD, "https://other.cloudflareaccess.com", NOW_S + 600);
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &c)), Err(Denied::TOKEN_WRONG_ISSUER));
    }

    #[test]
    fn expired() {
        let c = claims(AUD, ISS, NOW_S - 31);
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &c)), Err(Denied::TOKEN_EXPIRED));
    }

    #[test]
    fn not_yet_valid() {
        let c = format!(r#"{{"aud":["{AUD}"],"exp":{},"nbf":{},"iss":"{ISS}"}}"#, NOW_S + 600, NOW_S + 60);
        assert_eq!(check(&sign_rs256(&keys()[0], &header("k1"), &c)), Err(Denied::TOKEN_NOT_YET_VALID));
    }

    #[test]
    fn only_rs256() {
        // HS256 keyed with the public modulus: the classic algorithm-confusion forgery.
        let input = signing_input(r#"{"alg":"HS256","kid":"k1"}"#, &good_claims());
        let t = format!("{input}.{}", b64(&[0u8; 32]));
        assert_eq!(check(&t), Err(Denied::TOKEN_ALG_REFUSED));
        let input = signing_input(r#"{"alg":"none"}"#, &good_claims());
        assert_eq!(check(&format!("{input}.")), Err(Denied::TOKEN_ALG_REFUSED));
        let t = sign_rs256(&keys()[0], r#"{"alg":"RS512","kid":"k1"}"#, &good_claims());
        assert_eq!(check(&t), Err(Denied::TOKEN_ALG_REFUSED));
    }

    #[test]
    fn tampered_claims() {
        let t = sign_rs256(&keys()[0], &header("k1"), &good_claims());
        let parts: Vec<&str> = t.split('.').collect();
        let forged = b64(claims(AUD, ISS, NOW_S + 999_999).as_bytes());
        assert_eq!(check(&format!("{}.{forged}.{}", parts[0], parts[2])), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn crit_is_refused() {
        let t = sign_rs256(&keys()[0], r#"{"alg":"RS256","kid":"k1","crit":["x"]}"#, &good_claims());
        assert_eq!(check(&t), Err(Denied::TOKEN_CRIT_REFUSED));
    }

    #[test]
    fn openssl_known_answer() {
        // A key and token made with `openssl dgst -sha256 -sign`, independent of this code.
        let jwks = Jwks::from_json(KAT_JWKS.as_bytes()).unwrap();
        let (aud, iss) = ("kat-aud", "https://kat.cloudflareaccess.com");
        assert_eq!(verify(KAT_TOKEN.as_bytes(), &jwks, aud, iss, NOW, 0), Ok(()));
        let i = KAT_TOKEN.rfind('.').unwrap() + 5;
        let mut forged = KAT_TOKEN.to_owned();
        let flipped = if &forged[i..=i] == "A" { "B" } else { "A" };
        forged.replace_range(i..=i, flipped);
        assert_eq!(verify(forged.as_bytes(), &jwks, aud, iss, NOW, 0), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn jwks_rejects_documents_without_usable_keys() {
        assert!(Jwks::from_json(b"not json").is_err());
        assert!(Jwks::from_json(br#"{"keys":[]}"#).is_err());
        assert!(Jwks::from_json(br#"{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}"#).is_err());
        let k1 = jwk_json("k1", &keys()[0]);
        let enc = k1.replace(r#""use":"sig""#, r#""use":"enc""#);
        assert!(Jwks::from_json(format!(r#"{{"keys":[{enc}]}}"#).as_bytes()).is_err());
        let rs512 = k1.replace(r#""alg":"RS256""#, r#""alg":"RS512""#);
        assert!(Jwks::from_json(format!(r#"{{"keys":[{rs512}]}}"#).as_bytes()).is_err());
    }

    #[test]
    fn jwks_rejects_broken_rsa_keys() {
        let err = Jwks::from_json(br#"{"keys":[{"kty":"RSA","kid":"x","e":"AQAB"}]}"#).unwrap_err();
        assert!(err.contains("n is missing"), "{err}");
        let err = Jwks::from_json(br#"{"keys":[{"kty":"RSA","kid":"x","e":"AQAB","n":"a+b/"}]}"#).unwrap_err();
        assert!(err.contains("not base64url"), "{err}");
        // 1024-bit modulus: too weak.
        let small = format!(r#"{{"keys":[{{"kty":"RSA","e":"AQAB","n":"{}"}}]}}"#, b64(&[0xc3; 128]));
        let err = Jwks::from_json(small.as_bytes()).unwrap_err();
        assert!(err.contains("shorter than 2048"), "{err}");
    }

    #[test]
    fn a_broken_key_is_named_by_its_place_from_one() {
        let small = format!(r#"{{"kty":"RSA","e":"AQAB","n":"{}"}}"#, b64(&[0xc3; 128]));
        let first = Jwks::from_json(format!(r#"{{"keys":[{small}]}}"#).as_bytes()).unwrap_err();
        assert!(first.starts_with("key 1: "), "{first}");
        let second =
            format!(r#"{{"keys":[{},{}]}}"#, jwk_json("k1", &keys()[0]), small.replace('{', r#"{"kid":"old","#));
        let err = Jwks::from_json(second.as_bytes()).unwrap_err();
        assert!(err.starts_with(r#"key 2 (kid "old"): "#), "{err}");
    }

    #[test]
    fn jwks_keeps_usable_keys() {
        assert_eq!(jwks().key_count(), 2);
        // A key with no alg and no use is kept.
        let k = jwk_json("k", &keys()[0]).replace(r#""alg":"RS256","use":"sig","#, "");
        assert_eq!(Jwks::from_json(format!(r#"{{"keys":[{k}]}}"#).as_bytes()).unwrap().key_count(), 1);
    }

    const KAT_JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"kat","alg":"RS256","use":"sig","e":"AQAB","n":"z6qRHwmhx7mePW7K4hO0VunQvTrLss8HWRq269qHIt-Judt7-tvm0DTUkd5FGG8OYT6N5QM4iJf2623gbT5Ls_V7hp8Og1CMfzDlAel4cM5jH6jcm6pCxsYAmJgE57qxrilGiL14JA8AAFPoYQo-s2H7OtrLHXy4PvivhI-Q25gknXzWT7dwdmEtkfUgraW0haBhqhdk8bFq8H_Ocz3EsFxjMTNjStZg1ifdsZBe1h4ddkXUxUf5iCgz6iLxcSLYT-Uc_qlaVZqZJeR18q3TEkO8YX7umxPsM0u_v3xKl66UqIZnfzSHITxAqkO01GHK1RhELsegk8eM47hy16stfw"}]}"#;

    const KAT_TOKEN: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImthdCIsInR5cCI6IkpXVCJ9.eyJhdWQiOlsia2F0LWF1ZCJdLCJpc3MiOiJodHRwczovL2thdC5jbG91ZGZsYXJlYWNjZXNzLmNvbSIsImV4cCI6NDEwMjQ0NDgwMCwiaWF0IjoxNzEwMDAwMDAwfQ.Kddzj2fUvSWO7nvVsTSFmqEzF5GdBL3aD-tDp_0halQirNAHVb5joIBDrSVI8Vt_gRKDqouHD-i4U4Hz8np14AlORAGCfxUN52BHlkdm-dmRYlx6aKTV9kBg803gewp7cjom-zrNN4pqxNshG4C3WYOtf2NDQoJm74MGmrFXqMy5s383A027iivhKVKAQdm7LQ2KrbBOo4mtsSEW_tsgXQvqJEIQgkemLNyYi8M3TDjh08gRUPSFKSodxqyP32m54gy6IozuolmR2lo6Jp_gQLIuaqNau9OXQNFOeMhVjFnE5zuptTw3l7JUEaWAISZ_PMjLueu2V7_pp-MGg-P_Og";
}
