//! Access policies beyond the pool key (SPEC §8): IP allowlist behind trusted
//! proxies, HMAC request signing with replay defence, HS256 JWTs, and
//! Cloudflare Access. Each configured policy must pass; a pool without
//! policies pays nothing (`PoolAccess::is_open`).
//!
//! The checks themselves are pure functions in the submodules; this module
//! reads the right headers and holds the per-pool state (the nonce store,
//! the JWKS keys).

pub mod cloudflare;
pub mod denied;
pub mod hmac;
pub mod ip;
pub mod jws;
pub mod jwt;
pub mod nonce;

use std::net::IpAddr;

use log::warn;

use crate::config::AccessConfig;
use crate::files;
use crate::http::request::{Head, Method};
use crate::http::trim;
use crate::time::{Epoch, EpochMs};
use cloudflare::Jwks;
use denied::Denied;
use ip::CidrSet;
use jwt::JwtPolicy;
use nonce::{NonceError, NonceStore};

struct HmacPolicy {
    secret: Vec<u8>,
    tolerance_ms: u64,
    nonces: NonceStore,
    /// Requests signed before this (epoch ms) are refused, since their
    /// nonces may have been spent where this store cannot see them: set
    /// when the store started empty (a start, a pool or policy a reload
    /// adds) and when a reload widened the window.
    not_before_ms: u64,
}

struct CloudflarePolicy {
    /// The file the keys were read from (`jwksFile`), as configured.
    jwks_file: String,
    jwks: Jwks,
    audience: String,
    issuer: String,
}

/// Clock skew forgiven on Cloudflare Access tokens.
const CF_LEEWAY_MS: u64 = 30_000;
/// The largest `cloudflareAccess.jwksFile` read (a team's JWKS is a few KiB).
const MAX_JWKS_BYTES: u64 = 1 << 20;

#[derive(Default)]
pub struct PoolAccess {
    ip_allow: Option<CidrSet>,
    trusted_proxies: CidrSet,
    hmac: Option<HmacPolicy>,
    jwt: Option<JwtPolicy>,
    cloudflare: Option<CloudflarePolicy>,
}

/// Why a policy refused a request; `api` turns it into the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// The client address is outside the pool's `ipAllow`, or a trusted
    /// proxy's `X-Forwarded-For` entry did not name one; the sentence says which.
    Forbidden(&'static str),
    /// A signature, token or nonce was refused.
    Denied(Denied),
    /// The nonce store is full of live entries (`capacity` of them): retry
    /// after this many seconds.
    Busy { capacity: u64, retry_after_s: u64 },
    /// A credential header came twice (which copy counts would be a guess).
    Twice(&'static str),
}

fn denied(d: Denied) -> AccessError {
    AccessError::Denied(d)
}

/// The one value of a credential header, if it came; sent twice, it is
/// refused with `twice` (as a one-value control header is).
fn single<'b>(head: &Head<'b>, lower_case_name: &str, twice: &'static str) -> Result<Option<&'b [u8]>, AccessError> {
    let mut values = head.headers.into_iter().filter(|h| h.name.eq_ignore_ascii_case(lower_case_name.as_bytes()));
    let first = values.next().map(|h| h.value);
    match values.next() {
        Some(_) => Err(AccessError::Twice(twice)),
        None => Ok(first),
    }
}

/// The three signing headers (SPEC §8 `hmac`): timestamp, nonce and
/// signature, each `None` when absent.
fn signing_headers<'b>(head: &Head<'b>) -> Result<[Option<&'b [u8]>; 3], AccessError> {
    let timestamp = single(head, "x-nthpool-timestamp", "X-Nthpool-Timestamp is sent twice; send it once.")?;
    let nonce = single(head, "x-nthpool-nonce", "X-Nthpool-Nonce is sent twice; send it once.")?;
    let signature = single(head, "x-nthpool-signature", "X-Nthpool-Signature is sent twice; send it once.")?;
    Ok([timestamp, nonce, signature])
}

