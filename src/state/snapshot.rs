//! The snapshot file (SPEC §11): its format, and writing it so that a crash
//! at any instant leaves either the old file or the new one, whole.
//!
//! The file is one JSON object followed by a line `sha256 <hex>` over the
//! bytes before it, so a torn or edited file is told from a good one. The
//! object names its format and version, whether a graceful stop or the
//! periodic timer wrote it, the identity of the configuration's pools and
//! of the slot secret it was written under; a file whose identities differ
//! from the running ones is not used. It holds slot ids, so it is created
//! with mode 0600, like the secret.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::governor::idempotency::IdemKey;
use crate::governor::learn::Learning;
use crate::governor::lease::SlotId;
use crate::governor::snapshot::{HeldLease, PoolState, Snapshot};
use crate::governor::{Governor, PoolStats};

pub const FORMAT: &str = "nthpool-state";
pub const VERSION: u32 = 1;
const TRAILER: &[u8] = b"\nsha256 ";

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
    /// SHA-256 of every pool's name and governor settings.
    pub config: String,
    /// A MAC under the slot secret: a file of another secret's ids is foreign.
    pub secret: String,
}

impl Identity {
    pub fn new<T: Copy>(gov: &Governor<T>, secret: &[u8; 32]) -> Identity {
        Identity { config: config_identity(gov), secret: secret_identity(secret) }
    }
}

