//! The slot secret: 32 random bytes that sign every `slotId`.
//!
//! Created on the first start (mode 0600, written and synced, then linked into place) and
//! read on every later one; a standby that shares the file can re-adopt the
//! slots its peer granted. A file of any other length is refused: signing
//! under a different secret would make every held slot unknown.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const SECRET_BYTES: usize = 32;

/// The secret and whether this start created it (a first start has nothing
/// to re-adopt).
pub struct SlotSecret {
    pub bytes: [u8; SECRET_BYTES],
    pub created: bool,
}

/// Where the secret lives: `file` as configured, relative to the
/// configuration file's directory.
pub fn path_beside(config_path: &Path, file: &str) -> PathBuf {
    config_path.parent().unwrap_or(Path::new(".")).join(file)
}

/// A secret kept in memory only (the embedded demo): every start is a first start.
pub fn ephemeral() -> SlotSecret {
    let mut bytes = [0u8; SECRET_BYTES];
    super::os_random(&mut bytes);
    SlotSecret { bytes, created: true }
}

/// What `load_or_create` would refuse at `path`, without creating it: a
/// directory, a link to nothing, an existing file that is not exactly 32
/// bytes or cannot be opened (another user's, say), and where there is none,
/// a place one cannot be created in (a missing or read-only directory: a
/// file is created there under `create`'s temporary name and removed again).
pub fn check(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(is_directory(path)),
        Ok(m) if m.len() != SECRET_BYTES as u64 => Err(wrong_size(path, m.len())),
        Ok(_) => File::open(path).map(drop).map_err(|e| cannot_open(path, e)),
        Err(e) if e.kind() == ErrorKind::NotFound && std::fs::symlink_metadata(path).is_ok() => Err(dangling(path)),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let tmp = temporary(path);
            let probe = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp);
            probe.and_then(|_| std::fs::remove_file(&tmp)).map_err(|e| cannot_create(path, e))
        }
        Err(e) => Err(cannot_open(path, e)),
    }
}

fn cannot_create(path: &Path, e: std::io::Error) -> String {
    format!("slotSecretFile: cannot create the slot secret {}: {e}", path.display())
}

/// The name a new secret is written under before it is linked to `path`:
/// one no other creator uses at the same time (`random_hex`).
fn temporary(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", super::random_hex()));
    PathBuf::from(tmp)
}

fn is_directory(path: &Path) -> String {
    format!("slotSecretFile: the slot secret {} is a directory, not a file of {SECRET_BYTES} bytes", path.display())
}

fn dangling(path: &Path) -> String {
    format!(
        "slotSecretFile: the slot secret {} is a symbolic link to nothing: point it at a file, or remove it to have one created",
        path.display()
    )
}

fn wrong_size(path: &Path, len: u64) -> String {
    format!(
        "slotSecretFile: the slot secret {} holds {len} bytes, not {SECRET_BYTES}: refusing to sign slots under it",
        path.display()
    )
}

/// Reads the secret at `path`, or creates it there if there is none.
pub fn load_or_create(path: &Path) -> Result<SlotSecret, String> {
    match File::open(path) {
        Ok(file) => read(path, file),
        Err(e) if e.kind() == ErrorKind::NotFound => create(path),
        Err(e) => Err(cannot_open(path, e)),
    }
}

fn cannot_open(path: &Path, e: std::io::Error) -> String {
    format!("slotSecretFile: cannot open the slot secret {}: {e}", path.display())
}

