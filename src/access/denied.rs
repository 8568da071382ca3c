//! Why an access policy refused a request.
//!
//! Every policy failure is the same answer on the wire (`401 unauthorized`), so
//! [`Denied`] is one type carrying a fixed, one-sentence reason that the HTTP layer
//! puts in the response body's `message`. All reasons live here, as constants, so
//! a reviewer can check in one place that none of them can ever echo a token, a
//! key, a nonce or a signature back to the caller: the reason is `&'static str`
//! and there is no way to build one from request data.

use std::fmt;

/// A refused credential, with a human reason safe to show the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    reason: &'static str,
}

impl Denied {
    const fn new(reason: &'static str) -> Denied {
        Denied { reason }
    }

    /// The sentence for the 401 body's `message`.
    pub const fn reason(self) -> &'static str {
        self.reason
    }

    // Request signing (SPEC §8 `hmac`).
    pub const TIMESTAMP_MISSING: Denied = Denied::new("The X-Nthpool-Timestamp header is missing.");
    pub const TIMESTAMP_MALFORMED: Denied =
        Denied::new("X-Nthpool-Timestamp must be epoch milliseconds in ASCII digits.");
    pub const TIMESTAMP_STALE: Denied = Denied::new("The request timestamp is older than the allowed tolerance.");
    /// Signed before the policy's nonce store began (a start, or a reload
    /// that added or widened the policy): its nonce may have been spent where
    /// this store cannot see it.
    pub const SIGNED_BEFORE_START: Denied = Denied::new(
        "The request was signed before this server began remembering nonces (it started or reloaded since); sign it again.",
    );
    pub const TIMESTAMP_FUTURE: Denied =
        Denied::new("The request timestamp is further in the future than the allowed tolerance.");
    pub const NONCE_MISSING: Denied = Denied::new("The X-Nthpool-Nonce header is missing.");
    pub const NONCE_MALFORMED: Denied = Denied::new("X-Nthpool-Nonce must be 1 to 128 printable ASCII characters.");
    /// For the caller to use when the nonce store answers `NonceError::Replay`.
    pub const NONCE_REPLAYED: Denied = Denied::new("This nonce was already used inside the tolerance window.");
    pub const SIGNATURE_MISSING: Denied = Denied::new("The X-Nthpool-Signature header is missing.");
    pub const SIGNATURE_MALFORMED: Denied = Denied::new("X-Nthpool-Signature must be v1= followed by 64 hex digits.");
    pub const SIGNATURE_MISMATCH: Denied = Denied::new("The request signature does not match.");

    // Bearer tokens (SPEC §8 `jwt` and `cloudflareAccess`).
    /// The `jwt` policy is configured but no token was sent.
    pub const JWT_MISSING: Denied =
        Denied::new("No JWT was presented: send it in X-Nthpool-Jwt (or Authorization: Bearer beside X-Nthpool-Key).");
    /// The `cloudflareAccess` policy is configured but no token was sent.
    pub const CF_TOKEN_MISSING: Denied =
        Denied::new("No Cloudflare Access token was presented: send it in Cf-Access-Jwt-Assertion.");
    /// `jws::MAX_TOKEN_BYTES`, named in words.
    pub const TOKEN_TOO_LARGE: Denied = Denied::new("The token is larger than 8 KiB.");
    pub const TOKEN_MALFORMED: Denied = Denied::new("The token is not a compact JWS of three base64url parts.");
    pub const TOKEN_HEADER_INVALID: Denied = Denied::new("The token header is not valid JSON.");
    pub const TOKEN_ALG_REFUSED: Denied = Denied::new("The token's signing algorithm is not accepted.");
    pub const TOKEN_CRIT_REFUSED: Denied = Denied::new("Tokens with critical header extensions are not accepted.");
    pub const TOKEN_TYP_REFUSED: Denied = Denied::new("The token's typ must be JWT.");
    pub const TOKEN_KEY_UNKNOWN: Denied = Denied::new("The token names a signing key that is not configured.");
    pub const TOKEN_SIGNATURE_INVALID: Denied = Denied::new("The token signature does not verify.");
    pub const TOKEN_CLAIMS_INVALID: Denied = Denied::new(
        "The token claims are not a JSON object with iss a string, aud a string or a list of strings, and exp and nbf numbers.",
    );
    pub const TOKEN_EXP_MISSING: Denied = Denied::new("The token has no exp claim.");
    pub const TOKEN_EXP_INVALID: Denied = Denied::new("The token's exp claim is not a NumericDate.");
    pub const TOKEN_NBF_INVALID: Denied = Denied::new("The token's nbf claim is not a NumericDate.");
    pub const TOKEN_EXPIRED: Denied = Denied::new("The token has expired.");
    pub const TOKEN_NOT_YET_VALID: Denied = Denied::new("The token is not valid yet.");
    pub const TOKEN_WRONG_ISSUER: Denied = Denied::new("The token was issued by an issuer that is not accepted.");
    pub const TOKEN_WRONG_AUDIENCE: Denied = Denied::new("The token is not meant for this audience.");
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)
    }
}

impl std::error::Error for Denied {}
