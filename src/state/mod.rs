//! What the server keeps on disk between runs (SPEC §11): the slot secret,
//! and the snapshot a graceful stop (or the periodic timer) leaves for the
//! next process.
//!
//! Only the reactor's start-up, timer and stop paths come here; nothing on
//! the request path reads or writes a file. A periodic snapshot costs the
//! loop one copy of the lease table (`Governor::export`); encoding, writing
//! and syncing it happen on a thread of their own.

pub mod secret;
pub mod snapshot;
pub mod terms;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

use log::{error, info, warn};

use crate::config::Config;
use crate::governor::snapshot::{HeldLease, Taken};
use crate::governor::Governor;
use crate::time::{Epoch, Ms, Now};
use snapshot::{Identity, Kind};
use terms::Terms;

/// What a stop snapshot takes per held slot, from the copy of the lease
/// table to the sync: 0.15–1.2 µs measured with the release build, the
/// most on a loaded machine whose disk is busy (the fsync of 18 MB took
/// 16–145 ms). The stop leaves its snapshot that much room.
const STOP_SNAPSHOT_NS_PER_SLOT: u64 = 1000;

/// What a stop snapshot takes per pool, held slots or not: its learned
/// state and counters, copied and written as JSON into the header (about
/// 880 bytes each). 6–10 µs measured with the release build with 20 000
/// and 40 000 pools (150–240 ms), 27 µs on a loaded machine; a stop that
/// left it no room took 1.05 s with 20 000 pools.
const STOP_SNAPSHOT_NS_PER_POOL: u64 = 10_000;

/// The state files of a running server.
pub struct Persistence {
    /// `None`: no snapshot is written (the embedded demo, `stateFile: null`).
    path: Option<PathBuf>,
    /// `stateFile` as named, when that is a symbolic link to `path`.
    link: Option<PathBuf>,
    interval_ms: Option<u64>,
    /// The secret's file as the configuration named it at start, and which
    /// file that was (device and inode).
    secret_path: Option<PathBuf>,
    secret_file: Option<(u64, u64)>,
    identity: Identity,
    /// The periodic snapshot being written, if one is; it hands its lease
    /// buffer back for the next one.
    writer: Option<JoinHandle<Vec<HeldLease>>>,
    /// The state file this process restored and could not remove: until a
    /// snapshot replaces it, a later start would restore it again.
    unremoved: Option<PathBuf>,
    /// The lock on `<stateFile>.lock`, held while this process writes
    /// there: another process with the same `stateFile` would write over
    /// its snapshots, and restore one of them as its own. It also holds the
    /// terms a crash of this process must wait for (`terms`).
    lock: Option<std::fs::File>,
    terms: Terms,
    /// After a start without a usable stop snapshot, the terms the processes
    /// before this one left (closed at the start): the leases of a pool this
    /// process was started without may still be alive, and a reload that
    /// names it opens its window for them (`window_for_added`).
    before: Option<Terms>,
    /// Places monotonic instants in Unix time, for `terms`.
    epoch: Epoch,
}

/// The lock on a configuration's `<stateFile>.lock` (none without a state
/// file), taken at start before the server creates anything: a start that
/// finds the state file in use by another instance leaves no slot secret,
/// access log or other file behind it.
pub struct StateLock(Option<std::fs::File>);

impl StateLock {
    /// Takes the lock of `config`'s state file, read from `config_path`.
    pub fn take(config: &Config, config_path: Option<&Path>) -> Result<StateLock, String> {
        state_path(config, config_path).as_deref().map(lock).transpose().map(StateLock)
    }
}

