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
/// Proxy mode with `allowAuthorizationHeader`: where an SDK puts its key is
/// named too. (The lock API keeps one message for every pool, so a 401 does
/// not tell which pools exist; a proxy's pool is known from its address.)
const MISSING_PROXIED: ApiError =
    ApiError::Unauthorized("A valid pool key is required (X-Nthpool-Key, Authorization: Bearer, or x-api-key).");
const API_KEY_TWICE: ApiError = ApiError::BadRequest("x-api-key is sent twice; send it once.");

impl PoolKeys {
    pub fn new(config: &PoolConfig) -> PoolKeys {
        PoolKeys {
            plain: config.keys.iter().map(|k| k.as_bytes().into()).collect(),
            hashed: config.key_sha256.iter().map(|h| parse_sha256_hex(h).expect("validated")).collect(),
            allow_authorization_header: config.allow_authorization_header,
        }
    }

    /// Keys of a pool no configuration names: none matches.
    pub fn none() -> PoolKeys {
        PoolKeys { plain: Vec::new(), hashed: Vec::new(), allow_authorization_header: false }
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
    /// `allowAuthorizationHeader` is on. Read there, it is a one-value
    /// credential header: sent twice, which copy counts would be a guess.
    pub fn check_proxied(&self, head: &Head) -> Result<(), ApiError> {
        let missing = if self.allow_authorization_header { MISSING_PROXIED } else { MISSING };
        let key = match self.presented(head) {
            Some(key) => key,
            None if self.allow_authorization_header => {
                let mut copies = head.headers.into_iter().filter(|h| h.name.eq_ignore_ascii_case(b"x-api-key"));
                let first = copies.next().ok_or(missing)?;
                if copies.next().is_some() {
                    return Err(API_KEY_TWICE);
                }
                trim(first.value)
            }
            None => return Err(missing),
        };
        self.check_key(key).map_err(|_| missing)
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
