//! The snapshot file (SPEC §11): its format, and writing it so that a crash
//! at any instant leaves either the old file or the new one, whole.
//!
//! A binary file, little-endian throughout, so a stop with a million held
//! slots writes it in one pass over one buffer:
//!
//! | bytes | what |
//! |---|---|
//! | 14 | `nthpool-state\n`, the format's name |
//! | 4 | its version (`VERSION`) |
//! | 4 + n | the header's length, then the header: a JSON object naming the kind (stop or periodic), when it was written, the identities of the configuration's pools and of the slot secret, each pool's learned state and counters (a pool retired by a reload, marked so, while it holds leases), and how many records follow |
//! | 91 each | one record per held lease ([`LEASE_RECORD`]; 87 in version 2, without the term) |
//! | 42 each | the ids of re-adopted slots since released (raw bytes) |
//! | 13 + n each | `index u32, credential u64, length u8, key`: the `Idempotency-Key` of the held lease at `index` |
//! | 32 | SHA-256 of every byte before it |
//!
//! A torn or edited file fails the checksum; a file of another version
//! (the JSON of version 1 included) is named as such; a file whose
//! identities differ from the running ones is not used. It holds slot ids,
//! so it is created with mode 0600, like the secret.
//!
//! Version 2 files are still read, so an upgrade keeps a graceful restart's
//! leases: their records lack the term each lease was granted with, and the
//! leases take their pool's current `termMs`, as version 2 builds did.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{MAX_DURATION_MS, MIN_TERM_MS};
use crate::governor::idempotency::IdemKey;
use crate::governor::learn::Learning;
use crate::governor::lease::{SlotId, SLOT_ID_BYTES};
use crate::governor::snapshot::{HeldKey, HeldLease, PoolState, Snapshot};
use crate::governor::{Governor, PoolStats};

pub const FORMAT: &str = "nthpool-state";
/// 1: JSON with a `sha256 <hex>` line; 2: this binary layout; 3: the same
/// with each lease's term at the end of its record.
pub const VERSION: u32 = 3;
/// The oldest version this build reads.
const OLDEST: u32 = 2;
const MAGIC: &[u8; 14] = b"nthpool-state\n";
/// How version 1 files begin: the JSON object's first two fields.
const JSON_PREFIX: &[u8] = br#"{"format":"nthpool-state","version":"#;
const DIGEST: usize = 32;
/// Version 2's lease record: `index u32, pool u32, epoch u32, flags u8 (1:
/// re-adopted; 2: restored from a periodic snapshot and not confirmed since),
/// slot id, lease deadline, request deadline, granted at (Unix ms, u64
/// each), grant sequence u64`.
const LEASE_RECORD_V2: usize = 4 + 4 + 4 + 1 + SLOT_ID_BYTES + 8 * 4;
/// Version 3's: version 2's, then the term the lease was granted with
/// (`termMs`, u32: at most a week), which its renewals extend it by.
pub const LEASE_RECORD: usize = LEASE_RECORD_V2 + 4;

/// Who wrote a snapshot: a graceful stop (the successor needs no window) or
/// the periodic timer (grants made after it are unknown: the window opens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Stop,
    Periodic,
}

/// What a snapshot must match to be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// SHA-256 of every pool's name and governor settings, as this version
    /// writes it (`config_identity`).
    pub config: String,
    /// The same as version 2 wrote it.
    pub config_v2: String,
    /// A MAC under the slot secret: a file of another secret's ids is foreign.
    pub secret: String,
}

impl Identity {
    pub fn new<T: Copy>(gov: &Governor<T>, secret: &[u8; 32]) -> Identity {
        Identity {
            config: config_identity(gov, VERSION),
            config_v2: config_identity(gov, OLDEST),
            secret: secret_identity(secret),
        }
    }

    /// A reload changed the pools or their settings; the secret stays.
    pub fn reconfigured<T: Copy>(&mut self, gov: &Governor<T>) {
        self.config = config_identity(gov, VERSION);
        self.config_v2 = config_identity(gov, OLDEST);
    }
}

