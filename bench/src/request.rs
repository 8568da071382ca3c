//! The bytes of every request the load tool sends.
//!
//! Heads are composed once per run; only the slot id varies, so a renew or
//! release is two `extend_from_slice` calls into the connection's reused write
//! buffer and the steady state allocates nothing. With `--redis` the same
//! cycle is spoken in RESP, the Redis protocol, for the comparison runs.

use std::io::Write as _;

use crate::options::Options;

/// Pre-composed request templates for one run.
#[derive(Debug, Clone)]
pub struct Requests {
    acquire: Vec<u8>,
    /// `POST /pools/{pool}/lock/` — the slot id follows.
    slot_prefix: Vec<u8>,
    renew_suffix: Vec<u8>,
    release_suffix: Vec<u8>,
    get: Vec<u8>,
    /// RESP mode: the release is `ZREM pool id`, whose id needs a length prefix.
    redis: bool,
}

/// The release body: a plain success report, so the server's outcome learning
/// sees a healthy upstream and keeps the limit where it is.
const RELEASE_BODY: &str = "{\"status\":200}";

impl Requests {
    pub fn new(o: &Options) -> Requests {
        if let Some(sha) = &o.redis {
            return Requests::redis(sha, &o.pool);
        }
        let mut common = format!("Host: {}\r\n", o.addr);
        if let Some(key) = &o.key {
            common.push_str(&format!("X-Nthpool-Key: {key}\r\n"));
        }
        let with_body = |body: &str| {
            format!("{common}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        };
        let acquire_tail = match o.wait_ms {
            Some(ms) => with_body(&format!("{{\"waitMs\":{ms}}}")),
            None => format!("{common}Content-Length: 0\r\n\r\n"),
        };
        let pool = &o.pool;
        let get_path = o.get.as_deref().unwrap_or("/");
        Requests {
            acquire: format!("POST /pools/{pool}/lock/acquire HTTP/1.1\r\n{acquire_tail}").into(),
            slot_prefix: format!("POST /pools/{pool}/lock/").into(),
            renew_suffix: format!("/renew HTTP/1.1\r\n{common}Content-Length: 0\r\n\r\n").into(),
            release_suffix: format!("/release HTTP/1.1\r\n{}", with_body(RELEASE_BODY)).into(),
            get: format!("GET {get_path} HTTP/1.1\r\n{common}\r\n").into(),
            redis: false,
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
        }
    }

    pub fn acquire(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.acquire);
    }

    pub fn renew(&self, slot: &[u8], out: &mut Vec<u8>) {
        self.with_slot(slot, &self.renew_suffix, out);
    }

    pub fn release(&self, slot: &[u8], out: &mut Vec<u8>) {
        self.with_slot(slot, &self.release_suffix, out);
    }

    pub fn get(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.get);
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
    fn fail_fast_acquire_and_get() {
        let o = Options { get: Some("/grant.json".into()), ..Options::default() };
        let r = Requests::new(&o);
        assert_eq!(
            text(|b| r.acquire(b)),
            "POST /pools/demo/lock/acquire HTTP/1.1\r\nHost: 127.0.0.1:7070\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(text(|b| r.get(b)), "GET /grant.json HTTP/1.1\r\nHost: 127.0.0.1:7070\r\n\r\n");
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