/// Sets up the governor's identity from the slot secret, then restores the
/// snapshot when there is a usable one. Without one, a start that found an
/// existing secret opens the re-adoption window; a first start has nothing
/// to re-adopt. `now` is monotonic ms, `epoch` places it in Unix time.
/// `lock` is the state file's, taken before (`StateLock::take`).
pub fn start<T: Copy>(
    config: &Config,
    config_path: Option<&Path>,
    lock: StateLock,
    gov: &mut Governor<T>,
    now: Ms,
    epoch: Epoch,
) -> Result<Persistence, String> {
    if let Some(config_path) = config_path {
        check_files(config, config_path)?;
    }
    let secret_path = config_path.map(|path| secret::path_beside(path, &config.slot_secret_file));
    let secret = match &secret_path {
        Some(path) => secret::load_or_create(path)?,
        None => secret::ephemeral(),
    };
    gov.set_identity(&secret.bytes, epoch);
    let path = state_path(config, config_path);
    let link = state_name(config, config_path).filter(|named| Some(named) != path.as_ref());
    let StateLock(mut lock) = lock;
    // What the last process here left: the terms its leases may still have.
    let left = match (lock.as_mut().map(Terms::read), &path) {
        (Some(Ok(left)), _) => left,
        (Some(Err(why)), Some(path)) => {
            warn!(
                "the lease terms left in {} cannot be read: {why}; a re-adoption window lasts each pool's termMs",
                lock_path(path).display()
            );
            Terms::default()
        }
        _ => Terms::default(),
    };
    let mut persistence = Persistence {
        path,
        link,
        interval_ms: config.snapshot_interval_ms,
        secret_file: secret_path.as_deref().and_then(file_id),
        secret_path,
        identity: Identity::new(gov, &secret.bytes),
        writer: None,
        unremoved: None,
        lock,
        terms: Terms::default(),
        before: None,
        epoch,
    };
    let window = match persistence.restore(gov, now, config_path) {
        Ok(Some(Kind::Stop)) => None,
        // Grants made after a periodic snapshot are unknown.
        Ok(Some(Kind::Periodic)) => Some("the snapshot is periodic".to_string()),
        // A first start has nothing to re-adopt. One that created the secret
        // but finds the terms of a process that ran here (the secret lost
        // since, no state file left) is not a first start: as below.
        Ok(None) if secret.created && !left.any_in_force(epoch.wall(now).0) => None,
        Ok(None) if secret.created => Some("the slot secret is new, but a process ran here".to_string()),
        Ok(None) => Some("no snapshot of the last stop".to_string()),
        // A state file, even one refused, says a process ran here before: a
        // new secret means the old one was lost, and the holders of its slots
        // get one term to renew, be told `404` and stop before new grants.
        Err(why) => Some(why),
    };
    let now_unix = epoch.wall(now).0;
    if let Some(why) = window {
        let mut before = left.clone();
        before.close_open(now_unix);
        persistence.before = Some(before);
        gov.open_recovery_window_for(now, |pool| left.window(pool, now_unix));
        warn!("{why}: re-adoption window of one termMs per pool");
        for (pool, settings) in &config.pools {
            if let Some(window) = left.window(pool, now_unix).filter(|&t| t > settings.term_ms) {
                warn!("pool `{pool}`: its window lasts {window} ms, for leases granted before termMs was lowered");
            }
        }
    }
    // A window a stop snapshot carried over from a start after a crash
    // waits for the same holders as the window opened just now.
    for (pool, settings) in &config.pools {
        let holders = left.holders(pool, now_unix).filter(|&n| n > settings.concurrency);
        if let Some(holders) = holders.filter(|&n| gov.expect_holders(pool, n, now)) {
            warn!("pool `{pool}`: its window re-adopts up to {holders} slots, granted before concurrency was lowered");
        }
    }
    let restored: BTreeMap<String, (u64, u64)> =
        gov.held_terms().into_iter().map(|(pool, (term, until))| (pool, (term, epoch.wall(until).0))).collect();
    persistence.terms = left.carried(now_unix, &restored, config);
    persistence.write_terms();
    Ok(persistence)
}