/// The governor's configured pools and the settings held leases and learned
/// state depend on, as a file of `version` holds it. Keys and access
/// policies are not part of it: rotating a key keeps the snapshot. Nor,
/// since version 3, are `termMs` and `renewIntervalMs`: each lease in the
/// file keeps the term it was granted with, so a new term is for the grants
/// that follow, as after a reload. A version 2 file's leases take their
/// pool's term: they are used only under the term they were written with.
pub fn config_identity<T: Copy>(gov: &Governor<T>, version: u32) -> String {
    let mut h = Sha256::new();
    // By name: a pool a reload added sits after the others in the governor,
    // where a start from the same configuration puts it in name order.
    let mut pools: Vec<_> = gov.pools().map(|(_, p)| p).filter(|p| !p.retired).collect();
    pools.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    for pool in pools {
        let s = &pool.settings;
        let (rpm, burst) = s.rpm.unwrap_or((0, 0));
        h.update(pool.name.as_bytes());
        h.update([0]);
        let limits = [s.concurrency as u64, s.queue_size as u64, s.queue_timeout_ms, rpm as u64, burst as u64];
        let terms: &[u64] = if version == OLDEST { &[s.term_ms, s.renew_interval_ms] } else { &[] };
        for n in limits.iter().chain(terms).chain(&[s.request_timeout_ms, s.adaptive as u64]) {
            h.update(n.to_le_bytes());
        }
    }
    hex(&h.finalize())
}