/// The secret in `file`, opened at `path`.
fn read(path: &Path, mut file: File) -> Result<SlotSecret, String> {
    let metadata = file.metadata();
    if metadata.as_ref().is_ok_and(|m| m.is_dir()) {
        return Err(is_directory(path));
    }
    if let Ok(mode) = metadata.map(|m| m.permissions().mode() & 0o777) {
        if mode & 0o077 != 0 {
            // Whoever reads it can forge slot ids that re-adopt after a crash.
            log::warn!("the slot secret {} can be read by others (mode {mode:o}): `chmod 600` it", path.display());
        }
    }
    let mut bytes = [0u8; SECRET_BYTES];
    let mut rest = Vec::new();
    file.read_to_end(&mut rest)
        .map_err(|e| format!("slotSecretFile: cannot read the slot secret {}: {e}", path.display()))?;
    if rest.len() != SECRET_BYTES {
        return Err(wrong_size(path, rest.len() as u64));
    }
    bytes.copy_from_slice(&rest);
    Ok(SlotSecret { bytes, created: false })
}

fn create(path: &Path) -> Result<SlotSecret, String> {
    let fail = |e: std::io::Error| cannot_create(path, e);
    let secret = ephemeral();
    // Written and synced under a name of this process's own, then linked to
    // `path`: the secret appears there whole or not at all, so an instance
    // that loses the race to create it (or a start after a crash in the
    // middle of one) never reads a partial file. The link fails if `path`
    // exists: two instances starting at once cannot both create one.
    let tmp = temporary(path);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| file.write_all(&secret.bytes).and_then(|()| file.sync_all()));
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        // Another instance created it first: read theirs. Once only: a
        // name that exists but opens as nothing is a link to nothing.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            return match File::open(path) {
                Ok(file) => read(path, file),
                Err(e) if e.kind() == ErrorKind::NotFound => Err(dangling(path)),
                Err(e) => Err(cannot_open(path, e)),
            };
        }
        Err(e) => return Err(fail(e)),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_with_mode_0600_then_read_back() {
        let dir = std::env::temp_dir().join(format!("nthpool-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nthpool.secret");
        let _ = std::fs::remove_file(&path);
        let first = load_or_create(&path).unwrap();
        assert!(first.created);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = load_or_create(&path).unwrap();
        assert!(!again.created);
        assert_eq!(again.bytes, first.bytes);
        std::fs::write(&path, b"short").unwrap();
        assert!(load_or_create(&path).err().unwrap().contains("5 bytes"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_link_to_nothing_or_a_directory_is_refused_with_its_cause() {
        let dir = std::env::temp_dir().join(format!("nthpool-secret-odd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("link.secret");
        std::os::unix::fs::symlink(dir.join("missing/x"), &link).unwrap();
        for e in [load_or_create(&link).err().unwrap(), check(&link).err().unwrap()] {
            assert!(e.contains("symbolic link to nothing"), "{e}");
        }
        let sub = dir.join("sub.secret");
        std::fs::create_dir(&sub).unwrap();
        for e in [load_or_create(&sub).err().unwrap(), check(&sub).err().unwrap()] {
            assert!(e.contains("is a directory"), "{e}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file is left behind: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_secret_that_could_not_be_created_is_found_out_before_start_up() {
        let dir = std::env::temp_dir().join(format!("nthpool-secret-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let e = check(&dir.join("missing/nthpool.secret")).unwrap_err();
        assert!(e.starts_with("slotSecretFile: cannot create the slot secret"), "{e}");
        assert_eq!(load_or_create(&dir.join("missing/nthpool.secret")).err(), Some(e));
        let path = dir.join("nthpool.secret");
        check(&path).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the check creates nothing it leaves");
        load_or_create(&path).unwrap();
        check(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn instances_starting_at_once_all_read_the_one_secret_whole() {
        // The secret appears at its path only once it holds its 32 bytes: an
        // instance that loses the race to create it never reads a partial file
        // (nor would a start after a crash in the middle of a create).
        let dir = std::env::temp_dir().join(format!("nthpool-secret-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..200 {
            let path = dir.join(format!("{round}.secret"));
            let start = std::sync::Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        load_or_create(&path)
                    })
                })
                .collect();
            let secrets: Vec<SlotSecret> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
            assert_eq!(secrets.iter().filter(|s| s.created).count(), 1, "round {round}");
            assert!(secrets.iter().all(|s| s.bytes == secrets[0].bytes), "round {round}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 200, "no temporary file is left behind: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
