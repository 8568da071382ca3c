//! The slot secret: 32 random bytes that sign every `slotId`.
//!
//! Created on the first start (mode 0600, written and synced before use) and
//! read on every later one; a standby that shares the file can re-adopt the
//! slots its peer granted. A file of any other length is refused: signing
//! under a different secret would make every held slot unknown.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
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

/// What `load_or_create` would refuse at `path`, without creating it: an
/// existing file that is not exactly 32 bytes.
pub fn check(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() != SECRET_BYTES as u64 => Err(wrong_size(path, m.len())),
        _ => Ok(()),
    }
}

fn wrong_size(path: &Path, len: u64) -> String {
    format!("the slot secret {} holds {len} bytes, not {SECRET_BYTES}: refusing to sign slots under it", path.display())
}

/// Reads the secret at `path`, or creates it there if there is none.
pub fn load_or_create(path: &Path) -> Result<SlotSecret, String> {
    match File::open(path) {
        Ok(mut file) => {
            let mut bytes = [0u8; SECRET_BYTES];
            let mut rest = Vec::new();
            file.read_to_end(&mut rest).map_err(|e| format!("cannot read the slot secret {}: {e}", path.display()))?;
            if rest.len() != SECRET_BYTES {
                return Err(wrong_size(path, rest.len() as u64));
            }
            bytes.copy_from_slice(&rest);
            Ok(SlotSecret { bytes, created: false })
        }
        Err(e) if e.kind() == ErrorKind::NotFound => create(path),
        Err(e) => Err(format!("cannot open the slot secret {}: {e}", path.display())),
    }
}

fn create(path: &Path) -> Result<SlotSecret, String> {
    let fail = |e: std::io::Error| format!("cannot create the slot secret {}: {e}", path.display());
    let secret = ephemeral();
    // `create_new`: two instances starting at once cannot both write one.
    let mut file = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return load_or_create(path),
        Err(e) => return Err(fail(e)),
    };
    file.write_all(&secret.bytes).map_err(fail)?;
    file.sync_all().map_err(fail)?;
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
}
