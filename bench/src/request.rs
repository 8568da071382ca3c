//! The bytes of every request the load tool sends.
//!
//! Heads are composed once per run; only the slot id varies, so a renew or
//! release is two `extend_from_slice` calls into the connection's reused write
//! buffer and the steady state allocates nothing. With `--vary-header` every
//! head also carries `X-Request-Id: <16 hex digits>`: the templates hold 16
//! placeholder digits, overwritten in the write buffer after the copy with the
//! next value of a run-wide counter, so the length stays the same and nothing
//! is allocated either. With `--redis` the same cycle is spoken in RESP, the
//! Redis protocol, for the comparison runs.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::options::Options;

/// Pre-composed request templates for one run.
#[derive(Debug)]
pub struct Requests {
    acquire: Vec<u8>,
    /// `POST /pools/{pool}/lock/` — the slot id follows.
    slot_prefix: Vec<u8>,
    renew_suffix: Vec<u8>,
    release_suffix: Vec<u8>,
    get: Vec<u8>,
    /// RESP mode: the release is `ZREM pool id`, whose id needs a length prefix.
    redis: bool,
    /// `--vary-header`: where the placeholder digits sit in each template.
    vary: Option<Vary>,
}

/// Offsets of the `X-Request-Id` value's 16 digits: from the start of the
/// acquire and GET templates, and from the start of the renew and release
/// suffixes (the slot prefix and the slot id come before those).
#[derive(Debug)]
struct Vary {
    acquire: usize,
    renew: usize,
    release: usize,
    get: usize,
    /// The value of the next request's id, shared by all threads of the run.
    next: AtomicU64,
}

/// The release body: a plain success report, so the server's outcome learning
/// sees a healthy upstream and keeps the limit where it is.
const RELEASE_BODY: &str = "{\"status\":200}";

/// The header `--vary-header` adds, up to its value.
const REQUEST_ID: &str = "X-Request-Id: ";
/// Digits of the request id: fixed, so every request keeps its length.
const ID_DIGITS: usize = 16;

impl Requests {
    pub fn new(o: &Options) -> Requests {
        if let Some(sha) = &o.redis {
            return Requests::redis(sha, &o.pool);
        }
        let mut common = format!("Host: {}\r\n", o.addr);
        if let Some(key) = &o.key {
            common.push_str(&format!("X-Nthpool-Key: {key}\r\n"));
        }
        // The id is the last line of `common`; its digits are filled in per request.
        let id_in_common = o.vary_header.then(|| {
            common.push_str(&format!("{REQUEST_ID}{}\r\n", "0".repeat(ID_DIGITS)));
            common.len() - ID_DIGITS - 2
        });
        let with_body = |body: &str| {
            format!("{common}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        };
        // The fields of a request without a body.
        let bodyless = format!("{common}Content-Length: 0\r\n\r\n");
        let acquire_tail = match o.wait_ms {
            Some(ms) => with_body(&format!("{{\"waitMs\":{ms}}}")),
            None => bodyless.clone(),
        };
        let pool = &o.pool;
        let get_path = o.get.as_deref().unwrap_or("/");
        // Each template is its first line followed by `common`.
        let acquire_line = format!("POST /pools/{pool}/lock/acquire HTTP/1.1\r\n");
        let renew_line = "/renew HTTP/1.1\r\n";
        let release_line = "/release HTTP/1.1\r\n";
        let get_line = format!("GET {get_path} HTTP/1.1\r\n");
        let vary = id_in_common.map(|at| Vary {
            acquire: acquire_line.len() + at,
            renew: renew_line.len() + at,
            release: release_line.len() + at,
            get: get_line.len() + at,
            next: AtomicU64::new(1),
        });
        Requests {
            acquire: format!("{acquire_line}{acquire_tail}").into(),
            slot_prefix: format!("POST /pools/{pool}/lock/").into(),
            renew_suffix: format!("{renew_line}{bodyless}").into(),
            release_suffix: match o.no_report {
                true => format!("{release_line}{bodyless}"),
                false => format!("{release_line}{}", with_body(RELEASE_BODY)),
            }
            .into(),
            get: format!("{get_line}{common}\r\n").into(),
            redis: false,
            vary,
        }
    }

    /// `EVALSHA sha 2 pool pool:seq` and `ZREM pool <id>` as RESP arrays of
    /// bulk strings: the semaphore lives in the sorted set `pool`, its holder
    /// ids come from the counter `pool:seq` (both declared as keys, as Redis
    /// asks of scripts).
    fn redis(sha: &str, pool: &str) -> Requests {
        let bulk = |s: &str| format!("${}\r\n{s}\r\n", s.len());
        let seq = format!("{pool}:seq");
        let acquire = format!("*5\r\n{}{}{}{}{}", bulk("EVALSHA"), bulk(sha), bulk("2"), bulk(pool), bulk(&seq));
        Requests {
            acquire: acquire.into(),
            slot_prefix: format!("*3\r\n{}{}", bulk("ZREM"), bulk(pool)).into(),
            renew_suffix: Vec::new(),
            release_suffix: b"\r\n".to_vec(),
            get: Vec::new(),
            redis: true,
            vary: None,
        }
    }

    pub fn acquire(&self, out: &mut Vec<u8>) {
        out.clear();
        self.append_acquire(out);
    }

    /// Appends one acquire to what `out` holds already (`--fill` pipelines them).
    pub fn append_acquire(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.acquire);
        self.stamp(out, |v| start + v.acquire);
    }

    pub fn renew(&self, slot: &[u8], out: &mut Vec<u8>) {
        self.with_slot(slot, &self.renew_suffix, out);
        self.stamp(out, |v| self.slot_prefix.len() + slot.len() + v.renew);
    }

    pub fn release(&self, slot: &[u8], out: &mut Vec<u8>) {
        self.with_slot(slot, &self.release_suffix, out);
        self.stamp(out, |v| self.slot_prefix.len() + slot.len() + v.release);
    }

    pub fn get(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.get);
        self.stamp(out, |v| v.get);
    }

