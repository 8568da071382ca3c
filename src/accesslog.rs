//! The access log: one JSON line per acquire attempt (SPEC §9).
//!
//! Lines are formatted into a buffer on the hot path (no allocation once it
//! has grown) and written when the reactor has finished a turn's socket work,
//! on a timer, and at shutdown — never in the middle of answering a request.
//! A failing write (a full disk, a closed pipe) is logged once, counted, and
//! never stops the server; the buffer is capped so memory stays bounded.
//! Standard output is written without blocking: when its reader falls behind
//! (a full pipe), what does not fit waits in the buffer for the next write,
//! and lines beyond the cap are dropped and counted, so a stalled reader
//! never stalls the event loop.
//!
//! Never written: keys, signatures, tokens, or a whole `slotId` (only a short
//! non-reversible reference).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileTypeExt;

use mio::unix::pipe::Sender;

use crate::stdio::NonBlocking;

use log::warn;

/// How every line starts; the cached time prefix holds it.
const TIME_PREFIX: &[u8] = b"{\"time\":\"";
/// Above this much buffered text, lines are dropped (and counted) until a write succeeds.
const MAX_BUFFERED: usize = 4 * 1024 * 1024;
/// The reactor writes the buffer at the end of a turn once it holds this much.
pub const WRITE_THRESHOLD: usize = 64 * 1024;
/// Buffered lines are written at least this often.
pub const FLUSH_INTERVAL_MS: u64 = 200;
/// A proxied request's `method` and `path` are the client's, bounded only
/// by the 16 KiB head: written at most this many bytes each, then `…`, so
/// a request of garbage makes no line of 16 KiB. Real methods are far
/// shorter; real paths rarely reach it.
pub const METHOD_LOGGED_BYTES: usize = 32;
pub const PATH_LOGGED_BYTES: usize = 1024;
/// Ends a field cut at its bound.
const CUT_MARK: &str = "…";

enum Sink {
    Off,
    /// A duplicate of standard output, non-blocking.
    Stdout(NonBlocking),
    /// A named pipe (a log shipper reads it), opened for reading and
    /// writing so that opening it never waits for a reader, and written
    /// without blocking, as standard output is.
    Fifo(Sender),
    File(File),
}

pub struct AccessLog {
    sink: Sink,
    /// The file's name, when the sink is a file: what a reopen opens.
    path: Option<String>,
    buf: Vec<u8>,
    /// Set at the first failure, so it is logged once until a write works
    /// again: the count of lines dropped before it, so the end of the
    /// failures can say how many they cost.
    failing: Option<u64>,
    /// The file (device, inode, length) after a write that stopped inside
    /// a line, whose rest heads the buffer: written next if the file open
    /// then is still that one, that long.
    torn_at: Option<FileEnd>,
    pub lines: u64,
    pub write_errors: u64,
    pub dropped: u64,
    /// `{"time":"YYYY-MM-DDTHH:MM:SS.` of `time_secs`, rebuilt when the second changes.
    time_prefix: [u8; TIME_PREFIX.len() + 20],
    time_secs: u64,
    /// The line's middle, rebuilt only when what it holds changes.
    middle: Middle,
}

/// From the milliseconds' `Z` to the `waitMs` key: the pool's name
/// escaped, the client's address, and the status fields, in two versions:
/// with a grant's constant status fields, and up to the status for any
/// other answer. A keep-alive caller's lines share it, whatever they
/// answer, so a line copies one of them whole.
#[derive(Default)]
struct Middle {
    /// What the texts were built from: pool name and client.
    pool: Vec<u8>,
    client: Option<std::net::IpAddr>,
    grant: Vec<u8>,
    other: Vec<u8>,
}

impl Middle {
    fn holds(&self, pool: &str, client: std::net::IpAddr) -> bool {
        self.client == Some(client) && self.pool == pool.as_bytes()
    }

    fn build(&mut self, pool: &str, client: std::net::IpAddr) {
        self.pool.clear();
        self.pool.extend_from_slice(pool.as_bytes());
        self.client = Some(client);
        let t = &mut self.other;
        t.clear();
        t.extend_from_slice(b"Z\",\"pool\":");
        write_json_str(t, pool);
        // An address needs no quotes or escapes.
        t.extend_from_slice(b",\"client\":\"");
        write_ip(t, client);
        t.push(b'"');
        self.grant.clear();
        self.grant.extend_from_slice(t);
        self.grant.extend_from_slice(GRANT_STATUS);
        t.extend_from_slice(b",\"status\":");
    }

