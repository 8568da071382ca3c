//! Standard output and standard error, written without blocking while the
//! server runs.
//!
//! Owns the non-blocking mode of the two streams and the writer the
//! server's own log goes through. Non-blocking is a mode of the open file
//! description, which the process shares with the shell or supervisor that
//! started it, and which the two streams share with each other when they go
//! to one place (`2>&1`, systemd's journal): it is set by the first
//! `NonBlocking` and set back to blocking when the last one on that file
//! goes (on both streams when they are one file), so that neither the
//! access log nor the server's own lines are left writing to a stream some
//! other user made blocking again.
//!
//! The log writer never blocks the event loop: while the server serves, a
//! line a full pipe has no room for is dropped and counted, and the next
//! line that fits is preceded by one saying how many were lost. At start-up
//! and at the stop, outside the loop's turns, a line waits a while for room,
//! so a reader that reads gets every one; only a stalled reader loses them.
//! It must never be written to on the request path: it formats and takes a
//! lock.

use std::io::{self, ErrorKind, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use mio::unix::pipe::Sender;

/// How many `NonBlocking`s live, on standard output and on standard error.
static LIVE: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
/// Which streams a `NonBlocking` made non-blocking (standard output,
/// standard error): only those are set back, so a stream the server was
/// handed non-blocking is left as it was.
static MADE: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
/// Server log lines dropped because standard error had no room for them.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// At start-up, how long a line waits for a full standard error to take it
/// (once one has waited that long in vain, the next do not wait).
const START_WAIT: Duration = Duration::from_secs(1);
/// At the stop, a line waits at least this long, even past the stop's deadline.
const STOP_MIN_WAIT: Duration = Duration::from_millis(20);

/// A duplicate of standard output or standard error, non-blocking while it
/// (or another) lives. The mode belongs to the open pipe or terminal, which
/// the shell or the next program in a pipeline keeps using: the last of
/// these to go sets it back to blocking, however the server ends (a stop,
/// after its last line; a start that failed; a reload that was refused or
/// moved the access log to a file). Not earlier: a line the stop logs to a
/// shared, stalled pipe would then block for good.
pub struct NonBlocking(Sender, usize);

impl NonBlocking {
    pub fn stdout() -> io::Result<NonBlocking> {
        NonBlocking::of(io::stdout().as_fd(), 0)
    }

    pub fn stderr() -> io::Result<NonBlocking> {
        NonBlocking::of(io::stderr().as_fd(), 1)
    }

    fn of(fd: BorrowedFd<'_>, stream: usize) -> io::Result<NonBlocking> {
        let blocking = !rustix::fs::fcntl_getfl(fd)?.contains(rustix::fs::OFlags::NONBLOCK);
        let out = Sender::from(fd.try_clone_to_owned()?);
        if blocking {
            out.set_nonblocking(true)?;
            MADE[stream].store(true, Ordering::Relaxed);
        }
        LIVE[stream].fetch_add(1, Ordering::Relaxed);
        Ok(NonBlocking(out, stream))
    }

    pub fn sender(&mut self) -> &mut Sender {
        &mut self.0
    }
}

impl Drop for NonBlocking {
    fn drop(&mut self) {
        let stream = self.1;
        if LIVE[stream].fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        // One pipe or terminal for both: the other stream's users need it as it is.
        let shared = one_file();
        if shared && LIVE[1 - stream].load(Ordering::Relaxed) > 0 {
            return;
        }
        for (other, fd) in [(0, io::stdout().as_fd()), (1, io::stderr().as_fd())] {
            if (other == stream || shared) && MADE[other].swap(false, Ordering::Relaxed) {
                if let Ok(fd) = fd.try_clone_to_owned() {
                    let _ = Sender::from(fd).set_nonblocking(false);
                }
            }
        }
    }
}

/// Whether standard output and standard error are the same file (a pipe,
/// a terminal): then, short of a way to tell open file descriptions
/// apart, they are taken to share one, and its mode.
fn one_file() -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |fd: BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        file.metadata().ok().map(|m| (m.dev(), m.ino()))
    };
    let (out, err) = (id(io::stdout().as_fd()), id(io::stderr().as_fd()));
    out.is_some() && out == err
}

/// Server log lines standard error had no room for, since the start.
pub fn log_lines_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// How long a line may wait for room on a full standard error.
#[derive(Clone, Copy)]
enum Patience {
    /// Each line up to this long (start-up).
    Each(Duration),
    /// Until then (the stop), at least `STOP_MIN_WAIT`.
    Until(Instant),
    /// Not at all (the event loop runs).
    Never,
}

struct Log {
    /// Standard error, non-blocking; `None` outside `StderrLog`: written as it is.
    out: Option<NonBlocking>,
    patience: Patience,
    /// A wait for room ran out: the lines that follow do not wait until one is taken whole.
    stalled: bool,
    /// The rest of a line the pipe took only part of: written before any other.
    rest: Vec<u8>,
    /// Lines dropped since the last that was written.
    unsaid: u64,
}

