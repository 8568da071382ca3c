//! Compact JWS tokens: the parts shared by the `jwt` (HS256) and
//! `cloudflareAccess` (RS256) policies — splitting, strict base64url, the JOSE
//! header rules and the registered-claim checks (`exp`, `nbf`, `iss`, `aud`).
//!
//! This module never verifies a signature and never chooses a key; each policy
//! does that with its own configured key, so the claim checks here must only run
//! on a token whose signature the caller has already verified.
//!
//! Rules enforced for every token:
//! - At most [`MAX_TOKEN_BYTES`], three dot-separated base64url parts, no padding,
//!   no `+` `/` alphabet, no non-canonical trailing bits.
//! - The header is a JSON object; duplicate `alg`, `kid`, `typ` or `crit` members
//!   are refused (a duplicated `alg` could be read two ways).
//! - `crit` present in any form, even `null`, is refused: we implement no
//!   extensions, and RFC 7515 §4.1.11 requires refusing what we do not understand.
//! - `typ`, if present, is `JWT` or `application/jwt` in any case: a token of
//!   another type (`JOSE`, `at+jwt`) is refused.
//! - `jku`, `x5u`, `jwk`, `x5c` are ignored, never followed: the verifying key
//!   always comes from configuration, so a key named or embedded in the token can
//!   neither be fetched nor change which key verifies it. Refusing them instead
//!   would add nothing and would break issuers that include them.
//! - `exp` is required; `exp` and `nbf` are NumericDates (JSON numbers of seconds,
//!   fractions allowed) checked with the leeway; `iss` must equal the configured
//!   issuer and `aud` (a string or an array of strings) must contain the configured
//!   audience, each only when configured.

use std::borrow::Cow;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::DecodeSliceError;
use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::denied::Denied;
use crate::http::trim;

/// Longest token accepted, in bytes, before any decoding.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Longest decoded signature: a 4096-bit RSA signature, the largest key the
/// `cloudflareAccess` policy loads.
pub const MAX_SIGNATURE_BYTES: usize = 512;

/// Room for any decoded header or claims part of a token within the size limit.
const MAX_DECODED_BYTES: usize = MAX_TOKEN_BYTES / 4 * 3 + 3;

/// A token split into its three base64url parts, not yet decoded. Deliberately
/// not `Debug`, so a stray `{:?}` cannot put a token in a log.
#[derive(Clone, Copy)]
pub struct Compact<'a> {
    /// `header.claims`, the bytes the signature covers.
    pub signing_input: &'a [u8],
    header: &'a [u8],
    claims: &'a [u8],
    signature: &'a [u8],
}

/// The header members the policies act on, after the shared header rules passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The `alg` member, empty when absent; each policy compares it exactly.
    pub alg: String,
    pub kid: Option<String>,
}

/// What the registered claims must satisfy.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRules<'a> {
    /// `iss` must equal this, when set.
    pub issuer: Option<&'a str>,
    /// `aud` must be or contain this, when set.
    pub audience: Option<&'a str>,
    /// Clock skew forgiven on `exp` and `nbf`.
    pub leeway_ms: u64,
}

/// Splits a token into three parts. Surrounding spaces and tabs are dropped;
/// The checks every verifier starts with: split `token`, require the header's
/// `alg` to be exactly `alg`, and decode the signature into `buf`.
pub fn open<'t, 'b>(
    token: &'t [u8],
    alg: &str,
    buf: &'b mut [u8; MAX_SIGNATURE_BYTES],
) -> Result<(Compact<'t>, Header, &'b [u8]), Denied> {
    let compact = split(token)?;
    let header = compact.header()?;
    if header.alg != alg {
        return Err(Denied::TOKEN_ALG_REFUSED);
    }
    let signature = compact.signature(buf)?;
    Ok((compact, header, signature))
}

