//! Pool keys: who may use a pool at all. Every configured access policy
//! comes on top of this; the key is always required.

use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::config::{parse_sha256_hex, PoolConfig};
use crate::ct::secret_eq;
use crate::http::request::Head;
use crate::http::{credentials, trim};

pub struct PoolKeys {
    plain: Vec<Box<[u8]>>,
    hashed: Vec<[u8; 32]>,
    allow_authorization_header: bool,
}

const MISSING: ApiError = ApiError::Unauthorized("A valid pool key is required (X-Nthpool-Key).");

impl PoolKeys {
    pub fn new(config: &PoolConfig) -> PoolKeys {
        PoolKeys {
            plain: config.keys.iter().map(|k| k.as_bytes().into()).collect(),
            hashed: config.key_sha256.iter().map(|h| parse_sha256_hex(h).expect("validated")).collect(),
            allow_authorization_header: config.allow_authorization_header,
        }
    }

    /// The key the request presents: `X-Nthpool-Key`, else (when allowed)
    /// `Authorization: Bearer|Nthbouncer <key>`.
    pub fn presented<'h>(&self, head: &Head<'h>) -> Option<&'h [u8]> {
        // Field values come without the white space around them (httparse
        // strips it), so the key is taken as it is.
        if let Some(key) = head.api.key() {
            debug_assert_eq!(key, trim(key));
            return Some(key);
        }
        if !self.allow_authorization_header {
            return None;
        }
        let value = head.api.authorization()?;
        credentials(value, "bearer").or_else(|| credentials(value, "nthbouncer"))
    }

    pub fn check(&self, head: &Head) -> Result<(), ApiError> {
        self.check_key(self.presented(head).ok_or(MISSING)?)
    }

    /// Proxy mode: the key may also come in `x-api-key` (what SDKs send) when
    /// `allowAuthorizationHeader` is on.
    pub fn check_proxied(&self, head: &Head) -> Result<(), ApiError> {
        let key = self
            .presented(head)
            .or_else(|| self.allow_authorization_header.then(|| head.header("x-api-key").map(trim)).flatten());
        self.check_key(key.ok_or(MISSING)?)
    }

    /// Whether `Authorization` and `x-api-key` may carry the key.
    pub fn reads_authorization(&self) -> bool {
        self.allow_authorization_header
    }

    fn check_key(&self, key: &[u8]) -> Result<(), ApiError> {
        // Every configured key is compared, so timing does not tell which matched.
        let mut ok = false;
        for k in &self.plain {
            ok |= secret_eq(k, key);
        }
        if !self.hashed.is_empty() {
            let digest: [u8; 32] = Sha256::digest(key).into();
            for h in &self.hashed {
                ok |= secret_eq(h, &digest);
            }
        }
        if ok {
            Ok(())
        } else {
            Err(MISSING)
        }
    }
}