/// The governor's configured pools and the settings held leases and learned
/// state depend on. Keys and access policies are not part of it: rotating a
/// key keeps the snapshot.
pub fn config_identity<T: Copy>(gov: &Governor<T>) -> String {
    let mut h = Sha256::new();
    for (_, pool) in gov.pools().filter(|(_, p)| !p.retired) {
        let s = &pool.settings;
        let (rpm, burst) = s.rpm.unwrap_or((0, 0));
        h.update(pool.name.as_bytes());
        h.update([0]);
        for n in [
            s.concurrency as u64,
            s.queue_size as u64,
            s.queue_timeout_ms,
            rpm as u64,
            burst as u64,
            s.term_ms,
            s.renew_interval_ms,
            s.request_timeout_ms,
            s.adaptive as u64,
        ] {
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

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StateFile {
    format: String,
    version: u32,
    kind: Kind,
    written_at_unix_ms: u64,
    config_identity: String,
    secret_identity: String,
    pools: Vec<FilePool>,
    /// `[index, pool, slotId, leaseDeadline, requestDeadline, grantedAt, grantSeq, epoch, adopted]`.
    leases: Vec<FileLease>,
    dead_adopted: Vec<String>,
    /// `[index, credential, key]`: the `Idempotency-Key` of the held lease at
    /// `index` and the hash of the pool key that presented it. Absent from
    /// files without keys, and from those older builds wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    idempotency_keys: Vec<FileKey>,
}

/// The fields checked before the rest is read, so another version is named as such.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: String,
    version: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePool {
    name: String,
    learning: Learning,
    gate: Option<(u32, u64)>,
    stats: PoolStats,
    recovering_until: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct FileLease(u32, u32, String, u64, u64, u64, u64, u32, bool);

#[derive(Serialize, Deserialize)]
struct FileKey(u32, u64, String);

/// The file's bytes for `snap`.
pub fn encode(snap: &Snapshot, kind: Kind, identity: &Identity, written_at_unix_ms: u64) -> Vec<u8> {
    let text = |id: &SlotId| String::from_utf8(id.encode().to_vec()).expect("base64url is ASCII");
    let file = StateFile {
        format: FORMAT.into(),
        version: VERSION,
        kind,
        written_at_unix_ms,
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
            })
            .collect(),
        leases: snap
            .leases
            .iter()
            .map(|l| {
                FileLease(
                    l.index,
                    l.pool,
                    text(&l.id),
                    l.lease_deadline,
                    l.request_deadline,
                    l.granted_at,
                    l.grant_seq,
                    l.epoch,
                    l.adopted,
                )
            })
            .collect(),
        dead_adopted: snap.dead_adopted.iter().map(text).collect(),
        idempotency_keys: snap
            .leases
            .iter()
            .filter_map(|l| {
                let key = l.key?;
                let bytes = String::from_utf8(key.as_bytes().to_vec()).expect("a key is printable ASCII");
                Some(FileKey(l.index, key.credential(), bytes))
            })
            .collect(),
    };
    let mut out = serde_json::to_vec(&file).expect("a snapshot serializes");
    let digest = hex(&Sha256::digest(&out));
    out.extend_from_slice(TRAILER);
    out.extend_from_slice(digest.as_bytes());
    out.push(b'\n');
    out
}

/// Reads a file's bytes back; the error says in a few words why it is not used.
pub fn decode(bytes: &[u8], identity: &Identity) -> Result<(Kind, Snapshot), String> {
    let at = bytes
        .windows(TRAILER.len())
        .rposition(|w| w == TRAILER)
        .ok_or("corrupt: no checksum line (a torn or foreign file)")?;
    let (body, trailer) = (&bytes[..at], &bytes[at + TRAILER.len()..]);
    if trailer.strip_suffix(b"\n") != Some(hex(&Sha256::digest(body)).as_bytes()) {
        return Err("corrupt: the checksum does not match its contents".into());
    }
    let header: Header = serde_json::from_slice(body).map_err(|e| format!("corrupt: {e}"))?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(format!(
            "format {:?} version {}, this build reads {FORMAT:?} version {VERSION}",
            header.format, header.version
        ));
    }
    let file: StateFile = serde_json::from_slice(body).map_err(|e| format!("corrupt: {e}"))?;
    if file.secret_identity != identity.secret {
        return Err("foreign: written under another slot secret".into());
    }
    if file.config_identity != identity.config {
        return Err("mismatched: the pools or their settings changed since it was written".into());
    }
    let id = |text: &str| SlotId::decode(text.as_bytes()).ok_or_else(|| "corrupt: a malformed slot id".to_string());
    let mut leases = Vec::with_capacity(file.leases.len());
    for FileLease(index, pool, slot, lease_deadline, request_deadline, granted_at, grant_seq, epoch, adopted) in
        &file.leases
    {
        leases.push(HeldLease {
            index: *index,
            pool: *pool,
            id: id(slot)?,
            lease_deadline: *lease_deadline,
            request_deadline: *request_deadline,
            granted_at: *granted_at,
            grant_seq: *grant_seq,
            epoch: *epoch,
            adopted: *adopted,
            key: None,
        });
    }
    let at: std::collections::HashMap<u32, usize> = match file.idempotency_keys.is_empty() {
        true => Default::default(),
        false => leases.iter().enumerate().map(|(at, l)| (l.index, at)).collect(),
    };
    for FileKey(index, credential, key) in &file.idempotency_keys {
        let &at = at.get(index).ok_or("corrupt: an idempotency key names no held lease")?;
        let lease = &mut leases[at];
        lease.key = Some(IdemKey::new(*credential, key.as_bytes()).ok_or("corrupt: a malformed idempotency key")?);
    }
    let snap = Snapshot {
        pools: file
            .pools
            .into_iter()
            .map(|p| PoolState {
                name: p.name.into(),
                learning: p.learning,
                gate: p.gate,
                stats: p.stats,
                recovering_until: p.recovering_until,
            })
            .collect(),
        leases,
        dead_adopted: file.dead_adopted.iter().map(|t| id(t)).collect::<Result<_, _>>()?,
    };
    Ok((file.kind, snap))
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it,
/// synced, renamed over it, and the directory synced so the rename lasts.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path)?;
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

    #[test]
    fn round_trips_and_refuses_what_does_not_match() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        g.acquire(p, 0, 0, 0);
        g.acquire(p, 0, 0, 0);
        let snap = g.export(5);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&snap, Kind::Stop, &identity, 1_800_000_000_005);
        assert_eq!(decode(&bytes, &identity).unwrap(), (Kind::Stop, snap.clone()));

        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(decode(&flipped, &identity).unwrap_err().starts_with("corrupt"));
        assert!(decode(&bytes[..bytes.len() / 2], &identity).unwrap_err().starts_with("corrupt"));
        assert!(decode(b"", &identity).unwrap_err().starts_with("corrupt"));
        let other_secret = Identity::new(&g, &[4; 32]);
        assert!(decode(&bytes, &other_secret).unwrap_err().starts_with("foreign"));
        let other = setup(5);
        let moved = Identity::new(&other, &[3; 32]);
        assert!(decode(&bytes, &moved).unwrap_err().starts_with("mismatched"));
        let future = encode(&snap, Kind::Stop, &identity, 0);
        let future = String::from_utf8(future).unwrap().replacen("\"version\":1", "\"version\":9", 1);
        let body = &future[..future.rfind("\nsha256 ").unwrap()];
        let resealed = format!("{body}\nsha256 {}\n", hex(&Sha256::digest(body.as_bytes())));
        assert!(decode(resealed.as_bytes(), &identity).unwrap_err().contains("version 9"));
    }

    #[test]
    fn idempotency_keys_round_trip_and_a_file_without_them_still_loads() {
        let mut g = setup(4);
        let p = g.pool_id("p").unwrap();
        let key = IdemKey::new(77, b"order 42").unwrap();
        assert!(g.acquire_keyed(p, &key, 0, 0, 0).is_ok());
        g.acquire(p, 0, 0, 0);
        let snap = g.export(5);
        let identity = Identity::new(&g, &[3; 32]);
        let bytes = encode(&snap, Kind::Stop, &identity, 0);
        assert!(String::from_utf8_lossy(&bytes).contains(r#""idempotencyKeys":[[0,77,"order 42"]]"#));
        assert_eq!(decode(&bytes, &identity).unwrap().1, snap);

        // A file as a build without keys wrote it: the leases load, keyless.
        let mut keyless = snap.clone();
        keyless.leases.iter_mut().for_each(|l| l.key = None);
        let old = encode(&keyless, Kind::Stop, &identity, 0);
        assert!(!String::from_utf8_lossy(&old).contains("idempotencyKeys"));
        assert_eq!(decode(&old, &identity).unwrap().1, keyless);
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
