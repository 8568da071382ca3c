//! The bytes of every request the load tool sends.
//!
//! Heads are composed once per run; only the slot id varies, so a renew or
//! release is two `extend_from_slice` calls into the connection's reused write
//! buffer and the steady state allocates nothing.

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
}

/// The release body: a plain success report, so the server's outcome learning
/// sees a healthy upstream and keeps the limit where it is.
const RELEASE_BODY: &str = "{\"status\":200}";

impl Requests {
    pub fn new(o: &Options) -> Requests {
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
}