    fn with_slot(&self, slot: &[u8], suffix: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.slot_prefix);
        if self.redis {
            // Writing a number into a Vec cannot fail.
            let _ = write!(out, "${}\r\n", slot.len());
        }
        out.extend_from_slice(slot);
        out.extend_from_slice(suffix);
    }

    /// `--vary-header`: overwrites the placeholder digits of the request just
    /// copied into `out` (at the offset `at` picks) with the next id, as 16
    /// lowercase hex digits. In place: no allocation, no change of length.
    fn stamp(&self, out: &mut [u8], at: impl FnOnce(&Vary) -> usize) {
        let Some(vary) = &self.vary else { return };
        let id = vary.next.fetch_add(1, Ordering::Relaxed);
        let start = at(vary);
        for (k, digit) in out[start..start + ID_DIGITS].iter_mut().enumerate() {
            let shift = 4 * (ID_DIGITS - 1 - k);
            *digit = b"0123456789abcdef"[(id >> shift) as usize & 0xf];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = b"stale".to_vec();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lock_requests() {
        let o = Options { key: Some("k1".into()), wait_ms: Some(250), ..Options::default() };
        let r = Requests::new(&o);
        assert_eq!(
            text(|b| r.acquire(b)),
            "POST /pools/demo/lock/acquire HTTP/1.1\r\nHost: 127.0.0.1:7070\r\nX-Nthpool-Key: k1\r\n\
             Content-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"waitMs\":250}"
        );
        assert_eq!(
            text(|b| r.renew(b"s1", b)),
            "POST /pools/demo/lock/s1/renew HTTP/1.1\r\nHost: 127.0.0.1:7070\r\nX-Nthpool-Key: k1\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(
            text(|b| r.release(b"s1", b)),
            "POST /pools/demo/lock/s1/release HTTP/1.1\r\nHost: 127.0.0.1:7070\r\nX-Nthpool-Key: k1\r\n\
             Content-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"status\":200}"
        );
    }

    #[test]
    fn a_release_without_a_report_has_the_fields_of_an_acquire() {
        let r = Requests::new(&Options { key: Some("k1".into()), no_report: true, ..Options::default() });
        let fields = "Host: 127.0.0.1:7070\r\nX-Nthpool-Key: k1\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(text(|b| r.release(b"s1", b)), format!("POST /pools/demo/lock/s1/release HTTP/1.1\r\n{fields}"));
        assert_eq!(text(|b| r.acquire(b)), format!("POST /pools/demo/lock/acquire HTTP/1.1\r\n{fields}"));
    }

    #[test]
    fn fail_fast_acquire_and_get() {
        let o = Options { get: Some("/grant.json".into()), ..Options::default() };
        let r = Requests::new(&o);
        assert_eq!(
            text(|b| r.acquire(b)),
            "POST /pools/demo/lock/acquire HTTP/1.1\r\nHost: 127.0.0.1:7070\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(text(|b| r.get(b)), "GET /grant.json HTTP/1.1\r\nHost: 127.0.0.1:7070\r\n\r\n");
    }

    /// Parses one HTTP request with httparse and checks its framing; returns
    /// its `X-Request-Id` value and the length of the whole request.
    fn request_id(bytes: &[u8]) -> (u64, usize) {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(head_len) = req.parse(bytes).expect("valid HTTP") else {
            panic!("incomplete head: {:?}", String::from_utf8_lossy(bytes));
        };
        let value = |name: &str| req.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
        let body_len = value("Content-Length").map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
        let ids: Vec<_> = req.headers.iter().filter(|h| h.name == "X-Request-Id").collect();
        assert_eq!(ids.len(), 1, "one X-Request-Id");
        let id = ids[0].value;
        assert_eq!(id.len(), 16);
        assert!(id.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)), "{id:?}");
        (u64::from_str_radix(std::str::from_utf8(id).unwrap(), 16).unwrap(), head_len + body_len)
    }

    #[test]
    fn varying_header_changes_only_the_counter() {
        for get in [None, Some("/grant.json".to_string())] {
            let plain = Options { key: Some("k1".into()), wait_ms: Some(250), get, ..Options::default() };
            let varying = Options { vary_header: true, ..plain.clone() };
            let (p, r) = (Requests::new(&plain), Requests::new(&varying));
            type Make = fn(&Requests, &mut Vec<u8>);
            let kinds: [Make; 4] =
                [|r, b| r.acquire(b), |r, b| r.renew(b"slot-1", b), |r, b| r.release(b"slot-1", b), |r, b| r.get(b)];
            let mut last = None;
            for make in kinds {
                let (mut first, mut second) = (b"stale".to_vec(), Vec::with_capacity(512));
                make(&r, &mut first);
                let capacity = second.capacity();
                make(&r, &mut second);
                // Written in place: the reused buffer did not grow.
                assert_eq!(second.capacity(), capacity);
                let ((a, a_len), (b, b_len)) = (request_id(&first), request_id(&second));
                assert_eq!((a_len, b_len), (first.len(), second.len()), "one whole request each");
                // Every request takes the next value, whatever its kind.
                assert_eq!(b, a + 1);
                if let Some(prev) = last {
                    assert_eq!(a, prev + 1);
                }
                last = Some(b);
                // The two differ only in the counter's digits...
                assert_eq!(first.len(), second.len());
                let differ: Vec<_> = (0..first.len()).filter(|&k| first[k] != second[k]).collect();
                let at = first.windows(14).position(|w| w == b"X-Request-Id: ").unwrap() + 14;
                assert!(!differ.is_empty() && differ.iter().all(|k| (at..at + 16).contains(k)), "{differ:?}");
                // ...and without its line each is the request sent without the flag.
                let mut without = first.clone();
                without.drain(at - 14..at + 18);
                let mut expected = Vec::new();
                make(&p, &mut expected);
                assert_eq!(String::from_utf8(without).unwrap(), String::from_utf8(expected).unwrap());
            }
        }
    }

    #[test]
    fn varying_header_in_pipelined_acquires() {
        let r = Requests::new(&Options { vary_header: true, ..Options::default() });
        let mut out = Vec::new();
        r.append_acquire(&mut out);
        let one = out.len();
        r.append_acquire(&mut out);
        let (a, a_len) = request_id(&out[..one]);
        let (b, b_len) = request_id(&out[one..]);
        assert_eq!((a_len, b_len, a, b), (one, one, 1, 2));
        let text = String::from_utf8(out[..one].to_vec()).unwrap();
        assert!(text.contains("\r\nX-Request-Id: 0000000000000001\r\n"), "{text}");
        // A counter past 9 is spelled in lowercase hex.
        for _ in 0..8 {
            r.acquire(&mut out);
        }
        assert!(String::from_utf8(out).unwrap().contains("X-Request-Id: 000000000000000a\r\n"));
    }

    #[test]
    fn redis_requests_are_resp_arrays() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let o = Options { redis: Some(sha.into()), pool: "sem".into(), ..Options::default() };
        let r = Requests::new(&o);
        assert_eq!(
            text(|b| r.acquire(b)),
            format!("*5\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n2\r\n$3\r\nsem\r\n$7\r\nsem:seq\r\n")
        );
        assert_eq!(text(|b| r.release(b"1234", b)), "*3\r\n$4\r\nZREM\r\n$3\r\nsem\r\n$4\r\n1234\r\n");
    }
}
