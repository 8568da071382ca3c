//! Pool keys: who may use a pool at all. Every configured access policy
//! comes on top of this; the key is always required.

use std::collections::HashSet;

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

/// What a waiting acquire keeps of the key it presented: enough to tell,
/// after a reload, whether that key still opens the pool, and not the key.
/// An FNV-1a hash of the key to find it among plain keys, and the first
/// bytes of its SHA-256 among `keySha256` entries (a key may move from one
/// list to the other). A key can only have got here by matching one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyPrint {
    plain: u64,
    digest: u64,
}

impl KeyPrint {
    fn of(key: &[u8]) -> KeyPrint {
        let digest = digest_prefix(&Sha256::digest(key).into());
        KeyPrint { plain: crate::governor::fnv1a(crate::governor::FNV_OFFSET, key), digest }
    }
}

fn digest_prefix(digest: &[u8; 32]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
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

    /// The print of the key `head` presents (one `check` accepted). Taken
    /// only for an acquire that waits: its SHA-256 is not for every request.
    pub fn print(&self, head: &Head) -> KeyPrint {
        KeyPrint::of(self.presented(head).unwrap_or_default())
    }

    /// The same for a proxied request (one `check_proxied` accepted), whose
    /// key may have come in `x-api-key`.
    pub fn print_proxied(&self, head: &Head) -> KeyPrint {
        KeyPrint::of(self.presented_proxied(head).unwrap_or_default())
    }

    /// Whether the key `print` was taken of is still one of these keys.
    pub fn still_opens(&self, print: KeyPrint) -> bool {
        let fnv = |k: &[u8]| crate::governor::fnv1a(crate::governor::FNV_OFFSET, k);
        self.plain.iter().any(|k| fnv(k) == print.plain) || self.hashed.iter().any(|h| digest_prefix(h) == print.digest)
    }

    /// Proxy mode: the key may also come in `x-api-key` (what SDKs send) when
    /// `allowAuthorizationHeader` is on. Read there, it is a one-value
    /// credential header: sent twice, which copy counts would be a guess.
    pub fn check_proxied(&self, head: &Head) -> Result<(), ApiError> {
        let missing = if self.allow_authorization_header { MISSING_PROXIED } else { MISSING };
        let key = self.presented_proxied(head).map_err(|e| e.unwrap_or(missing))?;
        self.check_key(key).map_err(|_| missing)
    }

    /// The key a proxied request presents; `Err(None)` when it presents
    /// none, `Err(Some(_))` when its `x-api-key` comes twice.
    fn presented_proxied<'h>(&self, head: &Head<'h>) -> Result<&'h [u8], Option<ApiError>> {
        if let Some(key) = self.presented(head) {
            return Ok(key);
        }
        if !self.allow_authorization_header {
            return Err(None);
        }
        let mut copies = head.headers.into_iter().filter(|h| h.name.eq_ignore_ascii_case(b"x-api-key"));
        let first = copies.next().ok_or(None)?;
        if copies.next().is_some() {
            return Err(Some(API_KEY_TWICE));
        }
        Ok(trim(first.value))
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

/// Every pool's keys, so that text a client sent where a pool's name goes
/// can be told to be a key (and kept out of the access log, SPEC §9) with a
/// look-up or two, however many keys there are: the plain keys as they are,
/// the `keySha256` entries by digest (the text is hashed only when there are
/// some).
#[derive(Default)]
pub struct KnownKeys {
    plain: HashSet<Box<[u8]>>,
    hashed: HashSet<[u8; 32]>,
}

impl KnownKeys {
    pub fn of<'k>(pools: impl Iterator<Item = &'k PoolKeys>) -> KnownKeys {
        let mut known = KnownKeys::default();
        for keys in pools {
            known.plain.extend(keys.plain.iter().cloned());
            known.hashed.extend(keys.hashed.iter().copied());
        }
        known
    }

    /// Whether `text` is a key of some pool.
    pub fn holds(&self, text: &[u8]) -> bool {
        self.plain.contains(text)
            || !self.hashed.is_empty() && self.hashed.contains(&<[u8; 32]>::from(Sha256::digest(text)))
    }
}