impl Persistence {
    /// Loads and removes the snapshot (it is used once). `Ok(None)`: there is none.
    fn restore<T: Copy>(
        &mut self,
        gov: &mut Governor<T>,
        now: Ms,
        config_path: Option<&Path>,
    ) -> Result<Option<Kind>, String> {
        let Some(path) = self.path.clone() else {
            return Ok(None);
        };
        let path = &path;
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(self.set_aside(
                    path,
                    config_path,
                    format!("state file {} unreadable ({e})", path.display()),
                ))
            }
        };
        let refused =
            |why: String| self.set_aside(path, config_path, format!("state file {} refused ({why})", path.display()));
        let started = Instant::now();
        let (kind, snap) = match snapshot::decode_any_config(&bytes, &self.identity).map_err(refused)? {
            (kind, snap, true) => (kind, snap),
            (_, snap, false) => {
                let why = match gov.await_refused_holders(&snap, now) {
                    0 => snapshot::MISMATCHED.to_string(),
                    pools => format!(
                        "{}; the window of {pools} pool(s) lasts until the last lease deadline it holds",
                        snapshot::MISMATCHED
                    ),
                };
                return Err(refused(why));
            }
        };
        let taken = match kind {
            Kind::Stop => Taken::AtStop,
            Kind::Periodic => Taken::WhileRunning,
        };
        let restored = gov.import(&snap, taken, now).map_err(|e| refused(format!("mismatched: {e}")))?;
        if let Err(e) = snapshot::remove(path) {
            self.unremoved = Some(path.clone());
            return Err(format!(
                "state file {} loaded but not removed ({e}); remove it before a later start, which would restore it again",
                path.display()
            ));
        }
        if restored.retired > 0 {
            warn!(
                "{} of the restored slots belong to pools no longer configured (removed by a reload before the stop): \
                 they count until their lease deadlines, and a reload that names their pool again lets their holders renew",
                restored.retired
            );
        }
        info!(
            "restored the {} snapshot {} in {} ms: {} slots held ({} under an idempotency key), {} expired while stopped and reclaimed",
            if kind == Kind::Stop { "stop" } else { "periodic" },
            path.display(),
            started.elapsed().as_millis(),
            restored.held,
            restored.keys,
            restored.reclaimed
        );
        Ok(Some(kind))
    }

    /// Moves a refused snapshot out of the way (to `<stateFile>.refused`,
    /// kept for a look), so no later start can load it: the process that
    /// refused it grants slots it does not know of, and a crash of that
    /// process followed by a start that accepts the file again (the old
    /// configuration rolled back, the old secret put back) would restore it
    /// with no window. Returns `why`, completed with where the file went.
    fn set_aside(&self, path: &Path, config_path: Option<&Path>, why: String) -> String {
        let aside = refused_path(path);
        // Only a file: a directory or a device named as the state file is
        // the operator's (start-up refuses them; this guards the rename).
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            return why;
        }
        let free = !self.secret_path.as_deref().into_iter().chain(config_path).any(|other| same_file(&aside, other));
        let moved = if free { snapshot::rename(path, &aside) } else { snapshot::remove(path) };
        match moved {
            Ok(()) if free => format!("{why}, moved to {}", aside.display()),
            Ok(()) => format!("{why}, removed"),
            Err(e) => format!("{why}, and it could not be moved out of the way ({e}): remove it before a later start"),
        }
    }

    /// How often to snapshot while running, if at all.
    pub fn interval_ms(&self) -> Option<u64> {
        self.interval_ms.filter(|_| self.path.is_some())
    }

    /// What a reload to `config` must not do: send snapshots over the slot
    /// secret in use or over the configuration file (however spelled), or to
    /// a new `stateFile` no snapshot can be written to (start-up refuses it
    /// too; applied, it would lose the next stop's snapshot).
    pub fn check_reload(&self, config: &Config, config_path: &Path) -> Result<(), String> {
        // A new slot secret is read at the next start: one that start would
        // refuse is refused now, not found out then.
        let secret_path = secret::path_beside(config_path, &config.slot_secret_file);
        if self.new_secret(&secret_path) {
            secret::check(&secret_path)?;
        }
        let kept = self.secret_path.iter().chain([&secret_path]).map(|p| (p.as_path(), "the slot secret's file"));
        access_log_apart(config, config_path, kept)?;
        let Some(path) = state_path(config, Some(config_path)) else {
            return Ok(());
        };
        leads_to_a_file(&path)?;
        let secret = self.secret_path.as_deref().map(|p| (p, "the slot secret's file"));
        let read = files_read(config);
        let read = read.iter().map(|(p, what)| (*p, what.as_str()));
        state_file_apart(&path, secret.into_iter().chain([(config_path, "the configuration file")]).chain(read))?;
        if self.holds_lock_of(&path) {
            return Ok(());
        }
        snapshot::check_writable(&path)
            .map_err(|e| format!("stateFile: cannot write a snapshot to {} ({e})", path.display()))?;
        lock(&path).map(drop)
    }

    /// A reload applied `config`: the next snapshot is of its pools, goes to
    /// its `stateFile` and, when periodic, at its `snapshotIntervalMs`. A
    /// snapshot being written finishes at the old path. Returns whether the
    /// periodic timer must be armed again (`interval_ms` changed). The slot
    /// secret stays the one read at start: the ids held now are signed with it.
    ///
    /// Of the pools it `added` (this process never had them), one whose
    /// leases the processes before this one may have left alive (a start
    /// after a crash that did not name it) opens its re-adoption window, as
    /// the start would have: its old holders come back before anything is
    /// granted in their places.
    pub fn reconfigured<T: Copy>(
        &mut self,
        gov: &mut Governor<T>,
        config: &Config,
        config_path: &Path,
        added: &[String],
        now: Now,
    ) -> bool {
        for pool in added {
            let Some((window, holders)) = self.window_for_added(pool, now.wall().0) else {
                continue;
            };
            if gov.open_recovery_window_of(pool, window, now.ms) {
                warn!("reload: pool `{pool}` may have slots held under a process before this one: re-adoption window of {window} ms");
            }
            let concurrency = config.pools.get(pool).map_or(0, |p| p.concurrency);
            if holders > concurrency && gov.expect_holders(pool, holders, now.ms) {
                warn!(
                    "pool `{pool}`: its window re-adopts up to {holders} slots, granted before concurrency was lowered"
                );
            }
        }
        self.identity.reconfigured(gov);
        self.terms.reconfigured(config, now.wall().0);
        let secret_path = secret::path_beside(config_path, &config.slot_secret_file);
        if self.new_secret(&secret_path) {
            warn!("reload: a new `slotSecretFile` takes effect at the next restart (held slots are signed with the current one)");
        }
        let path = state_path(config, Some(config_path));
        // The file whose lock is held, however spelled (`./nthpool.state`, an
        // absolute path) or wherever it is now, keeps its lock: taken again,
        // it would be found in use.
        let moved = match &path {
            Some(new) => !self.holds_lock_of(new),
            None => self.path.is_some(),
        };
        if moved {
            // `check_reload` found it free; the old one is let go.
            self.lock = path.as_deref().and_then(|p| lock(p).map_err(|e| warn!("reload: {e}")).ok());
            match &path {
                Some(p) => match snapshot::check_writable(p) {
                    Ok(()) => info!("reload: snapshots go to {} from the next one", p.display()),
                    Err(e) => warn!(
                        "reload: snapshots go to {} from the next one, but it cannot be written ({e})",
                        p.display()
                    ),
                },
                None => info!("reload: `stateFile` is null, no snapshot is written from now on"),
            }
        }
        self.link = state_name(config, Some(config_path)).filter(|named| Some(named) != path.as_ref());
        self.path = path;
        self.write_terms();
        let before = self.interval_ms();
        self.interval_ms = config.snapshot_interval_ms;
        before != self.interval_ms()
    }

    /// A reload names `pool`, which this process never had: when it started
    /// without a usable stop snapshot and the processes before it granted
    /// leases of `pool` that may still be alive at `now_unix`, how long its
    /// re-adoption window must last for their holders to come back, and how
    /// many slots they may number (the limit they were granted under, 0
    /// where unknown). `None`: none can be alive, the pool starts afresh.
    pub fn window_for_added(&self, pool: &str, now_unix: u64) -> Option<(u64, u32)> {
        let before = self.before.as_ref()?;
        let window = before.window(pool, now_unix)?;
        Some((window, before.holders(pool, now_unix).unwrap_or(0)))
    }

    /// Whether `path`'s lock file is the one this process holds: the same
    /// file by device and inode, not by name (a name may now lead elsewhere,
    /// through a symlink changed since, and the file may have moved).
    fn holds_lock_of(&self, path: &Path) -> bool {
        let held = self.lock.as_ref().and_then(|f| f.metadata().ok()).as_ref().map(identity_of);
        held.is_some() && file_id(&lock_path(path)) == held
    }

    /// Whether a reload names a slot secret other than the file read at
    /// start (never for the embedded configuration, which has none).
    fn new_secret(&self, path: &Path) -> bool {
        self.secret_path.is_some() && (self.secret_file.is_none() || file_id(path) != self.secret_file)
    }

    /// Writes the terms a crash must wait for into the lock file.
    fn write_terms(&mut self) {
        if let Some(file) = &mut self.lock {
            if let Err(e) = self.terms.write(file) {
                warn!("cannot write the lease terms to the state file's lock ({e}): after a crash, each pool's window is its termMs");
            }
        }
    }

    /// The periodic snapshot: the loop copies the state, a thread writes it.
    /// Skipped while the previous one is still being written.
    pub fn write_periodic<T: Copy>(&mut self, gov: &Governor<T>, now: Ms) {
        let Some(path) = self.path.clone() else {
            return;
        };
        if self.writer.as_ref().is_some_and(|w| !w.is_finished()) {
            warn!("periodic snapshot skipped: the previous one is still being written");
            return;
        }
        let spare = self.writer.take().map(joined).unwrap_or_default();
        let started = Instant::now();
        let snap = gov.export_into(now, spare);
        let copied = started.elapsed();
        let identity = self.identity.clone();
        self.writer = Some(std::thread::spawn(move || {
            let started = Instant::now();
            let bytes = snapshot::encode(&snap, Kind::Periodic, &identity);
            match snapshot::write_atomic(&path, &bytes) {
                Ok(()) => info!(
                    "periodic snapshot of {} slots: {} µs on the event loop, {} ms writing {} bytes beside it",
                    snap.leases.len(),
                    copied.as_micros(),
                    started.elapsed().as_millis(),
                    bytes.len()
                ),
                Err(e) => warn!("periodic snapshot to {} failed: {e}", path.display()),
            }
            snap.leases
        }));
    }

    /// How long the stop's snapshot of `held` slots in `pools` pools is
    /// expected to take, in ms: 0 when no snapshot is written.
    pub fn stop_snapshot_ms(&self, held: usize, pools: usize) -> u64 {
        match self.path {
            Some(_) => expected_stop_snapshot_ms(held, pools),
            None => 0,
        }
    }

    /// The snapshot of a graceful stop, written before the process exits.
    pub fn write_stop<T: Copy>(&mut self, gov: &Governor<T>, now: Ms) {
        if let Some(writer) = self.writer.take() {
            joined(writer);
        }
        self.terms.close_open(self.epoch.wall(now).0);
        self.write_terms();
        let Some(path) = &self.path else {
            return;
        };
        if let Some(link) = self.link.as_ref().filter(|link| through_links((*link).clone()) != *path) {
            warn!(
                "stateFile {} now leads elsewhere: the stop snapshot goes to {}, whose lock this process holds \
                 (repoint the link with a reload, or the next start there takes the crash path)",
                link.display(),
                path.display()
            );
        }
        let started = Instant::now();
        let snap = gov.export(now);
        let copied = started.elapsed();
        let bytes = snapshot::encode(&snap, Kind::Stop, &self.identity);
        let encoded = started.elapsed();
        match snapshot::write_atomic(path, &bytes) {
            Ok(()) => info!(
                "stop snapshot of {} slots ({} bytes) written to {} in {} ms (copy {} ms, encode {} ms, write and sync {} ms)",
                snap.leases.len(),
                bytes.len(),
                path.display(),
                started.elapsed().as_millis(),
                copied.as_millis(),
                (encoded - copied).as_millis(),
                (started.elapsed() - encoded).as_millis()
            ),
            Err(e) if self.unremoved.as_ref() == Some(path) => error!(
                "stop snapshot to {} failed ({e}); the file may still hold the snapshot this process restored \
                 at its start, which the next start would restore as current: remove it before then",
                path.display()
            ),
            Err(e) => warn!("stop snapshot to {} failed ({e}): the next start takes the crash path", path.display()),
        }
    }
}