impl PoolAccess {
    /// Builds the policies of the pool `name` at `now`. On a reload,
    /// `previous` supplies the JWKS keys that worked when the same file is
    /// now broken (a rotation caught half-written); a file newly named must
    /// be readable, as at start-up;
    /// `carry_state_from` then moves the nonce store over once the whole
    /// reload has succeeded. A new nonce store refuses requests signed
    /// before `now`: it never saw their nonces.
    pub fn build(
        name: &str,
        config: &AccessConfig,
        previous: Option<&PoolAccess>,
        now: EpochMs,
    ) -> Result<PoolAccess, String> {
        let ip_allow = if config.ip_allow.is_empty() {
            None
        } else {
            Some(CidrSet::parse(&config.ip_allow).map_err(|e| format!("access.ipAllow: {e}"))?)
        };
        let trusted_proxies =
            CidrSet::parse(&config.trusted_proxies).map_err(|e| format!("access.trustedProxies: {e}"))?;
        let hmac = config.hmac.as_ref().map(|h| HmacPolicy {
            secret: h.secret.as_bytes().to_vec(),
            tolerance_ms: h.tolerance_ms,
            nonces: NonceStore::new(h.nonce_capacity),
            not_before_ms: now.0,
        });
        let jwt = config.jwt.as_ref().map(|j| JwtPolicy {
            secret: j.hs256_secret.as_bytes().to_vec(),
            issuer: j.issuer.clone(),
            audience: j.audience.clone(),
            leeway_ms: j.leeway_ms,
        });
        let cloudflare = match &config.cloudflare_access {
            None => None,
            Some(cf) => {
                let read = files::read_bounded(cf.jwks_file.as_ref(), MAX_JWKS_BYTES);
                let loaded = read
                    .as_ref()
                    .map_err(|e| format!("cannot read {}: {e}", cf.jwks_file))
                    .and_then(|bytes| Jwks::from_json(bytes).map_err(|e| format!("{}: {e}", cf.jwks_file)));
                let same_file =
                    previous.and_then(|p| p.cloudflare.as_ref()).filter(|old| old.jwks_file == cf.jwks_file);
                // On a reload of the same file: one that cannot be read or is
                // no JSON (a rotation caught half-written) keeps the keys that
                // worked; a document with no key at all is a revocation and
                // refuses every token; one whose keys break the rules refuses
                // the reload, as it would a start.
                let torn =
                    read.as_deref().map_or(true, |b| serde_json::from_slice::<serde::de::IgnoredAny>(b).is_err());
                let revoked = read.as_deref().is_ok_and(Jwks::names_no_key);
                let jwks = match (loaded, same_file) {
                    (Ok(jwks), _) => jwks,
                    (Err(_), Some(_)) if revoked => {
                        warn!(
                            "pools.{name}.access.cloudflareAccess.jwksFile: {} holds no RSA signing key: \
                             every Cloudflare Access token is refused until it has one",
                            cf.jwks_file
                        );
                        Jwks::none()
                    }
                    (Err(e), Some(old)) if torn => {
                        warn!("pools.{name}.access.cloudflareAccess.jwksFile: {e}; keeping the keys loaded before");
                        old.jwks.clone()
                    }
                    (Err(e), _) => return Err(format!("access.cloudflareAccess.jwksFile: {e}")),
                };
                Some(CloudflarePolicy {
                    jwks_file: cf.jwks_file.clone(),
                    jwks,
                    audience: cf.audience.clone(),
                    issuer: cf.issuer.clone(),
                })
            }
        };
        Ok(PoolAccess { ip_allow, trusted_proxies, hmac, jwt, cloudflare })
    }