    fn text(&self, grant: bool) -> &[u8] {
        if grant {
            &self.grant
        } else {
            &self.other
        }
    }
}

/// An address as `Display` writes it: IPv4 by hand (most clients, and a
/// busy server's lines alternate between them), IPv6 through `fmt`.
fn write_ip(t: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    t.push(b'.');
                }
                push_num(t, u64::from(octet));
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(t, "{v6}");
        }
    }
}

/// A grant's status fields, the same on every grant line.
const GRANT_STATUS: &[u8] = b",\"status\":200,\"error\":null,\"denyReason\":null,\"waitMs\":";

/// A log line's number: one digit by hand, more by itoa. (`push_u64`, which
/// answers use, spells two and three digits out by hand; on a log line that
/// measured 17 instructions per request more under callgrind.)
fn push_num(b: &mut Vec<u8>, v: u64) {
    if v < 10 {
        b.push(b'0' + v as u8);
    } else {
        b.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }
}

/// One acquire attempt, as logged.
pub struct Record<'a> {
    pub epoch_ms: u64,
    pub pool: &'a str,
    pub client: std::net::IpAddr,
    pub status: u16,
    pub error: Option<&'a str>,
    pub deny_reason: Option<&'a str>,
    pub wait_ms: u64,
    pub queued_ms: u64,
    pub server_us: u64,
    pub slot_ref: Option<u32>,
}

/// What a proxied request's line adds: the method, the path without its
/// query (which may carry secrets), and the upstream's status and time.
pub struct Proxied<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub upstream_status: Option<u16>,
    pub upstream_ms: Option<u64>,
}

