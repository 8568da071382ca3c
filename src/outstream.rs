//! Standard output and standard error, written without blocking the event
//! loop and without changing how anything else writes to them.
//!
//! `O_NONBLOCK` belongs to an open file description, not to a descriptor:
//! set on standard output, it is set on standard error too whenever both
//! were opened once and shared (`2>&1 | shipper`, systemd's journal), so
//! the logger's lines failed while the server ran and, the mode set back at
//! the stop, blocked it on a stalled reader. A `Stream` has a description of
//! its own instead: a pipe or a terminal is opened again through
//! `/proc/self/fd`, a socket is written with `MSG_DONTWAIT`. Anything else
//! (a regular file, which the flag would not change) is written as it is.
//!
//! The server's own log (what `log` macros say, through `env_logger`) goes
//! through `StderrLog`: a line a slow reader cannot take now waits in a
//! bounded buffer the reactor writes out each turn, instead of stopping the
//! event loop.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use mio::unix::pipe::Sender;

/// An inherited output stream, written without blocking.
pub enum Stream {
    /// A pipe or a terminal, opened again: its own description, non-blocking.
    Own(Sender),
    /// A socket: every write says `MSG_DONTWAIT`.
    Socket(OwnedFd),
    /// Anything else (a regular file above all), written as it is.
    Shared(File),
}

impl Stream {
    pub fn stdout() -> std::io::Result<(Stream, Option<String>)> {
        Stream::open(std::io::stdout().as_fd(), "/proc/self/fd/1")
    }

    pub fn stderr() -> std::io::Result<(Stream, Option<String>)> {
        Stream::open(std::io::stderr().as_fd(), "/proc/self/fd/2")
    }

    /// The stream on `fd`, which `proc_path` names; with a warning to give
    /// when it could not be made non-blocking.
    fn open(fd: BorrowedFd, proc_path: &str) -> std::io::Result<(Stream, Option<String>)> {
        let dup = File::from(fd.try_clone_to_owned()?);
        let kind = dup.metadata()?.file_type();
        if kind.is_socket() {
            return Ok((Stream::Socket(dup.into()), None));
        }
        if !(kind.is_fifo() || kind.is_char_device()) {
            return Ok((Stream::Shared(dup), None));
        }
        // Opened for writing only: a pipe whose reader left is `ENXIO`
        // here, and writes to the one inherited fail the same way.
        let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
        match OpenOptions::new().write(true).custom_flags(nonblock).open(proc_path) {
            Ok(own) => Ok((Stream::Own(Sender::from(OwnedFd::from(own))), None)),
            Err(e) => {
                let why =
                    format!("{proc_path} cannot be opened ({e}): written as it is, a stalled reader stalls the server");
                Ok((Stream::Shared(dup), Some(why)))
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Own(out) => out.write(buf),
            Stream::Socket(out) => {
                let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
                Ok(rustix::net::send(&*out, buf, flags)?)
            }
            Stream::Shared(out) => out.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes what `out` takes of `buf` now: the bytes written, and the error
/// that stopped it (a full pipe or socket is no error: it stops short).
pub fn write_some(mut out: impl Write, buf: &[u8]) -> (usize, Option<std::io::Error>) {
    let mut written = 0;
    while written < buf.len() {
        match out.write(&buf[written..]) {
            Ok(0) => return (written, Some(ErrorKind::WriteZero.into())),
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return (written, Some(e)),
        }
    }
    (written, None)
}

/// Above this much waiting, the server's own log lines are dropped (and
/// counted) until its reader takes some.
const MAX_PENDING: usize = 1024 * 1024;

struct Pending {
    out: Stream,
    buf: Vec<u8>,
    dropped: u64,
}

/// Standard error as `install_stderr` set it up; `None` before (or when it
/// could not be opened: then `env_logger` writes to it itself).
static STDERR: Mutex<Option<Pending>> = Mutex::new(None);
/// Lines wait in `STDERR`'s buffer: the reactor looks at this each turn.
static WAITING: AtomicBool = AtomicBool::new(false);

/// `env_logger`'s target: each line is written now if the reader takes it,
/// else kept for `flush_stderr`.
pub struct StderrLog;

impl Write for StderrLog {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut guard = STDERR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(p) = guard.as_mut() else {
            return std::io::stderr().write(line);
        };
        let written = if p.buf.is_empty() { write_some(&mut p.out, line).0 } else { 0 };
        if written < line.len() {
            if p.buf.len() + line.len() - written > MAX_PENDING && written == 0 {
                p.dropped += 1;
            } else {
                p.buf.extend_from_slice(&line[written..]);
                WAITING.store(true, Ordering::Relaxed);
            }
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sets standard error up for `StderrLog`; a warning to log once the
/// logger is up when it cannot be written without blocking.
pub fn install_stderr() -> Option<String> {
    match Stream::stderr() {
        Ok((out, warning)) => {
            *STDERR.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                Some(Pending { out, buf: Vec::new(), dropped: 0 });
            warning
        }
        Err(e) => Some(format!("standard error cannot be duplicated ({e}): written as it is")),
    }
}

/// Whether lines wait for a slow reader of standard error.
#[inline]
pub fn stderr_waiting() -> bool {
    WAITING.load(Ordering::Relaxed)
}

/// Writes what waits for standard error, as far as its reader takes it.
pub fn flush_stderr() {
    let mut guard = STDERR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(p) = guard.as_mut() else {
        return;
    };
    let (written, error) = write_some(&mut p.out, &p.buf);
    p.buf.drain(..written);
    if error.is_some() {
        // A reader that went away takes nothing more.
        p.dropped += p.buf.iter().filter(|&&c| c == b'\n').count() as u64;
        p.buf.clear();
    }
    WAITING.store(!p.buf.is_empty(), Ordering::Relaxed);
}

/// At the stop: what waits is written until `until` at most; the lines
/// lost to a stalled reader, counted, are said last if it takes that.
pub fn close_stderr(until: std::time::Instant) {
    while stderr_waiting() && std::time::Instant::now() < until {
        flush_stderr();
        if stderr_waiting() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let mut guard = STDERR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(mut p) = guard.take() else {
        return;
    };
    let lost = p.dropped + p.buf.iter().filter(|&&c| c == b'\n').count() as u64;
    if lost > 0 {
        let note = format!("nthpool: {lost} lines of this log were not taken by its reader and are lost\n");
        let _ = write_some(&mut p.out, note.as_bytes());
    }
    WAITING.store(false, Ordering::Relaxed);
}