    /// Keeps the remembered nonces across a reload, so a reload never
    /// reopens replay: a new capacity keeps every entry, and a wider window
    /// makes entries live longer and refuses requests signed so long ago
    /// that their nonces may already have been forgotten.
    pub fn carry_state_from(&mut self, old: &mut PoolAccess, now: EpochMs) {
        let now_epoch_ms = now.0;
        let (Some(new), Some(old)) = (&mut self.hmac, &mut old.hmac) else {
            return;
        };
        let capacity = new.nonces.capacity();
        std::mem::swap(&mut new.nonces, &mut old.nonces);
        new.nonces.set_capacity(capacity);
        new.not_before_ms = old.not_before_ms;
        if new.tolerance_ms > old.tolerance_ms {
            new.nonces.extend_expiries(new.tolerance_ms - old.tolerance_ms);
            new.not_before_ms = new.not_before_ms.max(now_epoch_ms.saturating_sub(old.tolerance_ms));
        }
    }

    /// The pool was removed and holds nothing any more: its nonces, which
    /// guarded only its leases, are forgotten, and the store starts empty
    /// at `now` (should a reload name the pool again, a request signed
    /// before then is refused, as after a start).
    pub fn shed(&mut self, now: EpochMs) {
        if let Some(policy) = &mut self.hmac {
            policy.nonces = NonceStore::new(policy.nonces.capacity());
            policy.not_before_ms = policy.not_before_ms.max(now.0);
        }
    }

    /// The process started at `at` with empty nonce stores: a request
    /// signed before then may have been accepted by the process before it
    /// (its nonce spent there), so it is refused rather than replayed.
    pub fn refuse_signed_before(&mut self, at: EpochMs) {
        if let Some(policy) = &mut self.hmac {
            policy.not_before_ms = policy.not_before_ms.max(at.0);
        }
    }

    /// The wall clock was stepped: Unix time moved from `old` to `new`.
    /// The instant before which signed requests are refused is an instant
    /// of this process (its start, a reload), so its Unix time follows the
    /// step, as every Unix time the server shows does. Left behind, a
    /// clock that ran ahead at the start and was then set right would
    /// refuse every request signed since, for as long as it had run ahead.
    pub fn follow_epoch(&mut self, old: Epoch, new: Epoch) {
        if let Some(policy) = &mut self.hmac {
            let (old, new) = (old.wall(0).0, new.wall(0).0);
            policy.not_before_ms = match new.checked_sub(old) {
                Some(ahead) => policy.not_before_ms.saturating_add(ahead),
                None => policy.not_before_ms.saturating_sub(old - new),
            };
        }
    }

    /// No policy configured: nothing to check.
    pub fn is_open(&self) -> bool {
        self.ip_allow.is_none() && self.hmac.is_none() && self.jwt.is_none() && self.cloudflare.is_none()
    }

    /// Which credential fields the policies read (proxy mode strips them).
    pub fn reads_jwt(&self) -> bool {
        self.jwt.is_some()
    }

    pub fn reads_cloudflare(&self) -> bool {
        self.cloudflare.is_some()
    }

    pub fn needs_body(&self) -> bool {
        self.hmac.is_some()
    }

    /// Whether `peer` is one of the pool's `trustedProxies`: only they may
    /// say a pool moved here (`X-Nthpool-Moved`).
    pub fn trusts_proxy(&self, peer: IpAddr) -> bool {
        self.trusted_proxies.contains(peer)
    }

    /// The client address: the peer, or the right-most untrusted
    /// `X-Forwarded-For` entry when the peer is a trusted proxy.
    pub fn client_addr(&self, peer: IpAddr, head: &Head) -> IpAddr {
        if self.trusted_proxies.is_empty() || !self.trusted_proxies.contains(peer) {
            return peer;
        }
        // Every field line counts, newest first: a limit here would let a
        // client hide the entry its proxy appended behind lines of its own.
        let newest_first =
            head.headers.rev().filter(|h| h.name.eq_ignore_ascii_case(b"x-forwarded-for")).map(|h| h.value);
        ip::client_addr(peer, newest_first, &self.trusted_proxies)
    }