fn secret_identity(secret: &[u8; 32]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(b"nthpool state file");
    hex(&mac.finalize().into_bytes()[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The JSON header: everything but the records, which it counts.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header {
    kind: Kind,
    written_at_unix_ms: u64,
    config_identity: String,
    secret_identity: String,
    pools: Vec<FilePool>,
    leases: u64,
    dead_adopted: u64,
    idempotency_keys: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePool {
    name: String,
    learning: Learning,
    gate: Option<(u32, u64)>,
    stats: PoolStats,
    recovering_until: Option<u64>,
    /// Retired by a reload, its leases draining (absent: configured).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    retired: bool,
}

/// The file's bytes for `snap`: one buffer, sized up front, one checksum.
pub fn encode(snap: &Snapshot, kind: Kind, identity: &Identity) -> Vec<u8> {
    let header = Header {
        kind,
        written_at_unix_ms: snap.written_at,
        config_identity: identity.config.clone(),
        secret_identity: identity.secret.clone(),
        pools: snap
            .pools
            .iter()
            .map(|p| FilePool {
                name: p.name.to_string(),
                learning: p.learning.clone(),
                gate: p.gate,
                stats: p.stats,
                recovering_until: p.recovering_until,
                retired: p.retired,
            })
            .collect(),
        leases: snap.leases.len() as u64,
        dead_adopted: snap.dead_adopted.len() as u64,
        idempotency_keys: snap.keys.len() as u64,
    };
    let header = serde_json::to_vec(&header).expect("a snapshot header serializes");
    let keys: usize = snap.keys.iter().map(|k| 13 + k.key.as_bytes().len()).sum();
    let size = MAGIC.len()
        + 8
        + header.len()
        + snap.leases.len() * LEASE_RECORD
        + snap.dead_adopted.len() * SLOT_ID_BYTES
        + keys
        + DIGEST;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    for l in &snap.leases {
        let mut record = [0u8; LEASE_RECORD];
        record[..4].copy_from_slice(&l.index.to_le_bytes());
        record[4..8].copy_from_slice(&l.pool.to_le_bytes());
        record[8..12].copy_from_slice(&l.epoch.to_le_bytes());
        record[12] = u8::from(l.adopted) | u8::from(l.unconfirmed) << 1;
        record[13..13 + SLOT_ID_BYTES].copy_from_slice(&l.id.0);
        let times = [l.lease_deadline, l.request_deadline, l.granted_at, l.grant_seq];
        for (at, n) in record[13 + SLOT_ID_BYTES..LEASE_RECORD_V2].chunks_exact_mut(8).zip(times) {
            at.copy_from_slice(&n.to_le_bytes());
        }
        // Every lease of a running governor knows its term; only one read
        // from a version 2 file does not.
        debug_assert!(l.term_ms.is_some());
        record[LEASE_RECORD_V2..].copy_from_slice(&l.term_ms.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&record);
    }
    for id in &snap.dead_adopted {
        out.extend_from_slice(&id.0);
    }
    for k in &snap.keys {
        let bytes = k.key.as_bytes();
        out.extend_from_slice(&k.index.to_le_bytes());
        out.extend_from_slice(&k.key.credential().to_le_bytes());
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    debug_assert_eq!(out.len(), size);
    out
}

/// Reads the file's records in order; every shortfall is a corrupt file.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("corrupt: shorter than its header says".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// Room for `count` records of at least `each` bytes: a count no file
    /// of this length can hold is refused before anything is allocated.
    fn room(&self, count: u64, each: usize) -> Result<usize, String> {
        match usize::try_from(count) {
            Ok(n) if n.checked_mul(each).is_some_and(|b| b <= self.0.len()) => Ok(n),
            _ => Err("corrupt: its header counts more records than it holds".into()),
        }
    }
}

/// The version a file says it is, or why it is no snapshot at all.
fn version(bytes: &[u8]) -> Result<u32, String> {
    if let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) {
        return Reader(rest).u32();
    }
    let not_ours = "corrupt: not an nthpool state file (a torn or foreign file)";
    let rest = bytes.strip_prefix(JSON_PREFIX).ok_or(not_ours)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok().and_then(|d| d.parse().ok()).ok_or_else(|| not_ours.to_string())
}

/// Reads a file's bytes back; the error says in a few words why it is not used.
#[cfg(test)]
pub fn decode(bytes: &[u8], identity: &Identity) -> Result<(Kind, Snapshot), String> {
    match decode_any_config(bytes, identity)? {
        (kind, snap, true) => Ok((kind, snap)),
        (_, _, false) => Err(MISMATCHED.into()),
    }
}

pub const MISMATCHED: &str = "mismatched: the pools or their settings changed since it was written";

/// `decode`, also reading a file written under this secret for other pools
/// or settings: the flag says whether they match.
pub fn decode_any_config(bytes: &[u8], identity: &Identity) -> Result<(Kind, Snapshot, bool), String> {
    let version = version(bytes)?;
    if !(OLDEST..=VERSION).contains(&version) {
        return Err(format!(
            "format {FORMAT:?} version {version}, this build reads {FORMAT:?} versions {OLDEST} to {VERSION}"
        ));
    }
    let record_len = if version == OLDEST { LEASE_RECORD_V2 } else { LEASE_RECORD };
    let Some(body_len) = bytes.len().checked_sub(DIGEST).filter(|&n| n >= MAGIC.len() + 8) else {
        return Err("corrupt: shorter than its header (a torn file)".into());
    };
    let (body, digest) = bytes.split_at(body_len);
    if Sha256::digest(body).as_slice() != digest {
        return Err("corrupt: the checksum does not match its contents".into());
    }
    let mut r = Reader(&body[MAGIC.len() + 4..]);
    let header_len = r.u32()? as usize;
    let header: Header = serde_json::from_slice(r.take(header_len)?).map_err(|e| format!("corrupt: {e}"))?;
    if header.secret_identity != identity.secret {
        return Err("foreign: written under another slot secret".into());
    }
    let config = if version == OLDEST { &identity.config_v2 } else { &identity.config };
    let same_config = header.config_identity == *config;
    let count = r.room(header.leases, record_len)?;
    let mut leases = Vec::with_capacity(count);
    for record in r.take(count * record_len)?.chunks_exact(record_len) {
        let mut r = Reader(record);
        let (index, pool, epoch) = (r.u32()?, r.u32()?, r.u32()?);
        let (adopted, unconfirmed) = match r.array::<1>()? {
            [flags @ 0..=3] => (flags & 1 != 0, flags & 2 != 0),
            _ => return Err("corrupt: a lease record out of place".into()),
        };
        let id = SlotId(r.array()?);
        let (lease_deadline, request_deadline, granted_at, grant_seq) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        // A term no configuration allows would have renewals extend the
        // lease by nothing, or for longer than any pool may.
        let term_ms = match version {
            OLDEST => None,
            _ => match r.u32()? {
                term if (MIN_TERM_MS..=MAX_DURATION_MS).contains(&u64::from(term)) => Some(term),
                _ => return Err("corrupt: a lease's term is one no configuration allows".into()),
            },
        };
        leases.push(HeldLease {
            index,
            pool,
            id,
            lease_deadline,
            request_deadline,
            granted_at,
            grant_seq,
            term_ms,
            epoch,
            adopted,
            unconfirmed,
        });
    }
    let mut dead_adopted = Vec::with_capacity(r.room(header.dead_adopted, SLOT_ID_BYTES)?);
    for _ in 0..header.dead_adopted {
        dead_adopted.push(SlotId(r.array()?));
    }
    let mut keys = Vec::with_capacity(r.room(header.idempotency_keys, 14)?);
    for _ in 0..header.idempotency_keys {
        let (index, credential) = (r.u32()?, r.u64()?);
        let len = r.array::<1>()?[0] as usize;
        let key = IdemKey::new(credential, r.take(len)?).ok_or("corrupt: a malformed idempotency key")?;
        keys.push(HeldKey { index, key });
    }
    if !r.0.is_empty() {
        return Err("corrupt: bytes past its last record".into());
    }
    let pools = header
        .pools
        .into_iter()
        .map(|p| PoolState {
            name: p.name.into(),
            learning: p.learning,
            gate: p.gate,
            stats: p.stats,
            recovering_until: p.recovering_until,
            retired: p.retired,
        })
        .collect();
    Ok((
        header.kind,
        Snapshot { pools, leases, keys, dead_adopted, written_at: header.written_at_unix_ms },
        same_config,
    ))
}

/// The temporary file `write_atomic` writes before renaming it over `path`.
pub(super) fn temporary(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    tmp.into()
}

/// Whether a snapshot could be written to `path`: a file is created beside
/// it and removed again (a missing or read-only directory fails), and `path`
/// is no directory (a rename cannot replace one), nor its temporary file
/// or its lock anything but a regular file, nor where a refused snapshot
/// is moved a directory. The file created is this
/// process's own, never `write_atomic`'s temporary one: `--check-config` or
/// a second start checks the file of a server that may be writing its
/// snapshot right then.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Err(std::io::Error::other("it is a directory")),
        // A device or a pipe (`/dev/null` to mean "none"): reading it could
        // block, and a refused snapshot is renamed out of the way.
        Ok(m) if !m.is_file() => {
            return Err(std::io::Error::other(
                "it is not a regular file (a device, pipe or socket); `null` writes no snapshot",
            ))
        }
        _ => {}
    }
    // Each snapshot is written there first: a regular file (one being
    // written, or left by a crash) is replaced, but a directory would fail
    // every snapshot, a pipe block the stop's for good, and a symbolic link
    // have it written wherever it leads.
    let tmp = temporary(path);
    if std::fs::symlink_metadata(&tmp).is_ok_and(|m| !m.is_file()) {
        return Err(std::io::Error::other(format!(
            "{}, where each snapshot is written first, is not a regular file: remove it",
            tmp.display()
        )));
    }
    // The lock is opened for reading and writing the lease terms: a pipe
    // would lose them (and its lock keep out no other process), a
    // directory or a device cannot hold them.
    let lock = super::lock_path(path);
    if std::fs::metadata(&lock).is_ok_and(|m| !m.is_file()) {
        return Err(std::io::Error::other(format!(
            "{}, the lock a running server holds, is not a regular file: remove it",
            lock.display()
        )));
    }
    // A refused snapshot is renamed there, which no rename can do over a
    // directory: the refused file would stay, for a later start to load.
    let aside = super::refused_path(path);
    if std::fs::symlink_metadata(&aside).is_ok_and(|m| m.is_dir()) {
        return Err(std::io::Error::other(format!(
            "{}, where a refused snapshot is moved, is a directory: remove it",
            aside.display()
        )));
    }
    // A name no other check uses (`random_hex`), never removed unless created here.
    let mut probe = path.as_os_str().to_owned();
    probe.push(format!(".check-{}", super::random_hex()));
    OpenOptions::new().write(true).create_new(true).mode(0o600).open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it,
/// synced, renamed over it, and the directory synced so the rename lasts.
/// A write that fails (a full disk) removes its temporary file: a partial
/// one would keep the space the next write needs.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary(path);
    let tmp = tmp.as_path();
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(tmp)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|()| std::fs::rename(tmp, path)) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    sync_dir(path)
}