/// anything else in the way is the caller's problem and fails decoding.
pub fn split(token: &[u8]) -> Result<Compact<'_>, Denied> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Denied::TOKEN_TOO_LARGE);
    }
    let token = trim(token);
    let mut dots = token.iter().enumerate().filter(|(_, &b)| b == b'.').map(|(i, _)| i);
    let (Some(first), Some(second), None) = (dots.next(), dots.next(), dots.next()) else {
        return Err(Denied::TOKEN_MALFORMED);
    };
    Ok(Compact {
        signing_input: &token[..second],
        header: &token[..first],
        claims: &token[first + 1..second],
        signature: &token[second + 1..],
    })
}

impl<'a> Compact<'a> {
    /// Decodes the header and applies the shared header rules.
    pub fn header(&self) -> Result<Header, Denied> {
        let mut buf = [0u8; MAX_DECODED_BYTES];
        let json = decode(self.header, &mut buf)?;
        let raw: RawHeader = parse_object(json).ok_or(Denied::TOKEN_HEADER_INVALID)?;
        if raw.crit.is_some() {
            return Err(Denied::TOKEN_CRIT_REFUSED);
        }
        if let Some(typ) = raw.typ {
            // A media type may come whole: `application/jwt` is `JWT` (RFC 7515 §4.1.9).
            const MEDIA: &[u8] = b"application/";
            let typ = typ.as_bytes();
            let subtype = match typ.get(..MEDIA.len()) {
                Some(prefix) if prefix.eq_ignore_ascii_case(MEDIA) => &typ[MEDIA.len()..],
                _ => typ,
            };
            if !subtype.eq_ignore_ascii_case(b"JWT") {
                return Err(Denied::TOKEN_TYP_REFUSED);
            }
        }
        Ok(Header { alg: raw.alg.unwrap_or_default(), kid: raw.kid })
    }

    /// Decodes the signature into `buf`. Too long for `buf` means no configured
    /// key could have made it.
    pub fn signature<'b>(&self, buf: &'b mut [u8; MAX_SIGNATURE_BYTES]) -> Result<&'b [u8], Denied> {
        match URL_SAFE_NO_PAD.decode_slice(self.signature, buf) {
            Ok(n) => Ok(&buf[..n]),
            Err(DecodeSliceError::OutputSliceTooSmall) => Err(Denied::TOKEN_SIGNATURE_INVALID),
            Err(DecodeSliceError::DecodeError(_)) => Err(Denied::TOKEN_MALFORMED),
        }
    }

    /// Decodes the claims and checks them against `rules` at `now_epoch_ms`.
    /// Call only after the signature verified.
    pub fn check_claims(&self, rules: &ClaimRules<'_>, now_epoch_ms: u64) -> Result<(), Denied> {
        let mut buf = [0u8; MAX_DECODED_BYTES];
        let json = decode(self.claims, &mut buf)?;
        let claims: Claims = parse_object(json).ok_or(Denied::TOKEN_CLAIMS_INVALID)?;
        check_claims(&claims, rules, now_epoch_ms)
    }
}

fn decode<'b>(segment: &[u8], buf: &'b mut [u8]) -> Result<&'b [u8], Denied> {
    // `split` bounds every part by MAX_TOKEN_BYTES, so `buf` is always big enough.
    match URL_SAFE_NO_PAD.decode_slice(segment, buf) {
        Ok(n) => Ok(&buf[..n]),
        Err(_) => Err(Denied::TOKEN_MALFORMED),
    }
}

/// Parses a JSON object into `T`. Derived structs would also accept a JSON array
/// positionally; a JOSE header or claims set is an object, so nothing else passes.
fn parse_object<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Option<T> {
    let start = json.iter().position(|b| !b.is_ascii_whitespace())?;
    if json[start] != b'{' {
        return None;
    }
    serde_json::from_slice(json).ok()
}

#[derive(Deserialize)]
struct RawHeader {
    #[serde(default)]
    alg: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    typ: Option<String>,
    #[serde(default, deserialize_with = "present")]
    crit: Option<IgnoredAny>,
}