/// How long a stop snapshot of `held` slots in `pools` pools is expected
/// to take, in ms.
fn expected_stop_snapshot_ms(held: usize, pools: usize) -> u64 {
    (held as u64 * STOP_SNAPSHOT_NS_PER_SLOT + pools as u64 * STOP_SNAPSHOT_NS_PER_POOL) / 1_000_000
}

/// The lease buffer a periodic snapshot's thread hands back; a thread that
/// panicked wrote no snapshot, and says so.
fn joined(writer: JoinHandle<Vec<HeldLease>>) -> Vec<HeldLease> {
    writer.join().unwrap_or_else(|_| {
        error!("the periodic snapshot's thread panicked: that snapshot was not written");
        Vec::new()
    })
}

/// What start-up would find wrong with the files of `config` (read from
/// `config_path`), found out before anything is written: the state file,
/// the slot secret and the configuration must be three files (a snapshot
/// written over the secret would lose every slot id it signed); an existing
/// secret holds exactly 32 bytes; a snapshot can be written where the state
/// file goes (rather than failing at the stop whose snapshot it would lose).
/// Start-up and `--check-config` both run it.
pub fn check_files(config: &Config, config_path: &Path) -> Result<(), String> {
    let secret_path = secret::path_beside(config_path, &config.slot_secret_file);
    if same_file(&secret_path, config_path) {
        return Err(format!("slotSecretFile: {} is the configuration file", secret_path.display()));
    }
    secret::check(&secret_path)?;
    access_log_apart(config, config_path, [(&*secret_path, "the slot secret's file")])?;
    let Some(path) = state_path(config, Some(config_path)) else {
        return Ok(());
    };
    leads_to_a_file(&path)?;
    let read = files_read(config);
    let kept = [(&*secret_path, "the slot secret's file"), (config_path, "the configuration file")];
    state_file_apart(&path, kept.into_iter().chain(read.iter().map(|(p, what)| (*p, what.as_str()))))?;
    snapshot::check_writable(&path)
        .map_err(|e| format!("stateFile: cannot write a snapshot to {} ({e})", path.display()))
}

