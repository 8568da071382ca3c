//! The `jwt` access policy (SPEC §8): an HS256 compact JWS signed with the pool's
//! shared secret.
//!
//! `alg` must be exactly `HS256`. Everything else is refused before the signature
//! is looked at: `none` in any spelling (an unsigned token), other HMAC sizes, and
//! asymmetric algorithms such as `RS256`, whose "public key" an attacker might hope
//! we would use as an HMAC secret. The MAC is compared in constant time. Header
//! and claim rules shared with `cloudflareAccess` live in `jws`.

use ::hmac::{Hmac, Mac};
use sha2::Sha256;

use super::denied::Denied;
use super::jws::{self, ClaimRules, MAX_SIGNATURE_BYTES};

/// The only algorithm this policy accepts, compared byte for byte.
const ALG: &str = "HS256";

/// One pool's `jwt` configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtPolicy {
    /// The `hs256Secret`, as bytes.
    pub secret: Vec<u8>,
    /// When set, `iss` must equal it.
    pub issuer: Option<String>,
    /// When set, `aud` must be or contain it.
    pub audience: Option<String>,
    /// Clock skew forgiven on `exp` and `nbf`.
    pub leeway_ms: u64,
}

impl JwtPolicy {
    /// Accepts `token` (the bare compact JWS, without `Bearer `) if it is a valid
    /// HS256 token under this policy at `now_epoch_ms`.
    pub fn verify(&self, token: &[u8], now_epoch_ms: u64) -> Result<(), Denied> {
        let mut buf = [0u8; MAX_SIGNATURE_BYTES];
        let (compact, _, signature) = jws::open(token, ALG, &mut buf)?;
        // HMAC takes keys of any length, so this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC accepts any key length");
        mac.update(compact.signing_input);
        mac.verify_slice(signature).map_err(|_| Denied::TOKEN_SIGNATURE_INVALID)?;
        let rules = ClaimRules {
            issuer: self.issuer.as_deref(),
            audience: self.audience.as_deref(),
            leeway_ms: self.leeway_ms,
        };
        compact.check_claims(&rules, now_epoch_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::jws::testing::{b64, signing_input};
    use super::super::jws::MAX_TOKEN_BYTES;
    use super::*;

    const SECRET: &[u8] = b"a-32-byte-shared-secret-for-jwt!";
    const NOW: u64 = 1_710_000_000_000;
    const NOW_S: u64 = NOW / 1000;

    fn policy() -> JwtPolicy {
        JwtPolicy {
            secret: SECRET.to_vec(),
            issuer: Some("https://issuer.example".into()),
            audience: Some("nthpool".into()),
            leeway_ms: 30_000,
        }
    }

    fn hs256(secret: &[u8], input: &str) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(input.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    fn sign_with(secret: &[u8], header: &str, claims: &str) -> String {
        let input = signing_input(header, claims);
        let sig = b64(&hs256(secret, &input));
        format!("{input}.{sig}")
    }

    fn sign(header: &str, claims: &str) -> String {
        sign_with(SECRET, header, claims)
    }

    fn claims_exp(exp: u64) -> String {
        format!(r#"{{"iss":"https://issuer.example","aud":"nthpool","exp":{exp},"sub":"c1"}}"#)
    }

    fn good_claims() -> String {
        claims_exp(NOW_S + 300)
    }

    const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

    fn check(token: &str) -> Result<(), Denied> {
        policy().verify(token.as_bytes(), NOW)
    }

    #[test]
    fn accepts_a_good_token() {
        assert_eq!(check(&sign(HEADER, &good_claims())), Ok(()));
        assert_eq!(check(&sign(r#"{"alg":"HS256"}"#, &good_claims())), Ok(()));
    }

    #[test]
    fn bad_signature() {
        assert_eq!(check(&sign_with(b"another-secret", HEADER, &good_claims())), Err(Denied::TOKEN_SIGNATURE_INVALID));
        let mut t = sign(HEADER, &good_claims());
        let flip = if t.ends_with('A') { "Q" } else { "A" };
        t.replace_range(t.len() - 1.., flip);
        assert_eq!(check(&t), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn tampered_claims() {
        let t = sign(HEADER, &good_claims());
        let forged = claims_exp(NOW_S + 999_999);
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged_b64 = b64(forged.as_bytes());
        parts[1] = &forged_b64;
        assert_eq!(check(&parts.join(".")), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn expired() {
        assert_eq!(check(&sign(HEADER, &claims_exp(NOW_S - 31))), Err(Denied::TOKEN_EXPIRED));
        // Inside the leeway.
        assert_eq!(check(&sign(HEADER, &claims_exp(NOW_S - 29))), Ok(()));
    }

    #[test]
    fn exp_missing() {
        let c = r#"{"iss":"https://issuer.example","aud":"nthpool"}"#;
        assert_eq!(check(&sign(HEADER, c)), Err(Denied::TOKEN_EXP_MISSING));
    }

    #[test]
    fn not_yet_valid() {
        let c =
            format!(r#"{{"iss":"https://issuer.example","aud":"nthpool","exp":{},"nbf":{}}}"#, NOW_S + 600, NOW_S + 60);
        assert_eq!(check(&sign(HEADER, &c)), Err(Denied::TOKEN_NOT_YET_VALID));
    }

    #[test]
    fn unsigned_tokens() {
        for alg in ["none", "None", "NONE", "nOnE"] {
            let header = format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#);
            let input = signing_input(&header, &good_claims());
            assert_eq!(check(&format!("{input}.")), Err(Denied::TOKEN_ALG_REFUSED), "{alg}");
            // Even carrying a valid HS256 MAC, the header decides.
            assert_eq!(check(&sign(&header, &good_claims())), Err(Denied::TOKEN_ALG_REFUSED), "{alg}");
        }
        let input = signing_input(r#"{"typ":"JWT"}"#, &good_claims());
        assert_eq!(check(&format!("{input}.")), Err(Denied::TOKEN_ALG_REFUSED));
    }

    #[test]
    fn alg_swapped() {
        for alg in ["HS384", "HS512", "RS256", "ES256", "PS256", "hs256", "HS256 ", ""] {
            let header = format!(r#"{{"alg":"{alg}"}}"#);
            assert_eq!(check(&sign(&header, &good_claims())), Err(Denied::TOKEN_ALG_REFUSED), "{alg:?}");
        }
    }

    #[test]
    fn wrong_issuer() {
        let c = format!(r#"{{"iss":"https://evil.example","aud":"nthpool","exp":{}}}"#, NOW_S + 60);
        assert_eq!(check(&sign(HEADER, &c)), Err(Denied::TOKEN_WRONG_ISSUER));
    }

    #[test]
    fn wrong_audience() {
        let c = format!(r#"{{"iss":"https://issuer.example","aud":"other","exp":{}}}"#, NOW_S + 60);
        assert_eq!(check(&sign(HEADER, &c)), Err(Denied::TOKEN_WRONG_AUDIENCE));
    }

    #[test]
    fn audience_array() {
        let c = |aud: &str| format!(r#"{{"iss":"https://issuer.example","aud":{aud},"exp":{}}}"#, NOW_S + 60);
        assert_eq!(check(&sign(HEADER, &c(r#"["x","nthpool"]"#))), Ok(()));
        assert_eq!(check(&sign(HEADER, &c(r#"["x","y"]"#))), Err(Denied::TOKEN_WRONG_AUDIENCE));
    }

    #[test]
    fn unconfigured_issuer_and_audience() {
        let open = JwtPolicy { issuer: None, audience: None, ..policy() };
        let t = sign(HEADER, &format!(r#"{{"exp":{}}}"#, NOW_S + 60));
        assert_eq!(open.verify(t.as_bytes(), NOW), Ok(()));
    }

    #[test]
    fn crit_header() {
        let h = r#"{"alg":"HS256","crit":["b64"],"b64":false}"#;
        assert_eq!(check(&sign(h, &good_claims())), Err(Denied::TOKEN_CRIT_REFUSED));
    }

    #[test]
    fn key_urls_are_not_followed() {
        let h = r#"{"alg":"HS256","jku":"https://evil.example/jwks","x5u":"https://evil.example/c"}"#;
        assert_eq!(check(&sign(h, &good_claims())), Ok(()));
        assert_eq!(check(&sign_with(b"attacker", h, &good_claims())), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn typ() {
        assert_eq!(check(&sign(r#"{"alg":"HS256","typ":"jwt"}"#, &good_claims())), Ok(()));
        assert_eq!(check(&sign(r#"{"alg":"HS256","typ":"at+jwt"}"#, &good_claims())), Err(Denied::TOKEN_TYP_REFUSED));
    }

    #[test]
    fn oversize() {
        let pad = "x".repeat(MAX_TOKEN_BYTES);
        let c = format!(r#"{{"iss":"https://issuer.example","aud":"nthpool","exp":{},"pad":"{pad}"}}"#, NOW_S + 60);
        assert_eq!(check(&sign(HEADER, &c)), Err(Denied::TOKEN_TOO_LARGE));
    }

    #[test]
    fn bad_base64() {
        let t = sign(HEADER, &good_claims());
        let parts: Vec<&str> = t.split('.').collect();
        // `+` and `/` belong to the standard alphabet, not base64url.
        for c in ["+", "/"] {
            let t2 = format!("{c}{}.{}.{}", &parts[0][1..], parts[1], parts[2]);
            assert_eq!(check(&t2), Err(Denied::TOKEN_MALFORMED));
        }
        assert_eq!(check(&format!("{}.{}.{}!", parts[0], parts[1], parts[2])), Err(Denied::TOKEN_MALFORMED));
        // Bad claims under a valid MAC: caught when the claims are decoded.
        let input = format!("{}.{}!", parts[0], parts[1]);
        let t2 = format!("{input}.{}", b64(&hs256(SECRET, &input)));
        assert_eq!(check(&t2), Err(Denied::TOKEN_MALFORMED));
        assert_eq!(check("a.b"), Err(Denied::TOKEN_MALFORMED));
        assert_eq!(check(&format!("{t}.x")), Err(Denied::TOKEN_MALFORMED));
    }

    #[test]
    fn padding() {
        // A 32-byte MAC is 43 base64url characters; the padded form adds one `=`.
        let t = sign(HEADER, &good_claims());
        assert_eq!(check(&format!("{t}=")), Err(Denied::TOKEN_MALFORMED));
        // Padding on the claims part too (and the MAC over it recomputed).
        let mut claims = good_claims();
        while claims.len().is_multiple_of(3) {
            claims.push(' ');
        }
        let header_b64 = b64(HEADER.as_bytes());
        let mut claims_b64 = b64(claims.as_bytes());
        while !claims_b64.len().is_multiple_of(4) {
            claims_b64.push('=');
        }
        assert!(claims_b64.ends_with('='));
        let input = format!("{header_b64}.{claims_b64}");
        let padded = format!("{input}.{}", b64(&hs256(SECRET, &input)));
        assert_eq!(check(&padded), Err(Denied::TOKEN_MALFORMED));
    }

    #[test]
    fn reasons_do_not_echo_the_token() {
        let t = sign(HEADER, &claims_exp(NOW_S - 100));
        let err = check(&t).unwrap_err();
        assert!(!err.reason().contains(&t[..10]));
    }
}