impl AccessLog {
    /// `None` is off, `-` is standard output, anything else a file appended to.
    pub fn open(path: Option<&str>) -> Result<AccessLog, String> {
        let sink = match path {
            None => Sink::Off,
            Some("-") => Sink::Stdout(
                NonBlocking::stdout().map_err(|e| format!("accessLog: cannot write to standard output: {e}"))?,
            ),
            Some(p) if std::fs::metadata(p).is_ok_and(|m| m.file_type().is_fifo()) => {
                // Opened for writing only, a pipe without a reader would
                // block the event loop in `open` (at a SIGHUP, after the
                // reader left) and every write once it is full.
                let fifo = OpenOptions::new().read(true).write(true).open(p);
                let fifo = fifo.map(|f| Sender::from(std::os::fd::OwnedFd::from(f)));
                let fifo = fifo.and_then(|fifo| fifo.set_nonblocking(true).map(|()| fifo));
                Sink::Fifo(fifo.map_err(|e| format!("accessLog: cannot open {p}: {e}"))?)
            }
            Some(p) => Sink::File(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("accessLog: cannot open {p}: {e}"))?,
            ),
        };
        let path = path.filter(|&p| p != "-").map(String::from);
        Ok(AccessLog {
            sink,
            path,
            buf: Vec::with_capacity(WRITE_THRESHOLD),
            failing: None,
            torn_at: None,
            lines: 0,
            write_errors: 0,
            dropped: 0,
            time_prefix: [0; TIME_PREFIX.len() + 20],
            time_secs: u64::MAX,
            middle: Middle::default(),
        })
    }

    /// Takes over `other`'s destination (a reload); the counters carry on.
    /// Call `flush` first so buffered lines go to the old destination.
    pub fn replace_sink(&mut self, mut other: AccessLog) {
        // The rest of a torn line goes only to the file it was torn in
        // (the same file reopened); `flush` tells.
        if !matches!(other.sink, Sink::File(_)) {
            self.drop_torn_rest();
        }
        // Standard output again: the one already in use stays.
        if !matches!((&self.sink, &other.sink), (Sink::Stdout(_), Sink::Stdout(_))) {
            // Reopened (a rotation's SIGHUP), the pipe keeps what it holds.
            let reopened = matches!(other.sink, Sink::Fifo(_)) && other.path == self.path;
            if let (Sink::Fifo(fifo), false) = (&self.sink, reopened) {
                say_unread_in_pipe(fifo, "a reload that moved the log off it");
            }
            std::mem::swap(&mut self.sink, &mut other.sink);
        }
        self.path = other.path;
        // After the torn rest is dropped: that line too was lost to the failure.
        self.drop_torn_rest_if_moved();
        self.end_failing("the log was reopened");
        self.end_foreign_line();
    }

    /// A file left in the middle of a line (by a process stopped or killed
    /// while a full disk tore its line, or by another writer) gets the
    /// newline that ends it, so that the next line starts on its own. Not
    /// while the rest of this log's own torn line waits to finish it.
    fn end_foreign_line(&mut self) {
        use std::os::unix::fs::FileExt;
        let (Sink::File(f), Some(path), None) = (&mut self.sink, &self.path, self.torn_at) else {
            return;
        };
        let Some(len) = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len()) else {
            return;
        };
        // The log is opened for appending only; its last byte is read apart.
        let mut last = [b'\n'];
        if len > 0 && File::open(path).and_then(|r| r.read_at(&mut last, len - 1)).is_ok() && last[0] != b'\n' {
            if let Err(e) = f.write_all(b"\n") {
                warn!("access log: cannot end the line {path} was left in: {e}");
            }
        }
    }

    /// Opens its file again by name, so a SIGHUP after a rotation writes to
    /// the new file even when the reload itself is refused. Standard output
    /// and no log stay as they are; on failure the open file stays.
    pub fn reopen(&mut self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let fresh = AccessLog::open(Some(path))?;
        self.flush();
        self.replace_sink(fresh);
        Ok(())
    }

    /// Writes what is buffered, waiting until `until` for a pipe or
    /// standard output whose reader is slow (at shutdown). What a reader has
    /// not taken by then is dropped, counted and reported (its first line
    /// may be cut short where the reader stopped). Standard output stays
    /// non-blocking while the log lives (`NonBlocking`).
    pub fn close(&mut self, until: std::time::Instant) {
        self.flush();
        while !self.buf.is_empty() && self.failing.is_none() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.flush();
        }
        if !self.buf.is_empty() {
            let lines = count_lines(&self.buf);
            self.dropped += lines;
            // Lost to failing writes, not to a reader: counted with them below.
            if self.failing.is_none() {
                warn!("access log: {lines} lines were not taken by its reader before the stop and are lost");
            }
            self.buf.clear();
            // The rest of a torn line is gone with them: its line is ended
            // if the file takes a newline now (else the next start ends it).
            if self.torn_at.take().is_some() {
                if let Sink::File(f) = &mut self.sink {
                    let _ = f.write_all(b"\n");
                }
            }
        }
        // This process holds a named pipe open for reading too (so opening
        // it never waits for a reader): what its reader has not taken yet
        // is lost with the last process that has it open. Said, not waited
        // for: a reader that has it open still gets it.
        if let Sink::Fifo(fifo) = &self.sink {
            say_unread_in_pipe(fifo, "the stop");
        }
        if let Some(before) = self.failing {
            warn!(
                "access log: its writes still fail at the stop; {} lines were dropped since they began",
                self.dropped - before
            );
        }
    }

    pub fn is_on(&self) -> bool {
        !matches!(self.sink, Sink::Off)
    }

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    pub fn record(&mut self, r: &Record) {
        self.record_with(r, None);
    }

    /// A proxied request's line: the acquire's fields, then what was
    /// forwarded and what the upstream answered.
    pub fn record_proxied(&mut self, r: &Record, p: &Proxied) {
        self.record_with(r, Some(p));
    }

    fn record_with(&mut self, r: &Record, proxied: Option<&Proxied>) {
        if !self.is_on() {
            return;
        }
        if self.buf.len() > MAX_BUFFERED {
            self.dropped += 1;
            return;
        }
        self.lines += 1;
        // No `core::fmt` here but for an IPv6 client new to the cached
        // middle: the time prefix and the middle (pool and client) are
        // cached, numbers go through itoa, the slot reference is hex by table.
        let secs = r.epoch_ms / 1000;
        if secs != self.time_secs {
            self.time_secs = secs;
            let mut tmp = Vec::with_capacity(24);
            write_rfc3339(&mut tmp, secs * 1000);
            self.time_prefix[..TIME_PREFIX.len()].copy_from_slice(TIME_PREFIX);
            self.time_prefix[TIME_PREFIX.len()..].copy_from_slice(&tmp[..20]);
        }
        let grant = (r.status, r.error, r.deny_reason) == (200, None, None);
        if !self.middle.holds(r.pool, r.client) {
            self.middle.build(r.pool, r.client);
        }
        let mut start = [0u8; TIME_PREFIX.len() + 23];
        start[..TIME_PREFIX.len() + 20].copy_from_slice(&self.time_prefix);
        let ms = (r.epoch_ms % 1000) as u16;
        start[TIME_PREFIX.len() + 20..].copy_from_slice(&[
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
        ]);
        let b = &mut self.buf;
        // One reservation covers a usual line (a long pool name or path may grow it).
        b.reserve(256);
        b.extend_from_slice(&start);
        b.extend_from_slice(self.middle.text(grant));
        if !grant {
            push_u64(b, r.status as u64);
            b.extend_from_slice(b",\"error\":");
            write_opt_str(b, r.error);
            b.extend_from_slice(b",\"denyReason\":");
            write_opt_str(b, r.deny_reason);
            b.extend_from_slice(b",\"waitMs\":");
        }
        push_num(b, r.wait_ms);
        b.extend_from_slice(b",\"queuedMs\":");
        push_num(b, r.queued_ms);
        b.extend_from_slice(b",\"serverUs\":");
        push_num(b, r.server_us);
        match r.slot_ref {
            Some(v) => {
                b.extend_from_slice(b",\"slot\":\"");
                b.extend_from_slice(&hex8(v));
                b.push(b'"');
            }
            None => b.extend_from_slice(b",\"slot\":null"),
        }
        let Some(p) = proxied else {
            b.extend_from_slice(b"}\n");
            return;
        };
        b.extend_from_slice(b",\"method\":");
        write_json_str_cut(b, p.method, METHOD_LOGGED_BYTES);
        b.extend_from_slice(b",\"path\":");
        let quote = b.len();
        write_json_str_cut(b, p.path, PATH_LOGGED_BYTES);
        if !implied_slash(p.path.as_bytes()).is_empty() {
            b.insert(quote + 1, b'/');
        }
        b.extend_from_slice(b",\"upstreamStatus\":");
        write_opt_u64(b, p.upstream_status.map(u64::from));
        b.extend_from_slice(b",\"upstreamMs\":");
        write_opt_u64(b, p.upstream_ms);
        b.extend_from_slice(b"}\n");
    }

    /// Writes what is buffered. Failures are counted and logged once;
    /// standard output takes what it can without blocking, the rest waits.
    /// Lines a failed write could not begin are dropped and counted; the
    /// rest of one it tore (a full disk, a file size limit) is kept, so the
    /// file gets the line whole once writes work again, or, when the file
    /// is no longer the one it tore (truncated, rotated away), that line is
    /// dropped too: a torn line never runs into the next one.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        self.drop_torn_rest_if_moved();
        let (written, error) = match &mut self.sink {
            Sink::Off => (self.buf.len(), None),
            Sink::Stdout(out) => write_some(out.sender(), &self.buf),
            Sink::Fifo(out) => write_some(out, &self.buf),
            Sink::File(f) => write_some(f, &self.buf),
        };
        let Some(e) = error else {
            // Short only when a pipe would block: the rest waits.
            self.buf.drain(..written);
            self.end_failing("writes work again");
            self.torn_at = None;
            return;
        };
        self.write_errors += 1;
        if self.failing.is_none() {
            warn!("access log write failed ({e}); lines are being dropped until it works again");
            self.failing = Some(self.dropped);
        }
        let mid_line = match written {
            0 => self.torn_at.is_some(),
            n => self.buf[n - 1] != b'\n',
        };
        let torn_at = if mid_line { file_end(&self.sink) } else { None };
        // Every line ends in a newline, so the torn one's end is found.
        let keep = match torn_at {
            Some(_) => self.buf[written..].iter().position(|&c| c == b'\n').map_or(0, |i| i + 1),
            None => 0,
        };
        // What is not kept is dropped: the lines never begun, and a torn
        // one whose file cannot be told apart (standard output).
        self.dropped += count_lines(&self.buf[written + keep..]);
        self.buf.truncate(written + keep);
        self.buf.drain(..written);
        self.torn_at = torn_at;
    }

    /// Failing writes are over (`now`: why): says how many lines they cost,
    /// as the first failure said it would, so the log counts them all.
    fn end_failing(&mut self, now: &str) {
        if let Some(before) = self.failing.take() {
            warn!("access log: {now}; {} lines were dropped while its writes failed", self.dropped - before);
        }
    }

    /// Drops the rest of a torn line when the file open now is no longer
    /// the one it tore, or no longer as long (truncated, rotated away).
    fn drop_torn_rest_if_moved(&mut self) {
        if self.torn_at.is_some_and(|end| file_end(&self.sink) != Some(end)) {
            self.drop_torn_rest();
        }
    }

    /// Drops what is left of a torn line at the head of the buffer (its
    /// file is gone or changed), counting it.
    fn drop_torn_rest(&mut self) {
        if self.torn_at.take().is_some() {
            let end = self.buf.iter().position(|&c| c == b'\n').map_or(self.buf.len(), |i| i + 1);
            self.buf.drain(..end);
            self.dropped += 1;
        }
    }
}