static LOG: Mutex<Log> =
    Mutex::new(Log { out: None, patience: Patience::Each(START_WAIT), stalled: false, rest: Vec::new(), unsaid: 0 });

fn log() -> std::sync::MutexGuard<'static, Log> {
    LOG.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Log {
    /// One whole line (or several, as one record), or none of it.
    fn line(&mut self, line: &[u8]) {
        if self.out.is_none() {
            let _ = io::stderr().write_all(line);
            return;
        }
        if !self.say_unsaid() || !self.put(line) {
            self.dropped();
        }
    }

    /// Finishes a line cut short and says how many were dropped since the
    /// last one written; whether that is done (and a line may follow).
    fn say_unsaid(&mut self) -> bool {
        if !self.finish_rest() {
            return false;
        }
        if self.unsaid > 0 {
            let said = format!("nthpool: {} log lines were dropped: standard error was not being read\n", self.unsaid);
            if !self.put(said.as_bytes()) {
                return false;
            }
            self.unsaid = 0;
        }
        // A count line the pipe took only part of must end before the next.
        self.rest.is_empty()
    }

    fn dropped(&mut self) {
        self.unsaid += 1;
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the rest of a line cut short; whether none is left.
    fn finish_rest(&mut self) -> bool {
        if self.rest.is_empty() {
            return true;
        }
        let rest = std::mem::take(&mut self.rest);
        let written = self.write_some(&rest);
        self.rest = rest;
        self.rest.drain(..written);
        self.rest.is_empty()
    }

    /// Writes `text`, or keeps what a pipe took only part of as the rest;
    /// `false` when none of it was taken.
    fn put(&mut self, text: &[u8]) -> bool {
        let written = self.write_some(text);
        if written == 0 {
            return false;
        }
        self.rest.extend_from_slice(&text[written..]);
        true
    }

    /// As much of `text` as standard error takes, waiting for room as the
    /// patience allows.
    fn write_some(&mut self, text: &[u8]) -> usize {
        let mut waited_until: Option<Instant> = None;
        let mut written = 0;
        while written < text.len() {
            let Some(out) = self.out.as_mut() else { return 0 };
            match out.sender().write(&text[written..]) {
                Ok(0) => break,
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let until = *waited_until.get_or_insert_with(|| self.wait_until());
                    if Instant::now() >= until {
                        // Waiting was allowed (and ran out) or was not: a
                        // reader that took nothing meanwhile is stalled.
                        self.stalled |= !matches!(self.patience, Patience::Never);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The reader is gone, or the stream is closed: nothing reaches it.
                Err(_) => break,
            }
        }
        if written == text.len() {
            self.stalled = false;
        }
        written
    }

    /// Until when a write that found no room may wait for some.
    fn wait_until(&self) -> Instant {
        let now = Instant::now();
        match self.patience {
            _ if self.stalled => now,
            Patience::Each(wait) => now + wait,
            Patience::Until(until) => until.max(now + STOP_MIN_WAIT),
            Patience::Never => now,
        }
    }
}

/// The server's own log (env_logger's `Target::Pipe`): each record goes
/// to standard error as `StderrLog` and the phase of the server allow.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, record: &[u8]) -> io::Result<usize> {
        log().line(record);
        Ok(record.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Text for standard error outside the log (the banner), written as a log line is.
pub fn write_stderr(text: &[u8]) {
    log().line(text);
}

/// Text for standard output (the banner): waits for room as a start-up
/// log line does, then is dropped. Standard output is non-blocking while
/// it is written (`NonBlocking`): a full pipe nobody reads must not hold
/// up the start for good.
pub fn write_stdout(text: &[u8]) {
    let Ok(mut out) = NonBlocking::stdout() else { return };
    let until = Instant::now() + START_WAIT;
    let mut written = 0;
    while written < text.len() {
        match out.sender().write(&text[written..]) {
            Ok(0) => return,
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return,
        }
    }
}

/// While it lives, the server's log writes standard error without
/// blocking (see the module); then it is written as before, blocking, and
/// the stream is set back to blocking when no other `NonBlocking` lives.
pub struct StderrLog(());

impl StderrLog {
    /// `None` when standard error cannot be duplicated (it is closed):
    /// the log is written as it is.
    pub fn begin() -> Option<StderrLog> {
        let out = NonBlocking::stderr().ok()?;
        let mut log = log();
        log.out = Some(out);
        log.patience = Patience::Each(START_WAIT);
        log.stalled = false;
        Some(StderrLog(()))
    }
}

impl Drop for StderrLog {
    fn drop(&mut self) {
        let mut log = log();
        // What the last lines left unsaid, as the stop's patience allows.
        log.say_unsaid();
        log.out = None;
    }
}

/// The event loop runs: a line standard error has no room for is dropped.
pub fn serving() {
    log().patience = Patience::Never;
}

/// The loop has ended: lines wait for room until `until` (a stalled reader
/// holds up the exit that long, once).
pub fn stopping(until: Instant) {
    let mut log = log();
    log.patience = Patience::Until(until);
    log.stalled = false;
}
