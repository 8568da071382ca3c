//! The access log: one JSON line per acquire attempt (SPEC §9).
//!
//! Lines are formatted into a buffer on the hot path (no allocation once it
//! has grown) and written when the reactor has finished a turn's socket work,
//! on a timer, and at shutdown — never in the middle of answering a request.
//! A failing write (a full disk, a closed pipe) is logged once, counted, and
//! never stops the server; the buffer is capped so memory stays bounded.
//!
//! Never written: keys, signatures, tokens, or a whole `slotId` (only a short
//! non-reversible reference).

use std::fs::{File, OpenOptions};
use std::io::Write;

use log::warn;

/// How every line starts; the cached time prefix holds it.
const TIME_PREFIX: &[u8] = b"{\"time\":\"";
/// Above this much buffered text, lines are dropped (and counted) until a write succeeds.
const MAX_BUFFERED: usize = 4 * 1024 * 1024;
/// The reactor writes the buffer at the end of a turn once it holds this much.
pub const WRITE_THRESHOLD: usize = 64 * 1024;
/// Buffered lines are written at least this often.
pub const FLUSH_INTERVAL_MS: u64 = 200;

enum Sink {
    Off,
    Stdout,
    File(File),
}

pub struct AccessLog {
    sink: Sink,
    buf: Vec<u8>,
    /// Set after the first failure, so it is logged once until a write works again.
    failing: bool,
    pub lines: u64,
    pub write_errors: u64,
    pub dropped: u64,
    /// `{"time":"YYYY-MM-DDTHH:MM:SS.` of `time_secs`, rebuilt when the second changes.
    time_prefix: [u8; TIME_PREFIX.len() + 20],
    time_secs: u64,
    /// The last client address and its text, reformatted only when it changes.
    client: Option<std::net::IpAddr>,
    client_text: [u8; 46],
    client_len: usize,
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
            Some("-") => Sink::Stdout,
            Some(p) => Sink::File(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("accessLog: cannot open {p}: {e}"))?,
            ),
        };
        Ok(AccessLog {
            sink,
            buf: Vec::with_capacity(WRITE_THRESHOLD),
            failing: false,
            lines: 0,
            write_errors: 0,
            dropped: 0,
            time_prefix: [0; TIME_PREFIX.len() + 20],
            time_secs: u64::MAX,
            client: None,
            client_text: [0; 46],
            client_len: 0,
        })
    }

    /// Takes over `other`'s destination (a reload); the counters carry on.
    /// Call `flush` first so buffered lines go to the old destination.
    pub fn replace_sink(&mut self, other: AccessLog) {
        self.sink = other.sink;
        self.failing = false;
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
        // No `core::fmt` here: the time prefix and the client's text are
        // cached, numbers go through itoa, the slot reference is hex by table.
        let secs = r.epoch_ms / 1000;
        if secs != self.time_secs {
            self.time_secs = secs;
            let mut tmp = Vec::with_capacity(24);
            write_rfc3339(&mut tmp, secs * 1000);
            self.time_prefix[..TIME_PREFIX.len()].copy_from_slice(TIME_PREFIX);
            self.time_prefix[TIME_PREFIX.len()..].copy_from_slice(&tmp[..20]);
        }
        if self.client != Some(r.client) {
            self.client = Some(r.client);
            let mut tmp = Vec::with_capacity(46);
            // An address formats without quotes or escapes.
            let _ = write!(tmp, "{}", r.client);
            self.client_len = tmp.len();
            self.client_text[..tmp.len()].copy_from_slice(&tmp);
        }
        let b = &mut self.buf;
        // Fixed-size pieces are copied inline; one reservation covers the line.
        b.reserve(256);
        b.extend_from_slice(&self.time_prefix);
        let ms = (r.epoch_ms % 1000) as u16;
        let ms = [b'0' + (ms / 100) as u8, b'0' + (ms / 10 % 10) as u8, b'0' + (ms % 10) as u8];
        b.extend_from_slice(&ms);
        b.extend_from_slice(b"Z\",\"pool\":");
        write_json_str(b, r.pool);
        b.extend_from_slice(b",\"client\":\"");
        b.extend_from_slice(&self.client_text[..self.client_len]);
        if (r.status, r.error, r.deny_reason) == (200, None, None) {
            // A grant, the common line: its middle is one constant.
            b.extend_from_slice(b"\",\"status\":200,\"error\":null,\"denyReason\":null,\"waitMs\":");
        } else {
            b.extend_from_slice(b"\",\"status\":");
            push_u64(b, r.status as u64);
            b.extend_from_slice(b",\"error\":");
            write_opt_str(b, r.error);
            b.extend_from_slice(b",\"denyReason\":");
            write_opt_str(b, r.deny_reason);
            b.extend_from_slice(b",\"waitMs\":");
        }
        push_u64(b, r.wait_ms);
        b.extend_from_slice(b",\"queuedMs\":");
        push_u64(b, r.queued_ms);
        b.extend_from_slice(b",\"serverUs\":");
        push_u64(b, r.server_us);
        b.extend_from_slice(b",\"slot\":");
        match r.slot_ref {
            Some(v) => {
                b.push(b'"');
                b.extend_from_slice(&hex8(v));
                b.push(b'"');
            }
            None => b.extend_from_slice(b"null"),
        }
        if let Some(p) = proxied {
            b.extend_from_slice(b",\"method\":");
            write_json_str(b, p.method);
            b.extend_from_slice(b",\"path\":");
            write_json_str(b, p.path);
            b.extend_from_slice(b",\"upstreamStatus\":");
            write_opt_u64(b, p.upstream_status.map(u64::from));
            b.extend_from_slice(b",\"upstreamMs\":");
            write_opt_u64(b, p.upstream_ms);
        }
        b.extend_from_slice(b"}\n");
    }

    /// Writes what is buffered. Failures are counted and logged once.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let result = match &mut self.sink {
            Sink::Off => Ok(()),
            Sink::Stdout => std::io::stdout().lock().write_all(&self.buf),
            Sink::File(f) => f.write_all(&self.buf),
        };
        match result {
            Ok(()) => self.failing = false,
            Err(e) => {
                self.write_errors += 1;
                if !self.failing {
                    warn!("access log write failed ({e}); lines are being dropped until it works again");
                    self.failing = true;
                }
            }
        }
        self.buf.clear();
    }
}

use crate::calendar::civil_from_days;
use crate::http::response::push_u64;

/// Eight lower-case hex digits.
fn hex8(v: u32) -> [u8; 8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 8];
    for (i, d) in out.iter_mut().enumerate() {
        *d = DIGITS[(v >> (28 - 4 * i)) as usize & 0xf];
    }
    out
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