/// `Some` for any value, `null` included, so that `"crit": null` counts as present.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IgnoredAny>, D::Error> {
    IgnoredAny::deserialize(d).map(Some)
}

/// `Some` for any value, `null` included: `"nbf": null` is a claim that is
/// not a NumericDate, not an absent one.
fn present_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Claims<'a> {
    #[serde(default)]
    exp: Option<Value>,
    #[serde(default, deserialize_with = "present_value")]
    nbf: Option<Value>,
    #[serde(default, borrow)]
    iss: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    aud: Option<Audience<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Many(#[serde(borrow)] Vec<Cow<'a, str>>),
}

fn check_claims(claims: &Claims<'_>, rules: &ClaimRules<'_>, now_ms: u64) -> Result<(), Denied> {
    let exp = claims.exp.as_ref().ok_or(Denied::TOKEN_EXP_MISSING)?;
    let exp_ms = numeric_date_ms(exp).ok_or(Denied::TOKEN_EXP_INVALID)?;
    // RFC 7519 §4.1.4: not accepted "on or after" exp.
    if now_ms >= exp_ms.saturating_add(rules.leeway_ms) {
        return Err(Denied::TOKEN_EXPIRED);
    }
    if let Some(nbf) = &claims.nbf {
        let nbf_ms = numeric_date_ms(nbf).ok_or(Denied::TOKEN_NBF_INVALID)?;
        if now_ms.saturating_add(rules.leeway_ms) < nbf_ms {
            return Err(Denied::TOKEN_NOT_YET_VALID);
        }
    }
    if let Some(issuer) = rules.issuer {
        if claims.iss.as_deref() != Some(issuer) {
            return Err(Denied::TOKEN_WRONG_ISSUER);
        }
    }
    if let Some(audience) = rules.audience {
        let ok = match &claims.aud {
            Some(Audience::One(a)) => a == audience,
            Some(Audience::Many(list)) => list.iter().any(|a| a == audience),
            None => false,
        };
        if !ok {
            return Err(Denied::TOKEN_WRONG_AUDIENCE);
        }
    }
    Ok(())
}

/// A NumericDate (seconds since the epoch, a non-negative JSON number) in ms.
fn numeric_date_ms(value: &Value) -> Option<u64> {
    if let Some(secs) = value.as_u64() {
        return Some(secs.saturating_mul(1000));
    }
    let secs = value.as_f64()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // Saturates for absurdly large values, which only ever makes exp later.
    Some((secs * 1000.0) as u64)
}

/// Test helpers shared by the `jwt` and `cloudflare` tests.
#[cfg(test)]
pub(crate) mod testing {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;

    pub fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// `b64(header).b64(claims)`, the signing input of a token.
    pub fn signing_input(header: &str, claims: &str) -> String {
        format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    const NOW: u64 = 1_710_000_000_000;

    fn token(header: &str, claims: &str) -> String {
        format!("{}.{}", signing_input(header, claims), b64(b"sig"))
    }

    fn rules() -> ClaimRules<'static> {
        ClaimRules { issuer: Some("https://issuer.example"), audience: Some("nthpool"), leeway_ms: 30_000 }
    }

