//! Writing responses into a connection's output buffer.
//!
//! Responses are mostly fixed text: status lines and header names are
//! constants, numbers are formatted with `itoa` on the stack, and everything
//! is appended to the connection's reused output buffer, so writing an answer
//! allocates nothing once the buffers have grown.

/// Every status the server answers with, and its status line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Continue,
    Ok,
    PermanentRedirect,
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    RequestTimeout,
    PayloadTooLarge,
    UriTooLong,
    ExpectationFailed,
    MisdirectedRequest,
    TooManyRequests,
    HeaderFieldsTooLarge,
    NotImplemented,
    BadGateway,
    ServiceUnavailable,
    GatewayTimeout,
    VersionNotSupported,
}

impl Status {
    /// Every status, so a table keyed by status can be checked against all of them.
    pub const ALL: [Status; 21] = [
        Status::Continue,
        Status::Ok,
        Status::PermanentRedirect,
        Status::BadRequest,
        Status::Unauthorized,
        Status::Forbidden,
        Status::NotFound,
        Status::MethodNotAllowed,
        Status::Conflict,
        Status::RequestTimeout,
        Status::PayloadTooLarge,
        Status::UriTooLong,
        Status::ExpectationFailed,
        Status::MisdirectedRequest,
        Status::TooManyRequests,
        Status::HeaderFieldsTooLarge,
        Status::NotImplemented,
        Status::BadGateway,
        Status::ServiceUnavailable,
        Status::GatewayTimeout,
        Status::VersionNotSupported,
    ];

    pub fn code(self) -> u16 {
        match self {
            Status::Continue => 100,
            Status::Ok => 200,
            Status::PermanentRedirect => 308,
            Status::BadRequest => 400,
            Status::Unauthorized => 401,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::Conflict => 409,
            Status::RequestTimeout => 408,
            Status::PayloadTooLarge => 413,
            Status::UriTooLong => 414,
            Status::ExpectationFailed => 417,
            Status::MisdirectedRequest => 421,
            Status::TooManyRequests => 429,
            Status::HeaderFieldsTooLarge => 431,
            Status::NotImplemented => 501,
            Status::BadGateway => 502,
            Status::ServiceUnavailable => 503,
            Status::GatewayTimeout => 504,
            Status::VersionNotSupported => 505,
        }
    }

    fn line(self) -> &'static [u8] {
        match self {
            Status::Continue => b"HTTP/1.1 100 Continue\r\n",
            Status::Ok => b"HTTP/1.1 200 OK\r\n",
            Status::PermanentRedirect => b"HTTP/1.1 308 Permanent Redirect\r\n",
            Status::BadRequest => b"HTTP/1.1 400 Bad Request\r\n",
            Status::Unauthorized => b"HTTP/1.1 401 Unauthorized\r\n",
            Status::Forbidden => b"HTTP/1.1 403 Forbidden\r\n",
            Status::NotFound => b"HTTP/1.1 404 Not Found\r\n",
            Status::MethodNotAllowed => b"HTTP/1.1 405 Method Not Allowed\r\n",
            Status::Conflict => b"HTTP/1.1 409 Conflict\r\n",
            Status::RequestTimeout => b"HTTP/1.1 408 Request Timeout\r\n",
            Status::PayloadTooLarge => b"HTTP/1.1 413 Payload Too Large\r\n",
            Status::UriTooLong => b"HTTP/1.1 414 URI Too Long\r\n",
            Status::ExpectationFailed => b"HTTP/1.1 417 Expectation Failed\r\n",
            Status::MisdirectedRequest => b"HTTP/1.1 421 Misdirected Request\r\n",
            Status::TooManyRequests => b"HTTP/1.1 429 Too Many Requests\r\n",
            Status::HeaderFieldsTooLarge => b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            Status::NotImplemented => b"HTTP/1.1 501 Not Implemented\r\n",
            Status::BadGateway => b"HTTP/1.1 502 Bad Gateway\r\n",
            Status::ServiceUnavailable => b"HTTP/1.1 503 Service Unavailable\r\n",
            Status::GatewayTimeout => b"HTTP/1.1 504 Gateway Timeout\r\n",
            Status::VersionNotSupported => b"HTTP/1.1 505 HTTP Version Not Supported\r\n",
        }
    }
}

/// `Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n` (RFC 9110 §5.6.7).
const DATE_LEN: usize = 37;
const OK_LINE: &[u8] = b"HTTP/1.1 200 OK\r\n";
/// The `200` status line and the `Date` line, the start of most answers.
pub const OK_START_LEN: usize = OK_LINE.len() + DATE_LEN;