/// Renames a refused snapshot, durably: a later start must not find it.
pub fn rename(path: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(path, to)?;
    sync_dir(path)
}

/// Removes a used snapshot, durably: a later crash must not find it again.
pub fn remove(path: &Path) -> std::io::Result<()> {
    std::fs::remove_file(path)?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => File::open(dir)?.sync_all(),
        None => File::open(".")?.sync_all(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn setup(concurrency: u32) -> Governor {
        let json = format!(r#"{{"pools":{{"p":{{"keys":["k"],"concurrency":{concurrency}}}}}}}"#);
        let config = Config::parse(json.as_bytes()).unwrap();
        let entropy = crate::governor::Entropy::seeded(u64::from(concurrency));
        let mut g = Governor::new(&crate::api::pool_settings(&config), entropy);
        g.set_identity(&[3; 32], crate::time::Epoch::at(crate::time::EpochMs(1_800_000_000_000)));
        g
    }

    /// `bytes` with `edit` applied and the checksum made right again.
    fn resealed(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut body = bytes[..bytes.len() - DIGEST].to_vec();
        edit(&mut body);
        let digest = Sha256::digest(&body);
        body.extend_from_slice(&digest);
        body
    }

    #[test]
    fn round_trips_and_refuses_what_does_not_match() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        g.acquire(p, 0, 0, 0);
        g.acquire(p, 0, 0, 0);
        let snap = g.export(5);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&snap, Kind::Stop, &identity);
        assert_eq!(decode(&bytes, &identity).unwrap(), (Kind::Stop, snap.clone()));
        // A lease still unconfirmed after a periodic snapshot's restore stays so.
        let mut unconfirmed = snap.clone();
        unconfirmed.leases[1].unconfirmed = true;
        let again = encode(&unconfirmed, Kind::Stop, &identity);
        assert_eq!(decode(&again, &identity).unwrap(), (Kind::Stop, unconfirmed));

        for at in [MAGIC.len() + 8, bytes.len() - DIGEST - 1, bytes.len() - 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 1;
            assert!(decode(&flipped, &identity).unwrap_err().contains("checksum"), "byte {at}");
        }
        assert!(decode(&bytes[..bytes.len() / 2], &identity).unwrap_err().starts_with("corrupt"));
        assert!(decode(&bytes[..MAGIC.len() + 4], &identity).unwrap_err().starts_with("corrupt"));
        assert!(decode(b"", &identity).unwrap_err().contains("not an nthpool state file"));
        assert!(decode(b"{\"hello\":1}", &identity).unwrap_err().contains("not an nthpool state file"));
        // A count the file cannot hold, with a good checksum, allocates nothing.
        let inflated = resealed(&bytes, |b| {
            let (from, to) = (&b"\"leases\":2,"[..], &b"\"leases\":9000000000,"[..]);
            let at = b.windows(from.len()).position(|w| w == from).unwrap();
            b.splice(at..at + from.len(), to.iter().copied());
            let header_len = u32::from_le_bytes(b[MAGIC.len() + 4..MAGIC.len() + 8].try_into().unwrap());
            let header_len = header_len + (to.len() - from.len()) as u32;
            b[MAGIC.len() + 4..MAGIC.len() + 8].copy_from_slice(&header_len.to_le_bytes());
        });
        assert!(decode(&inflated, &identity).unwrap_err().contains("counts more records"));
        let trailing = resealed(&bytes, |b| b.push(0));
        assert!(decode(&trailing, &identity).unwrap_err().contains("past its last record"));

        let other_secret = Identity::new(&g, &[4; 32]);
        assert!(decode(&bytes, &other_secret).unwrap_err().starts_with("foreign"));
        let other = setup(5);
        let moved = Identity::new(&other, &[3; 32]);
        assert!(decode(&bytes, &moved).unwrap_err().starts_with("mismatched"));

        let future = resealed(&bytes, |b| b[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&9u32.to_le_bytes()));
        assert_eq!(
            decode(&future, &identity).unwrap_err(),
            r#"format "nthpool-state" version 9, this build reads "nthpool-state" versions 2 to 3"#
        );
        // What version 1 wrote: JSON, then a line with its SHA-256.
        let v1 = b"{\"format\":\"nthpool-state\",\"version\":1,\"kind\":\"stop\",\"leases\":[]}\nsha256 00\n";
        assert!(decode(v1, &identity).unwrap_err().starts_with(r#"format "nthpool-state" version 1, this build"#));
    }

    #[test]
    fn a_pool_a_reload_added_matches_a_start_from_that_configuration() {
        let both = r#"{"pools":{"a":{"keys":["k"]},"p":{"keys":["k"],"concurrency":4}}}"#;
        let both = crate::api::pool_settings(&Config::parse(both.as_bytes()).unwrap());
        let mut reloaded = setup(4);
        reloaded.reconfigure(&both, 0);
        let started = Governor::<()>::new(&both, crate::governor::Entropy::seeded(1));
        assert_eq!(Identity::new(&reloaded, &[3; 32]), Identity::new(&started, &[3; 32]));
        let only_p = r#"{"pools":{"p":{"keys":["k"],"concurrency":4}}}"#;
        reloaded.reconfigure(&crate::api::pool_settings(&Config::parse(only_p.as_bytes()).unwrap()), 0);
        assert_eq!(
            Identity::new(&reloaded, &[3; 32]),
            Identity::new(&setup(4), &[3; 32]),
            "a retired pool is left out"
        );
    }

    #[test]
    fn a_lease_record_is_its_fields_at_fixed_places() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        g.acquire(p, 0, 0, 0);
        let snap = g.export(5);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&snap, Kind::Periodic, &identity);
        let l = &snap.leases[0];
        let record = &bytes[bytes.len() - DIGEST - LEASE_RECORD..bytes.len() - DIGEST];
        assert_eq!(record[..4], l.index.to_le_bytes());
        assert_eq!(record[12], 0, "not adopted");
        assert_eq!(record[13..13 + SLOT_ID_BYTES], l.id.0);
        assert_eq!(record[LEASE_RECORD_V2 - 8..LEASE_RECORD_V2], l.grant_seq.to_le_bytes());
        assert_eq!(record[LEASE_RECORD_V2..], 30_000u32.to_le_bytes(), "the term it was granted with");
        assert_eq!(decode(&bytes, &identity).unwrap().0, Kind::Periodic);
    }

    /// What a version 2 build wrote at stop for `setup(4)` after a keyed
    /// acquire and a plain one at 0, exported at 5 (the records without a term).
    const VERSION_2_FILE: &[u8] = include_bytes!("../../tests/data/state-v2.bin");

    #[test]
    fn a_version_2_file_still_loads_with_no_term_for_its_leases() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        assert!(g.acquire_keyed(p, &IdemKey::new(77, b"order 42").unwrap(), 0, 0, 0).is_ok());
        g.acquire(p, 0, 0, 0);
        let mut expected = g.export(5);
        for l in &mut expected.leases {
            assert_eq!(l.term_ms, Some(30_000));
            l.term_ms = None;
        }
        // Nor what learning has kept since (read as its default).
        for p in &mut expected.pools {
            p.learning.budget_not_before = 0;
            p.learning.successes_since = 0;
        }
        let identity = Identity::new(&g, &[3; 32]);
        assert_eq!(VERSION_2_FILE[MAGIC.len()..MAGIC.len() + 4], 2u32.to_le_bytes());
        assert_eq!(decode(VERSION_2_FILE, &identity).unwrap(), (Kind::Stop, expected));
        // A record of version 2's length in a file that says 3 is refused.
        let relabelled =
            resealed(VERSION_2_FILE, |b| b[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&3u32.to_le_bytes()));
        assert!(decode(&relabelled, &identity).unwrap_err().starts_with("corrupt"));
    }

    #[test]
    fn a_new_term_matches_a_version_3_file_but_not_a_version_2_one() {
        let with = |settings: &str| {
            let json = format!(r#"{{"pools":{{"p":{{"keys":["k"],"concurrency":4{settings}}}}}}}"#);
            let settings = crate::api::pool_settings(&Config::parse(json.as_bytes()).unwrap());
            let mut g: Governor = Governor::new(&settings, crate::governor::Entropy::seeded(4));
            g.set_identity(&[3; 32], crate::time::Epoch::at(crate::time::EpochMs(1_800_000_000_000)));
            Identity::new(&g, &[3; 32])
        };
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        g.acquire(p, 0, 0, 0);
        let bytes = encode(&g.export(5), Kind::Stop, &Identity::new(&g, &[3; 32]));
        let new_term = with(r#","termMs":2000,"renewIntervalMs":700"#);
        assert!(decode(&bytes, &new_term).is_ok(), "its leases keep their terms: a new one is a reload's change");
        assert!(decode(VERSION_2_FILE, &with("")).is_ok());
        assert_eq!(decode(VERSION_2_FILE, &new_term).unwrap_err(), MISMATCHED, "its leases would take the new term");
        for other in [r#","requestTimeoutMs":90000"#, r#","adaptive":false"#, r#","queue":{"size":3}"#, r#","rpm":60"#]
        {
            assert_eq!(decode(&bytes, &with(other)).unwrap_err(), MISMATCHED, "{other}");
        }
    }

    #[test]
    fn a_term_no_configuration_allows_is_refused() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        g.acquire(p, 0, 0, 0);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&g.export(5), Kind::Stop, &identity);
        let term_at = bytes.len() - DIGEST - 4;
        for (term, ok) in [(0, false), (9, false), (10, true), (604_800_000, true), (604_800_001, false)] {
            let edited = resealed(&bytes, |b| b[term_at..term_at + 4].copy_from_slice(&u32::to_le_bytes(term)));
            match decode(&edited, &identity) {
                Ok((_, snap)) => assert!(ok && snap.leases[0].term_ms == Some(term), "{term}"),
                Err(e) => assert!(!ok && e.contains("term"), "{term}: {e}"),
            }
        }
    }

    #[test]
    fn a_retired_pool_holding_leases_round_trips_marked_and_leaves_the_identity_alone() {
        let two = r#"{"pools":{"a":{"keys":["k"]},"p":{"keys":["k"],"concurrency":4}}}"#;
        let mut g = setup(4);
        g.reconfigure(&crate::api::pool_settings(&Config::parse(two.as_bytes()).unwrap()), 0);
        let a = g.pool_id("a").unwrap();
        g.acquire(a, 0, 0, 0);
        g.reconfigure(
            &crate::api::pool_settings(&Config::parse(br#"{"pools":{"p":{"keys":["k"],"concurrency":4}}}"#).unwrap()),
            0,
        );
        let snap = g.export(5);
        assert_eq!(snap.pools.iter().map(|p| (&*p.name, p.retired)).collect::<Vec<_>>(), [("p", false), ("a", true)]);
        let identity = Identity::new(&g, &[3; 32]);
        assert_eq!(identity, Identity::new(&setup(4), &[3; 32]), "the retired pool is not part of the configuration");
        let bytes = encode(&snap, Kind::Stop, &identity);
        assert_eq!(decode(&bytes, &identity).unwrap().1, snap);
        // Drained, it is left out.
        assert!(g.release(a, &g.export(5).leases[0].id.encode(), None, 6));
        assert_eq!(g.export(6).pools.len(), 1);
    }

    #[test]
    fn idempotency_keys_round_trip() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        let key = IdemKey::new(77, b"order 42").unwrap();
        assert!(g.acquire_keyed(p, &key, 0, 0, 0).is_ok());
        g.acquire(p, 0, 0, 0);
        let snap = g.export(5);
        assert_eq!(snap.keys, [HeldKey { index: 0, key }]);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&snap, Kind::Stop, &identity);
        let record = [&0u32.to_le_bytes()[..], &77u64.to_le_bytes(), &[8], b"order 42"].concat();
        assert_eq!(bytes[bytes.len() - DIGEST - record.len()..bytes.len() - DIGEST], record);
        assert_eq!(decode(&bytes, &identity).unwrap().1, snap);
        let bad = resealed(&bytes, |b| {
            let at = b.len() - 1;
            b[at] = b'\n';
        });
        assert!(decode(&bad, &identity).unwrap_err().contains("malformed idempotency key"));
    }

    #[test]
    fn the_written_file_is_private_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nthpool-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nthpool.state");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!dir.join("nthpool.state.tmp").exists());
        remove(&path).unwrap();
        assert!(!path.exists());
        // A write that fails leaves no temporary file (here the rename: a
        // directory stands where the snapshot goes).
        std::fs::create_dir_all(&path).unwrap();
        assert!(write_atomic(&path, b"third").is_err());
        assert!(!dir.join("nthpool.state.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--check-config`, or a second start the lock will refuse, checks the
    /// file of a server that may be writing its snapshot at that moment:
    /// the check touches nothing of that write.
    #[test]
    fn the_writability_check_leaves_a_snapshot_being_written_alone() {
        let dir = std::env::temp_dir().join(format!("nthpool-state-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nthpool.state");
        let writing = temporary(&path);
        std::fs::write(&writing, b"a snapshot halfway written").unwrap();
        check_writable(&path).unwrap();
        assert_eq!(std::fs::read(&writing).unwrap(), b"a snapshot halfway written");
        // It leaves nothing of its own.
        let names = || std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>();
        assert_eq!(names(), vec![std::ffi::OsString::from("nthpool.state.tmp")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A temporary file that is no regular file would fail every snapshot
    /// (a directory), block the stop's (a pipe) or send it elsewhere (a
    /// link): refused, named, so start-up and a reload say so at once.
    #[test]
    fn a_temporary_file_that_is_no_regular_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("nthpool-state-tmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nthpool.state");
        let tmp = temporary(&path);
        std::fs::create_dir(&tmp).unwrap();
        let e = check_writable(&path).unwrap_err().to_string();
        assert!(e.contains("nthpool.state.tmp, where each snapshot is written first, is not a regular file"), "{e}");
        std::fs::remove_dir(&tmp).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &tmp).unwrap();
        assert!(check_writable(&path).is_err(), "a link");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lock that is no regular file could not keep the lease terms, and
    /// a directory where a refused snapshot goes would leave it in place
    /// for a later start to load: both refused, named.
    #[test]
    fn a_lock_that_is_no_regular_file_or_a_refused_path_that_is_a_directory_is_refused() {
        let dir = std::env::temp_dir().join(format!("nthpool-state-side-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nthpool.state");
        let lock = super::super::lock_path(&path);
        std::fs::create_dir(&lock).unwrap();
        let e = check_writable(&path).unwrap_err().to_string();
        assert!(e.contains("nthpool.state.lock, the lock a running server holds, is not a regular file"), "{e}");
        std::fs::remove_dir(&lock).unwrap();
        std::fs::write(&lock, b"").unwrap();
        let aside = super::super::refused_path(&path);
        std::fs::create_dir(&aside).unwrap();
        let e = check_writable(&path).unwrap_err().to_string();
        assert!(e.contains("nthpool.state.refused, where a refused snapshot is moved, is a directory"), "{e}");
        std::fs::remove_dir(&aside).unwrap();
        std::fs::write(&aside, b"an earlier one").unwrap();
        assert!(check_writable(&path).is_ok(), "a refused snapshot of before is replaced");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