    fn claims_result(claims: &str) -> Result<(), Denied> {
        let t = token(r#"{"alg":"HS256"}"#, claims);
        split(t.as_bytes())?.check_claims(&rules(), NOW)
    }

    fn header_result(header: &str) -> Result<Header, Denied> {
        let t = token(header, "{}");
        split(t.as_bytes())?.header()
    }

    const ISS_AUD: &str = r#""iss":"https://issuer.example","aud":"nthpool""#;

    #[test]
    fn split_needs_three_parts() {
        assert_eq!(split(b"a.b").err(), Some(Denied::TOKEN_MALFORMED));
        assert_eq!(split(b"a.b.c.d").err(), Some(Denied::TOKEN_MALFORMED));
        assert_eq!(split(b"").err(), Some(Denied::TOKEN_MALFORMED));
        let c = split(b" a.b.c\t").unwrap();
        assert_eq!(c.signing_input, b"a.b");
    }

    #[test]
    fn oversize_is_refused_before_parsing() {
        let big = vec![b'a'; MAX_TOKEN_BYTES + 1];
        assert_eq!(split(&big).err(), Some(Denied::TOKEN_TOO_LARGE));
        let limit = format!("larger than {} KiB.", MAX_TOKEN_BYTES / 1024);
        assert!(Denied::TOKEN_TOO_LARGE.reason().ends_with(&limit), "the refusal names the limit");
    }

    #[test]
    fn header_rules() {
        let h = header_result(r#"{"alg":"HS256","typ":"jwt","kid":"k1"}"#).unwrap();
        assert_eq!(h.alg, "HS256");
        assert_eq!(h.kid.as_deref(), Some("k1"));
        assert_eq!(header_result(r#"{"typ":"JWT"}"#).unwrap().alg, "");
        assert_eq!(header_result(r#"{"alg":"HS256","typ":"JOSE"}"#), Err(Denied::TOKEN_TYP_REFUSED));
        assert_eq!(header_result(r#"{"alg":"HS256","typ":"Application/JWT"}"#).unwrap().alg, "HS256");
        for other in
            ["application/at+jwt", "at+jwt", "application/", "xapplication/jwt", "application/jwtx", "jwt ", "é/jwt"]
        {
            let header = format!(r#"{{"alg":"HS256","typ":"{other}"}}"#);
            assert_eq!(header_result(&header), Err(Denied::TOKEN_TYP_REFUSED), "{other}");
        }
        for crit in [r#"["exp"]"#, "[]", "null"] {
            let h = format!(r#"{{"alg":"HS256","crit":{crit}}}"#);
            assert_eq!(header_result(&h), Err(Denied::TOKEN_CRIT_REFUSED), "{crit}");
        }
        for bad in [r#"["HS256"]"#, r#"{"alg":"HS256","alg":"none"}"#, r#"{"alg":1}"#, "", "{"] {
            assert_eq!(header_result(bad), Err(Denied::TOKEN_HEADER_INVALID), "{bad}");
        }
        // Key-locating members are accepted and ignored.
        let h = header_result(r#"{"alg":"HS256","jku":"https://evil.example/k","jwk":{"kty":"oct"}}"#);
        assert_eq!(h.unwrap().alg, "HS256");
    }

    #[test]
    fn strict_base64url() {
        let good = b64(br#"{"alg":"HS256"}"#);
        assert!(split(format!("{good}.e30.c2ln").as_bytes()).unwrap().header().is_ok());
        // Padding, standard alphabet, invalid characters and non-canonical endings.
        for bad in [format!("{good}="), good.replace('J', "+"), format!("{good}*"), format!("{good}A"), "e31".into()] {
            let t = format!("{bad}.e30.c2ln");
            assert_eq!(split(t.as_bytes()).unwrap().header(), Err(Denied::TOKEN_MALFORMED), "{bad}");
        }
        let mut buf = [0u8; MAX_SIGNATURE_BYTES];
        let t = format!("{good}.e30.c2ln==");
        assert_eq!(split(t.as_bytes()).unwrap().signature(&mut buf), Err(Denied::TOKEN_MALFORMED));
        let t = format!("{good}.e30.{}", b64(&[7u8; MAX_SIGNATURE_BYTES + 1]));
        assert_eq!(split(t.as_bytes()).unwrap().signature(&mut buf), Err(Denied::TOKEN_SIGNATURE_INVALID));
    }

    #[test]
    fn claims_pass() {
        let exp = NOW / 1000 + 60;
        assert_eq!(claims_result(&format!(r#"{{"exp":{exp},{ISS_AUD}}}"#)), Ok(()));
        assert_eq!(claims_result(&format!(r#"{{"exp":{exp}.5,{ISS_AUD}}}"#)), Ok(()));
    }

    #[test]
    fn exp_rules() {
        let secs = NOW / 1000;
        assert_eq!(claims_result(&format!(r#"{{{ISS_AUD}}}"#)), Err(Denied::TOKEN_EXP_MISSING));
        assert_eq!(claims_result(&format!(r#"{{"exp":null,{ISS_AUD}}}"#)), Err(Denied::TOKEN_EXP_MISSING));
        for bad in [format!(r#""{}""#, secs + 60), "-1".into(), "true".into()] {
            let c = format!(r#"{{"exp":{bad},{ISS_AUD}}}"#);
            assert_eq!(claims_result(&c), Err(Denied::TOKEN_EXP_INVALID), "{bad}");
        }
        // Leeway of 30 s: 29 s past exp passes, 30 s past fails.
        assert_eq!(claims_result(&format!(r#"{{"exp":{},{ISS_AUD}}}"#, secs - 29)), Ok(()));
        assert_eq!(claims_result(&format!(r#"{{"exp":{},{ISS_AUD}}}"#, secs - 30)), Err(Denied::TOKEN_EXPIRED));
    }

    #[test]
    fn nbf_rules() {
        let secs = NOW / 1000;
        let c = |nbf: String| format!(r#"{{"exp":{},"nbf":{nbf},{ISS_AUD}}}"#, secs + 600);
        assert_eq!(claims_result(&c((secs + 30).to_string())), Ok(()));
        assert_eq!(claims_result(&c((secs + 31).to_string())), Err(Denied::TOKEN_NOT_YET_VALID));
        assert_eq!(claims_result(&c(r#""soon""#.into())), Err(Denied::TOKEN_NBF_INVALID));
        assert_eq!(claims_result(&c("null".into())), Err(Denied::TOKEN_NBF_INVALID));
    }

    #[test]
    fn iss_and_aud_rules() {
        let exp = NOW / 1000 + 60;
        let c = |rest: &str| claims_result(&format!(r#"{{"exp":{exp}{rest}}}"#));
        assert_eq!(c(r#","aud":"nthpool""#), Err(Denied::TOKEN_WRONG_ISSUER));
        assert_eq!(c(r#","iss":"https://other.example","aud":"nthpool""#), Err(Denied::TOKEN_WRONG_ISSUER));
        assert_eq!(c(r#","iss":"https://issuer.example""#), Err(Denied::TOKEN_WRONG_AUDIENCE));
        assert_eq!(c(r#","iss":"https://issuer.example","aud":"other""#), Err(Denied::TOKEN_WRONG_AUDIENCE));
        assert_eq!(c(r#","iss":"https://issuer.example","aud":["a","nthpool"]"#), Ok(()));
        assert_eq!(c(r#","iss":"https://issuer.example","aud":["a","b"]"#), Err(Denied::TOKEN_WRONG_AUDIENCE));
        assert_eq!(c(r#","iss":"https://issuer.example","aud":[]"#), Err(Denied::TOKEN_WRONG_AUDIENCE));
        assert_eq!(c(r#","iss":"https://issuer.example","aud":[1]"#), Err(Denied::TOKEN_CLAIMS_INVALID));
        assert_eq!(c(r#","iss":7,"aud":"nthpool""#), Err(Denied::TOKEN_CLAIMS_INVALID));
    }

    #[test]
    fn unconfigured_iss_and_aud_are_not_checked() {
        let t = token(r#"{"alg":"HS256"}"#, &format!(r#"{{"exp":{},"aud":"x"}}"#, NOW / 1000 + 60));
        let open = ClaimRules { issuer: None, audience: None, leeway_ms: 0 };
        assert_eq!(split(t.as_bytes()).unwrap().check_claims(&open, NOW), Ok(()));
    }

    #[test]
    fn claims_must_be_an_object() {
        assert_eq!(claims_result("[1]"), Err(Denied::TOKEN_CLAIMS_INVALID));
        assert_eq!(claims_result("not json"), Err(Denied::TOKEN_CLAIMS_INVALID));
    }
}