    /// The IP allowlist, for the caller's address `client`.
    pub fn check_address(&self, client: IpAddr) -> Result<(), AccessError> {
        let Some(allow) = &self.ip_allow else {
            return Ok(());
        };
        if client == ip::UNKNOWN_CLIENT {
            return Err(AccessError::Forbidden(
                "Your proxy's X-Forwarded-For entry is not an address, so your address cannot be checked.",
            ));
        }
        if !allow.contains(client) {
            return Err(AccessError::Forbidden("Your address is not allowed to use this pool."));
        }
        Ok(())
    }

    /// Checks decidable from the head: IP allowlist, JWT, Cloudflare Access.
    /// `Authorization: Bearer` may carry the JWT only when the pool key came
    /// in `X-Nthpool-Key` (`head.api.key()`).
    pub fn check_head(&self, head: &Head, client: IpAddr, now: EpochMs) -> Result<(), AccessError> {
        let now_epoch_ms = now.0;
        self.check_address(client)?;
        if let Some(policy) = &self.jwt {
            let token = single(head, "x-nthpool-jwt", "X-Nthpool-Jwt is sent twice; send it once.")?.or_else(|| {
                head.api.key()?;
                let auth = head.api.authorization()?;
                crate::http::credentials(auth, "bearer")
            });
            let token = token.ok_or(denied(Denied::JWT_MISSING))?;
            policy.verify(trim(token), now_epoch_ms).map_err(denied)?;
        }
        if let Some(cf) = &self.cloudflare {
            let twice = "Cf-Access-Jwt-Assertion is sent twice; send it once.";
            let token = single(head, "cf-access-jwt-assertion", twice)?.ok_or(denied(Denied::CF_TOKEN_MISSING))?;
            cloudflare::verify(trim(token), &cf.jwks, &cf.audience, &cf.issuer, now_epoch_ms, CF_LEEWAY_MS)
                .map_err(denied)?;
        }
        Ok(())
    }

    /// What the head alone decides of `check_signed`: its signing headers
    /// each sent once and well formed, the timestamp inside the window. A
    /// refusal here is the one `check_signed` would give; nothing is
    /// remembered (the nonce is spent only once the MAC verified), and a pass
    /// leaves the whole check to `check_signed`. Only `Expect: 100-continue`
    /// asks this: any other request has its body, and `check_signed` does it all.
    pub fn check_signed_head(&self, head: &Head, now: EpochMs) -> Result<(), AccessError> {
        let Some(policy) = &self.hmac else {
            return Ok(());
        };
        let [timestamp, nonce, signature] = signing_headers(head)?;
        hmac::check_headers(timestamp, nonce, signature, now.0, policy.tolerance_ms).map_err(denied)
    }

    /// The HMAC signature over the exact body, then the nonce (remembered
    /// only once the MAC verified).
    pub fn check_signed(&mut self, head: &Head, body: &[u8], now: EpochMs) -> Result<(), AccessError> {
        let now_epoch_ms = now.0;
        let Some(policy) = &mut self.hmac else {
            return Ok(());
        };
        let method = match head.method {
            Method::Post => "POST",
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Other => "OTHER",
        };
        let [timestamp, nonce, signature] = signing_headers(head)?;
        let verified = hmac::verify(
            &policy.secret,
            method,
            head.path_str(),
            timestamp,
            nonce,
            signature,
            body,
            now_epoch_ms,
            policy.tolerance_ms,
        )
        .map_err(denied)?;
        if verified.timestamp_ms < policy.not_before_ms {
            return Err(denied(Denied::SIGNED_BEFORE_START));
        }
        match policy.nonces.insert(verified.nonce, now_epoch_ms, verified.nonce_expires_ms) {
            Ok(()) => Ok(()),
            Err(NonceError::Replay) => Err(denied(Denied::NONCE_REPLAYED)),
            Err(NonceError::Full { retry_after_ms }) => {
                let capacity = policy.nonces.capacity() as u64;
                Err(AccessError::Busy { capacity, retry_after_s: retry_after_ms.div_ceil(1000) })
            }
        }
    }
}