/// Takes the lock on `<path>.lock` (created if need be) for as long as the
/// returned file is open; refused when another process holds it.
fn lock(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock_path = lock_path(path);
    let cannot = |e: &dyn std::fmt::Display| format!("stateFile: cannot lock {} ({e})", lock_path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| cannot(&e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "stateFile: {} is in use by another running nthpool (it holds {}); give each instance its own stateFile",
            path.display(),
            lock_path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(cannot(&e)),
    }
}

/// A file's device and inode: which file a path leads to now.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().as_ref().map(identity_of)
}

fn identity_of(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// `<path>.refused`: where a refused snapshot at `path` is moved (`set_aside`).
fn refused_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".refused");
    PathBuf::from(name)
}

/// `<path>.lock`: the lock beside a state file `path`.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The files `config` reads (a JWKS, a CA bundle, a `${file:PATH}` value),
/// each said as what it is. The server's own files are kept apart from them:
/// a snapshot renamed over one, or log lines appended to it, would leave the
/// next start unable to read it (and a start that finds one where its state
/// file goes moves it aside as a refused snapshot).
fn files_read(config: &Config) -> Vec<(&Path, String)> {
    config.files_read().into_iter().map(|(field, path)| (path, format!("the file of {field}"))).collect()
}

/// Refuses a state file `path` that is one of `others` (each named by what it is).
fn state_file_apart<'a>(path: &Path, others: impl IntoIterator<Item = (&'a Path, &'a str)>) -> Result<(), String> {
    match others.into_iter().find(|(other, _)| same_file(path, other)) {
        Some((_, what)) => Err(format!("stateFile: {} is {what} too", path.display())),
        None => Ok(()),
    }
}