/// Which file a sink writes to, and how long it is: device, inode, length.
type FileEnd = (u64, u64, u64);

fn file_end(sink: &Sink) -> Option<FileEnd> {
    use std::os::unix::fs::MetadataExt;
    match sink {
        Sink::File(f) => f.metadata().ok().map(|m| (m.dev(), m.ino(), m.len())),
        _ => None,
    }
}

fn count_lines(text: &[u8]) -> u64 {
    text.iter().filter(|&&c| c == b'\n').count() as u64
}

/// Says how much of what was written to a named pipe its reader has not
/// taken when this process lets go of it (`when`): lost unless a reader
/// has the pipe open.
fn say_unread_in_pipe(fifo: &Sender, when: &str) {
    let unread = rustix::io::ioctl_fionread(fifo).unwrap_or(0);
    if unread > 0 {
        warn!("access log: {unread} bytes were still in the named pipe at {when}, not yet read: lost unless a reader has it open");
    }
}

/// Writes as much of `buf` as `out` takes without blocking: how much that
/// was, and the error that stopped it short, if one did.
fn write_some(mut out: impl Write, buf: &[u8]) -> (usize, Option<std::io::Error>) {
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

use crate::calendar::civil_from_days;
use crate::http::response::push_u64;
use crate::http::target::implied_slash;

/// Eight lower-case hex digits, all at once: each nibble is spread to a
/// byte of its own, then offset to its digit (`0`-`9`, or `a`-`f` where
/// adding 6 carries into bit 4).
fn hex8(v: u32) -> [u8; 8] {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    let x = u64::from(v);
    let x = (x & 0xffff_0000) << 16 | (x & 0xffff);
    let x = (x & 0x0000_ff00_0000_ff00) << 8 | (x & 0x0000_00ff_0000_00ff);
    let x = (x & 0x00f0_00f0_00f0_00f0) << 4 | (x & 0x000f_000f_000f_000f);
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    // Nibble 0 is in the lowest byte: big-endian puts the highest first.
    (x + b'0' as u64 * ONES + letters * (b'a' - b'0' - 10) as u64).to_be_bytes()
}

fn write_opt_u64(b: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => push_u64(b, v),
        None => b.extend_from_slice(b"null"),
    }
}

