//! Files a configuration names besides itself (a JWKS, a CA bundle, a
//! `${file:PATH}` value), read whole at start-up and on every reload: only
//! regular files (symbolic links followed) of a bounded size, so that
//! neither a named pipe, whose `open` waits for a writer, nor a device such
//! as `/dev/zero` can stall the event loop or exhaust memory.

use std::io::{self, Read};
use std::path::Path;

/// The bytes of `path`, a regular file of at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // `metadata` does not open: a named pipe is refused without waiting.
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "it is not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        let size = match limit {
            l if l >= 1 << 20 => format!("{} MiB", l >> 20),
            l => format!("{} KiB", l >> 10),
        };
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("it is larger than {size}")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = std::env::temp_dir().join(format!("nthpool-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("small");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_bounded(&file, 10).unwrap(), b"0123456789");
        assert_eq!(read_bounded(&file, 1 << 10).unwrap().len(), 10);
        std::fs::write(&file, vec![b'x'; 2 << 10]).unwrap();
        let e = read_bounded(&file, 1 << 10).unwrap_err();
        assert_eq!(e.to_string(), "it is larger than 1 KiB");
        // A directory, a device: refused, not read.
        assert_eq!(read_bounded(&dir, 1 << 20).unwrap_err().to_string(), "it is not a regular file");
        assert_eq!(read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string(), "it is not a regular file");
        // A named pipe with no writer is refused at once (an `open` would wait).
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
        if made {
            assert_eq!(read_bounded(&fifo, 1 << 20).unwrap_err().to_string(), "it is not a regular file");
        }
        assert_eq!(read_bounded(&dir.join("missing"), 10).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