/// Refuses an access log (opened as written, from the working directory)
/// that is a file the server keeps: the configuration, the state file, its
/// lock (which holds the terms record) or one of `kept`. Its lines appended
/// to any of them would corrupt it, and a slot secret or a snapshot that
/// no longer reads would cost the next start its slots. Nor may it be the
/// snapshot's temporary file, or where a refused snapshot is moved: each
/// snapshot (each refusal) would replace it, the log lost.
fn access_log_apart<'a>(
    config: &Config,
    config_path: &Path,
    kept: impl IntoIterator<Item = (&'a Path, &'a str)>,
) -> Result<(), String> {
    let Some(log) = config.access_log.as_deref().filter(|&p| p != "-").map(Path::new) else {
        return Ok(());
    };
    let state = state_path(config, Some(config_path));
    let lock = state.as_deref().map(lock_path);
    let writing = state.as_deref().map(snapshot::temporary);
    let aside = state.as_deref().map(refused_path);
    let mut files: Vec<(&Path, &str)> = kept.into_iter().collect();
    files.push((config_path, "the configuration file"));
    files.extend(state.as_deref().map(|p| (p, "the state file")));
    files.extend(lock.as_deref().map(|p| (p, "the state file's lock")));
    files.extend(writing.as_deref().map(|p| (p, "the temporary file each snapshot is written to")));
    files.extend(aside.as_deref().map(|p| (p, "where a refused snapshot is moved")));
    let read = files_read(config);
    files.extend(read.iter().map(|(p, what)| (*p, what.as_str())));
    match files.into_iter().find(|(other, _)| same_file(log, other)) {
        Some((_, what)) => Err(format!("accessLog: {} is {what}; log to a file of its own", log.display())),
        None => Ok(()),
    }
}