fn write_opt_str(b: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_json_str(b, s),
        None => b.extend_from_slice(b"null"),
    }
}

/// `s` as a JSON string, cut to at most `max` bytes (at a character's
/// boundary) and ended with `CUT_MARK` when it was longer.
fn write_json_str_cut(b: &mut Vec<u8>, s: &str, max: usize) {
    if s.len() <= max {
        return write_json_str(b, s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    write_json_str(b, &s[..end]);
    b.pop();
    b.extend_from_slice(CUT_MARK.as_bytes());
    b.push(b'"');
}

/// A JSON string; pool names in the log come from request paths, so escape.
fn write_json_str(b: &mut Vec<u8>, s: &str) {
    b.push(b'"');
    // Pool names are plain text: the common case is one copy.
    if !s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        b.extend_from_slice(s.as_bytes());
        b.push(b'"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' => b.extend_from_slice(b"\\\""),
            '\\' => b.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(b, "\\u{:04x}", c as u32);
            }
            c => {
                let mut tmp = [0u8; 4];
                b.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
            }
        }
    }
    b.push(b'"');
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` from Unix epoch milliseconds.
pub fn write_rfc3339(b: &mut Vec<u8>, epoch_ms: u64) {
    let secs = epoch_ms / 1000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let _ = write!(
        b,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        epoch_ms % 1000
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex8_is_lower_case_hex() {
        // Every nibble value in every place, and a spread of words.
        let mut values: Vec<u32> = (0..8).flat_map(|i| (0..16u32).map(move |n| n << (4 * i))).collect();
        values.extend((0..10_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
        values.extend([0, u32::MAX, 0x0123_4567, 0x89ab_cdef]);
        for v in values {
            assert_eq!(hex8(v), format!("{v:08x}").as_bytes(), "{v:#x}");
        }
    }

    #[test]
    fn rfc3339_times() {
        let mut b = Vec::new();
        write_rfc3339(&mut b, 0);
        assert_eq!(b, b"1970-01-01T00:00:00.000Z");
        b.clear();
        write_rfc3339(&mut b, 1_696_004_797_123);
        assert_eq!(b, b"2023-09-29T16:26:37.123Z");
        b.clear();
        write_rfc3339(&mut b, 951_782_400_000);
        assert_eq!(b, b"2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn lines_are_json_and_escaped() {
        let path = std::env::temp_dir().join(format!("nthpool-log-{}.log", std::process::id()));
        let mut log = AccessLog::open(Some(path.to_str().unwrap())).unwrap();
        log.record(&Record {
            epoch_ms: 1_696_004_797_000,
            pool: "we\"ird\\pool\n",
            client: "::1".parse().unwrap(),
            status: 200,
            error: None,
            deny_reason: None,
            wait_ms: 5,
            queued_ms: 1,
            server_us: 12,
            slot_ref: Some(0xabc),
        });
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["pool"], "we\"ird\\pool\n");
        assert_eq!(v["client"], "::1");
        assert_eq!(v["slot"], "00000abc");
        assert_eq!(v["error"], serde_json::Value::Null);
        assert_eq!(log.lines, 1);
    }

    /// A proxied request's method and path are the client's: each is cut
    /// at its bound (at a character's boundary) and marked, and escaped.
    #[test]
    fn a_proxied_requests_method_and_path_are_cut_at_their_bounds() {
        let path = std::env::temp_dir().join(format!("nthpool-log-cut-{}.log", std::process::id()));
        let mut log = AccessLog::open(Some(path.to_str().unwrap())).unwrap();
        let record = Record {
            epoch_ms: 1_696_004_797_000,
            pool: "p",
            client: "::1".parse().unwrap(),
            status: 401,
            error: Some("unauthorized"),
            deny_reason: None,
            wait_ms: 0,
            queued_ms: 0,
            server_us: 12,
            slot_ref: None,
        };
        let method = "X".repeat(16_000);
        let long_path = format!("/\"{}", "é".repeat(8_000));
        let exact_method = "M".repeat(METHOD_LOGGED_BYTES);
        for (method, path) in [(&*method, &*long_path), (&*exact_method, "/v1/chat")] {
            log.record_proxied(&record, &Proxied { method, path, upstream_status: None, upstream_ms: None });
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(text.lines().all(|l| l.len() < 1_400), "{}", text.len());
        let cut_method = lines[0]["method"].as_str().unwrap();
        assert_eq!(cut_method, format!("{}…", "X".repeat(METHOD_LOGGED_BYTES)));
        let cut_path = lines[0]["path"].as_str().unwrap();
        assert!(cut_path.starts_with("/\"éé") && cut_path.ends_with("é…"), "{cut_path}");
        assert!(cut_path.len() <= PATH_LOGGED_BYTES + CUT_MARK.len(), "{}", cut_path.len());
        assert_eq!((lines[1]["method"].as_str(), lines[1]["path"].as_str()), (Some(&*exact_method), Some("/v1/chat")));
    }

    #[test]
    fn the_cached_middle_follows_pool_client_and_status() {
        let path = std::env::temp_dir().join(format!("nthpool-log-mid-{}.log", std::process::id()));
        let mut log = AccessLog::open(Some(path.to_str().unwrap())).unwrap();
        let cases: [(&str, &str, u16, Option<&str>, u64); 9] = [
            ("a", "127.0.0.1", 200, None, 0),
            ("b", "127.0.0.1", 200, None, 1_234),
            ("b", "::1", 429, Some("too_many_requests"), 7),
            ("b", "::1", 200, None, 12),
            ("ab", "::1", 200, None, 0),
            ("a", "127.0.0.1", 504, Some("queue_timeout"), 250),
            ("a", "127.0.0.1", 200, None, 3),
            ("a", "0.0.0.0", 429, Some("too_many_requests"), 0),
            ("a", "255.10.9.100", 200, None, 0),
        ];
        for (i, (pool, client, status, error, wait_ms)) in cases.iter().enumerate() {
            log.record(&Record {
                epoch_ms: 1_696_004_797_000 + i as u64 * 999,
                pool,
                client: client.parse().unwrap(),
                status: *status,
                error: *error,
                deny_reason: error.map(|_| "concurrency"),
                wait_ms: *wait_ms,
                queued_ms: i as u64,
                server_us: 10_u64.pow(i as u32 % 6),
                slot_ref: (*status == 200).then_some(i as u32),
            });
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), cases.len());
        for (i, (v, (pool, client, status, error, wait_ms))) in lines.iter().zip(cases).enumerate() {
            assert_eq!(v["pool"], pool, "line {i}");
            assert_eq!(v["client"], client, "line {i}");
            assert_eq!(v["status"], status, "line {i}");
            assert_eq!(v["error"].as_str(), error, "line {i}");
            assert_eq!(v["denyReason"].as_str(), error.map(|_| "concurrency"), "line {i}");
            assert_eq!(v["waitMs"], wait_ms, "line {i}");
            assert_eq!(v["queuedMs"], i, "line {i}");
            assert_eq!(v["serverUs"], 10_u64.pow(i as u32 % 6), "line {i}");
            assert_eq!(v["slot"].is_null(), status != 200, "line {i}");
        }
        assert_eq!(lines[1]["time"], "2023-09-29T16:26:37.999Z");
    }

    #[test]
    fn the_rest_of_a_torn_line_goes_only_to_the_file_it_was_torn_in() {
        let path = std::env::temp_dir().join(format!("nthpool-log-torn-{}.log", std::process::id()));
        let line = |log: &mut AccessLog| {
            log.record(&Record {
                epoch_ms: 0,
                pool: "p",
                client: "127.0.0.1".parse().unwrap(),
                status: 401,
                error: Some("unauthorized"),
                deny_reason: None,
                wait_ms: 0,
                queued_ms: 0,
                server_us: 1,
                slot_ref: None,
            })
        };
        // As a write that stopped after `{"ti` leaves it: the file ends
        // there and the buffer holds the rest of that line.
        let torn = |log: &mut AccessLog| {
            std::fs::write(&path, b"{\"ti").unwrap();
            line(log);
            log.buf.drain(..4);
            log.torn_at = file_end(&log.sink);
        };
        let mut log = AccessLog::open(Some(path.to_str().unwrap())).unwrap();
        // The same file, as it was: the line is finished.
        torn(&mut log);
        line(&mut log);
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{text}");
        assert_eq!(log.dropped, 0);
        // Truncated meanwhile (copytruncate): the rest is dropped, counted.
        torn(&mut log);
        line(&mut log);
        std::fs::write(&path, b"").unwrap();
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(text.trim_end()).is_ok(), "{text}");
        assert_eq!(log.dropped, 1);
        // Reopened after a rotation: the new file does not start with it.
        torn(&mut log);
        std::fs::rename(&path, path.with_extension("1")).unwrap();
        log.reopen().unwrap();
        line(&mut log);
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(text.trim_end()).is_ok(), "{text}");
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(path.with_extension("1")).unwrap();
    }

    #[test]
    fn a_failing_sink_is_counted_not_fatal() {
        let mut log = AccessLog::open(Some("/dev/full")).unwrap();
        for _ in 0..3 {
            log.record(&Record {
                epoch_ms: 0,
                pool: "p",
                client: "127.0.0.1".parse().unwrap(),
                status: 429,
                error: Some("too_many_requests"),
                deny_reason: Some("concurrency"),
                wait_ms: 0,
                queued_ms: 0,
                server_us: 1,
                slot_ref: None,
            });
            log.flush();
        }
        assert_eq!(log.write_errors, 3);
        assert_eq!(log.buffered(), 0);
    }
}