thread_local! {
    /// The `200` status line and the `Date` header line of every answer,
    /// and the second it shows. The reactor sets the time once per turn;
    /// the text is rebuilt only when the second changes, so a `200` starts
    /// with one copy.
    static OK_START: std::cell::Cell<(u64, [u8; OK_START_LEN])> =
        const { std::cell::Cell::new((u64::MAX, *b"HTTP/1.1 200 OK\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n")) };
}

/// The `200` status line and the `Date` line, as `Writer::start` writes them.
pub fn ok_start() -> [u8; OK_START_LEN] {
    OK_START.with(|d| d.get().1)
}

/// The `Date` header line answers show now (the reactor's cached second):
/// for heads this server does not write itself, such as relayed ones.
pub fn date_line_now() -> [u8; DATE_LEN] {
    let start = ok_start();
    let mut line = [0u8; DATE_LEN];
    line.copy_from_slice(&start[OK_LINE.len()..]);
    line
}

/// Sets the time answers show in `Date`, from Unix epoch milliseconds.
pub fn set_date(epoch_ms: u64) {
    let secs = epoch_ms / 1000;
    OK_START.with(|d| {
        if d.get().0 != secs {
            let mut start = [0u8; OK_START_LEN];
            start[..OK_LINE.len()].copy_from_slice(OK_LINE);
            start[OK_LINE.len()..].copy_from_slice(&date_line(secs));
            d.set((secs, start));
        }
    });
}

/// The `Date` header line for a Unix time in seconds, IMF-fixdate.
fn date_line(secs: u64) -> [u8; DATE_LEN] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] =
        [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
    let days = secs / 86_400;
    let (year, month, day) = crate::calendar::civil_from_days(days as i64);
    let rem = secs % 86_400;
    let two = |v: u64| [b'0' + (v / 10 % 10) as u8, b'0' + (v % 10) as u8];
    let mut line = *b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n";
    line[6..9].copy_from_slice(DAYS[(days % 7) as usize]);
    line[11..13].copy_from_slice(&two(day as u64));
    line[14..17].copy_from_slice(MONTHS[month as usize - 1]);
    let y = year.clamp(0, 9999) as u64;
    line[18..20].copy_from_slice(&two(y / 100));
    line[20..22].copy_from_slice(&two(y));
    line[23..25].copy_from_slice(&two(rem / 3600));
    line[26..28].copy_from_slice(&two(rem % 3600 / 60));
    line[29..31].copy_from_slice(&two(rem % 60));
    line
}

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A response being written: status line and headers first, then `finish`
/// with the body, which adds `Content-Length` and the connection header.
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn start(out: &'a mut Vec<u8>, status: Status) -> Writer<'a> {
        // One reservation covers a whole typical answer, so the appends below
        // never reallocate in the middle.
        out.reserve(512);
        let start = ok_start();
        if status == Status::Ok {
            out.extend_from_slice(&start);
        } else {
            out.extend_from_slice(status.line());
            out.extend_from_slice(&start[OK_LINE.len()..]);
        }
        Writer { out }
    }

    /// Appends bytes as they are. Hot paths merge constant text (a header's
    /// CRLF with the next header's name) into one call.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.extend_from_slice(bytes);
        self
    }

    /// Lets `f` append to the answer directly (header blocks shared with other writers).
    pub fn with_out(&mut self, f: impl FnOnce(&mut Vec<u8>)) -> &mut Self {
        f(self.out);
        self
    }

    pub fn header(&mut self, name: &[u8], value: &[u8]) -> &mut Self {
        self.out.extend_from_slice(name);
        self.out.extend_from_slice(b": ");
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    pub fn header_u64(&mut self, name: &[u8], value: u64) -> &mut Self {
        let mut buf = itoa::Buffer::new();
        self.header(name, buf.format(value).as_bytes())
    }

    /// Ends the head and appends a JSON body.
    pub fn finish_json(self, body: &[u8], close: bool) {
        self.finish_json_parts(&[body], close);
    }

    /// Ends the head and appends a JSON body given in parts, copied once each.
    pub fn finish_json_parts(self, parts: &[&[u8]], close: bool) {
        json_head_end(self.out, parts.iter().map(|p| p.len() as u64).sum(), close);
        self.body(parts);
    }

    /// Ends the head and appends a body of another type (set with `header`).
    pub fn finish(self, body: &[u8], close: bool) {
        self.out.extend_from_slice(b"Content-Length: ");
        head_end(self.out, body.len() as u64, close);
        self.body(&[body]);
    }

    /// Ends the head of a body of `len` bytes that the caller appends.
    pub fn finish_head(self, len: u64, close: bool) {
        self.out.extend_from_slice(b"Content-Length: ");
        head_end(self.out, len, close);
    }

    /// Appends what follows a head already ended (see `json_head_end`).
    pub fn body(self, parts: &[&[u8]]) {
        for part in parts {
            self.out.extend_from_slice(part);
        }
    }
}