/// Whether two paths name one file: by device and inode when both exist (a
/// hard link is the file it links), else compared by their directories as
/// the file system resolves them (`./a` and `a`, a symlinked directory), or
/// as written when a directory does not exist.
fn same_file(a: &Path, b: &Path) -> bool {
    if file_id(a).is_some_and(|id| file_id(b) == Some(id)) {
        return true;
    }
    let resolved = |p: &Path| {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.components().collect());
        // The file itself, when it is a symlink, resolved too.
        std::fs::canonicalize(p).unwrap_or_else(|_| dir.join(p.file_name().unwrap_or_default()))
    };
    resolved(a) == resolved(b)
}

/// Where `config` keeps its snapshot: beside the configuration file; none
/// for the embedded configuration or `stateFile: null`. A name that is a
/// symbolic link stands for the file it leads to: the snapshot is renamed
/// over it, removed once used and locked by a file named after it, and
/// each must reach that file, not replace or unlink the link (nor take a
/// lock another process naming the file itself does not see).
fn state_path(config: &Config, config_path: Option<&Path>) -> Option<PathBuf> {
    state_name(config, config_path).map(through_links)
}

/// `stateFile` as the configuration names it, beside its file.
fn state_name(config: &Config, config_path: Option<&Path>) -> Option<PathBuf> {
    config_path.zip(config.state_file.as_deref()).map(|(c, f)| secret::path_beside(c, f))
}

/// Refuses a state file whose links lead nowhere but to links (a loop).
fn leads_to_a_file(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            Err(format!("stateFile: {} is a loop of symbolic links (or a chain of more than 40)", path.display()))
        }
        _ => Ok(()),
    }
}

/// `path` with the symbolic links it names followed, a link to a link
/// included (up to 40, the kernel's own bound), its directories as they are.
fn through_links(mut path: PathBuf) -> PathBuf {
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        // A relative target is relative to the link's directory; an absolute one replaces it.
        path = path.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
    }
    path
}

/// 64 random bits in hex, for a file beside one the server keeps that no
/// other process names the same (a process id is not unique across
/// containers sharing a volume: each may run as pid 1).
fn random_hex() -> String {
    let mut random = [0u8; 8];
    os_random(&mut random);
    format!("{:016x}", u64::from_ne_bytes(random))
}

/// The OS random source: the slot secret's bytes, and the governor's
/// (`governor::Entropy::from_fn(state::os_random)`).
pub fn os_random(buf: &mut [u8]) {
    getrandom::getrandom(buf).expect("the OS random source is available");
}

#[cfg(test)]
mod tests {
    use super::expected_stop_snapshot_ms;

    #[test]
    fn a_stop_snapshot_is_expected_to_take_time_for_its_pools_as_for_its_slots() {
        assert_eq!(expected_stop_snapshot_ms(0, 1), 0, "a small server's costs microseconds");
        assert_eq!(expected_stop_snapshot_ms(400_000, 0), 400);
        // 20 000 pools holding nothing still take a fifth of a second.
        assert_eq!(expected_stop_snapshot_ms(0, 20_000), 200);
        assert_eq!(expected_stop_snapshot_ms(100_000, 20_000), 300);
    }
}