/// For an HTTP/1.0 client that asked to keep the connection: the answer
/// that starts at `start` in `out` tells it the connection is kept, with
/// `Connection: keep-alive` before the head's empty line (RFC 9112 §C.2.2:
/// without it an HTTP/1.0 client takes the connection to close).
pub fn say_kept_alive(out: &mut Vec<u8>, start: usize) {
    if let Some(end) = out[start..].windows(4).position(|w| w == b"\r\n\r\n") {
        let at = start + end + 2;
        out.splice(at..at, b"Connection: keep-alive\r\n".iter().copied());
    }
}

/// Writes one answer into `out` with `write`; when `kept_alive` (an HTTP/1.0
/// client that asked to keep the connection, and this answer keeps it), the
/// answer then says so (`say_kept_alive`). For answers whose writer does not
/// know the request's version: a queued acquire's, written when its wait ends.
pub fn write_kept_alive<R>(out: &mut Vec<u8>, kept_alive: bool, write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let start = out.len();
    let written = write(out);
    if kept_alive {
        say_kept_alive(out, start);
    }
    written
}

/// The last lines of a head before a JSON body of `len` bytes: its type, its
/// length, `Connection: close` when `close`, and the empty line.
pub fn json_head_end(out: &mut Vec<u8>, len: u64, close: bool) {
    out.extend_from_slice(b"Content-Type: application/json\r\nContent-Length: ");
    head_end(out, len, close);
}

/// A `Content-Length` value of `len`, then the rest of the head.
fn head_end(out: &mut Vec<u8>, len: u64, close: bool) {
    push_u64(out, len);
    if close {
        out.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    } else {
        out.extend_from_slice(b"\r\n\r\n");
    }
}

/// Appends `{"error":"<code>","message":"<message>"}`; both are fixed text
/// from the error table, so no escaping is needed.
pub fn error_body(out: &mut Vec<u8>, code: &str, message: &str) {
    debug_assert!(!code.contains(['"', '\\']) && !message.contains(['"', '\\']));
    out.extend_from_slice(b"{\"error\":\"");
    out.extend_from_slice(code.as_bytes());
    out.extend_from_slice(b"\",\"message\":\"");
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(b"\"}");
}

/// Appends a number in decimal. Most numbers in answers (slots, depths,
/// statuses, body lengths) are below 1000, and those skip the general formatter.
pub fn push_u64(out: &mut Vec<u8>, value: u64) {
    let digit = |v: u64| b'0' + (v % 10) as u8;
    match value {
        0..=9 => out.push(digit(value)),
        10..=99 => out.extend_from_slice(&[digit(value / 10), digit(value)]),
        100..=999 => out.extend_from_slice(&[digit(value / 100), digit(value / 10), digit(value)]),
        _ => out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes()),
    }
}

/// Appends `"name":<value>` to a JSON object being built.
pub fn json_u64(out: &mut Vec<u8>, name: &[u8], value: u64) {
    out.push(b'"');
    out.extend_from_slice(name);
    out.extend_from_slice(b"\":");
    push_u64(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_complete_response() {
        let mut out = Vec::new();
        set_date(1_696_004_797_123);
        let mut w = Writer::start(&mut out, Status::TooManyRequests);
        w.header_u64(b"Retry-After", 2);
        w.finish_json(b"{}", true);
        assert_eq!(
            out,
            b"HTTP/1.1 429 Too Many Requests\r\nDate: Fri, 29 Sep 2023 16:26:37 GMT\r\nRetry-After: 2\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
    }

    #[test]
    fn dates_are_imf_fixdate() {
        assert_eq!(&date_line(0), b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n");
        assert_eq!(&date_line(951_782_400), b"Date: Tue, 29 Feb 2000 00:00:00 GMT\r\n");
        assert_eq!(&date_line(1_784_303_999), b"Date: Fri, 17 Jul 2026 15:59:59 GMT\r\n");
    }

    #[test]
    fn numbers_in_decimal() {
        for v in [0, 7, 9, 10, 42, 99, 100, 170, 999, 1000, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    #[test]
    fn error_bodies_are_json() {
        let mut out = Vec::new();
        error_body(&mut out, "not_found", "No such route.");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"], "not_found");
        assert_eq!(v["message"], "No such route.");
    }
}
