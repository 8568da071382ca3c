//! Request heads: finds where a request head ends in a connection's input, parses it
//! with httparse and applies the framing rules of SPEC §4 that httparse leaves open
//! (bare LF or CR, missing or repeated `Host`, `Content-Length` with
//! `Transfer-Encoding`, any transfer coding other than `chunked`, list or signed
//! `Content-Length`s, obsolete line folding).
//!
//! Which request targets and `Host` values are valid is `super::target`'s.
//!
//! A connection's `HeadMemo` (`super::memo`) spares a head whose header block it
//! already judged everything but its request line; a head parsed in full is judged
//! here and, when it passes, remembered there.
//!
//! The result borrows the input buffer (and, for a head whose request line is the
//! remembered one, the memo): this module allocates only to remember a new block,
//! never reads a body, never touches a socket and never chooses an answer. A
//! `HeadError` names the status only through its variant; the connection layer
//! writes the reply.

use std::mem::MaybeUninit;

use httparse::{Header, Status};

use super::memo::{BlockMemo, LineRecall, Recalled};
use super::target::{split_target, valid_host, valid_target_bytes};
use super::{bytes_equal, is_tchar, or_over_words, same_bytes, trim, words_equal, LO};

/// Past this many bytes without a complete head the answer is `431` (`414`
/// or `400` when the request line alone is longer: `too_large`).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// More header fields than this is answered as a head too large (`431`).
pub const MAX_HEADERS: usize = 64;

/// Room for the parsed header fields; left uninitialised, so a parse costs
/// nothing for the fields a request does not send.
pub type HeaderStorage<'b> = [MaybeUninit<Header<'b>>; MAX_HEADERS];

pub fn header_storage<'b>() -> HeaderStorage<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    /// Any other method; routes only need to know it is none of the above.
    #[default]
    Other,
}

impl Method {
    /// The name of a method other than `Other`, as sent (methods are case-sensitive).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Method::Get => Some("GET"),
            Method::Head => Some("HEAD"),
            Method::Post => Some("POST"),
            Method::Other => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: no framing header, or `Content-Length: 0`.
    None,
    /// A body of exactly this many bytes (never 0).
    Length(u64),
    /// `Transfer-Encoding: chunked`; decode with `ChunkedDecoder`.
    Chunked,
}

#[derive(Debug)]
pub struct Head<'b> {
    pub method: Method,
    /// The method as sent (`PATCH`, `DELETE`, ...): proxied and logged as is.
    pub method_name: &'b str,
    /// The request target as sent, query string included; starts with `/`,
    /// or is `*` for `OPTIONS *` (RFC 9112 §3.2.4). Valid UTF-8 (httparse checked it, or every byte is printable
    /// ASCII), kept as bytes so a target read by comparison needs no second
    /// check: `path_str` gives the text.
    pub path: &'b [u8],
    /// False for HTTP/1.0.
    pub http11: bool,
    /// HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0 only
    /// with `Connection: keep-alive` (and no `close`).
    pub keep_alive: bool,
    pub framing: BodyFraming,
    /// `Expect: 100-continue` was sent, whatever the framing (any other
    /// expectation is `HeadError::ExpectationFailed`).
    pub expect_continue: bool,
    /// The one `Host` value (always present on HTTP/1.1, optional on HTTP/1.0).
    pub host: Option<&'b [u8]>,
    /// Bytes of the input taken by the head, final empty line included: the body or
    /// the next pipelined request starts here.
    pub head_len: usize,
    /// The fields the lock API reads on every request, found in the same pass
    /// as the framing fields (first occurrence of each).
    pub api: ApiFields<'b>,
    /// Every header field, in order.
    pub headers: HeaderFields<'b>,
    /// Which of its connection's remembered heads this one repeats, if its
    /// header block was recalled: a verdict kept about that head holds for
    /// this one while the memo's entry keeps its version.
    pub recall: Option<HeadRecall<'b>>,
    /// Whether the target's bytes were checked (`valid_target_bytes`): not
    /// for a line read by comparison with a remembered one (`Line::Like`),
    /// whose target is left to `check_target` by whoever reads it as more
    /// than a comparison with a target that was checked.
    target_checked: bool,
}

/// A head whose header block a connection remembered (see `Head::recall`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadRecall<'b> {
    /// The memo's entry and its version: the same pair is the same block
    /// after the same remembered request line.
    pub entry: u8,
    pub version: u32,
    /// The request line is byte for byte the remembered one too: the whole
    /// head is one already seen.
    pub same_line: bool,
    /// The path of the remembered request line (the same for every head
    /// with this entry and version), when the memo kept its text.
    pub path: Option<&'b [u8]>,
}

/// `X-Nthpool-Key`, `Authorization`, `X-Nthpool-Queue-Timeout-Ms`, `X-Nthpool-No-Queue`,
/// `X-Nthpool-Moved`, `X-Nthpool-Pool`, `Idempotency-Key`: where their values lie in the
/// header block, so a value costs nothing until it is read (most requests
/// read one or two of them).
#[derive(Clone, Copy)]
pub struct ApiFields<'b> {
    block: &'b [u8],
    spans: ApiSpans,
}

impl<'b> ApiFields<'b> {
    pub fn key(&self) -> Option<&'b [u8]> {
        self.value(self.spans.key)
    }

    pub fn authorization(&self) -> Option<&'b [u8]> {
        self.value(self.spans.authorization)
    }

    pub fn queue_timeout_ms(&self) -> Option<&'b [u8]> {
        self.value(self.spans.queue_timeout_ms)
    }

    pub fn no_queue(&self) -> bool {
        self.spans.no_queue
    }

    /// Set by HAProxy on a pool's first request after its instance left rotation.
    pub fn moved(&self) -> bool {
        self.spans.moved
    }

    /// The pool the router in front placed this request by (HAProxy sets
    /// it, empty when its map named no pool).
    pub fn placed_as(&self) -> Option<&'b [u8]> {
        self.value(self.spans.placed_as)
    }

    /// `Idempotency-Key` (SPEC §11).
    pub fn idempotency_key(&self) -> Option<&'b [u8]> {
        self.value(self.spans.idempotency_key)
    }

    fn value(&self, span: Option<Span>) -> Option<&'b [u8]> {
        span.map(|s| s.of(self.block))
    }
}

/// Shows the values, not where they lie.
impl std::fmt::Debug for ApiFields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiFields")
            .field("key", &self.key())
            .field("authorization", &self.authorization())
            .field("queue_timeout_ms", &self.queue_timeout_ms())
            .field("no_queue", &self.no_queue())
            .field("moved", &self.moved())
            .field("placed_as", &self.placed_as())
            .field("idempotency_key", &self.idempotency_key())
            .finish()
    }
}

impl<'b> Head<'b> {
    /// `400` for a target holding a byte no request target may: a fragment's
    /// `#`, a `\`, a quote or angle bracket, a byte past ASCII (RFC 9112 §3.2,
    /// RFC 3986 §3).
    pub fn check_target(&self) -> Result<(), HeadError> {
        if self.target_checked || valid_target_bytes(self.path) {
            Ok(())
        } else {
            Err(BAD_TARGET_BYTE)
        }
    }

    /// The value of the first field named `lower_case_name`, compared without case.
    pub fn header(&self, lower_case_name: &str) -> Option<&'b [u8]> {
        debug_assert!(!lower_case_name.bytes().any(|b| b.is_ascii_uppercase()));
        let name = lower_case_name.as_bytes();
        self.headers.into_iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
    }

    /// `Max-Forwards` (RFC 9110 §7.6.2), when the first such field is a
    /// number (`1*DIGIT`; past 64 bits, the most a `u64` holds).
    pub fn max_forwards(&self) -> Option<u64> {
        let digits = trim(self.header("max-forwards")?);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(digits.iter().fold(0u64, |n, &d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
    }

    /// The target as text (it is always valid UTF-8; see `path`).
    pub fn path_str(&self) -> &'b str {
        let text = std::str::from_utf8(self.path);
        debug_assert!(text.is_ok(), "a target that is not UTF-8");
        text.unwrap_or_default()
    }
}

/// The header fields of a head that passed every check, in order: httparse's
/// own list when the head was parsed in full, else the places of the fields
/// in the header block its connection remembered with them. Only routes that
/// need more than the fields `ApiFields` holds (proxying, `X-Forwarded-For`,
/// signatures) walk it.
#[derive(Clone, Copy)]
pub struct HeaderFields<'b> {
    fields: FieldList<'b>,
}

/// The fields themselves, whichever list holds them.
impl std::fmt::Debug for HeaderFields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(*self).finish()
    }
}

#[derive(Clone, Copy)]
enum FieldList<'b> {
    Parsed(&'b [Header<'b>]),
    /// Name and value spans of `block`.
    Remembered(&'b [(Span, Span)], &'b [u8]),
}

/// One header field of a checked head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'b> {
    /// As sent (compare it without case); a token, so ASCII.
    pub name: &'b [u8],
    /// Without the white space around it.
    pub value: &'b [u8],
}

impl<'b> Iterator for HeaderFields<'b> {
    type Item = Field<'b>;

    fn next(&mut self) -> Option<Field<'b>> {
        match &mut self.fields {
            FieldList::Parsed(list) => {
                let (first, rest) = list.split_first()?;
                *list = rest;
                Some(Field { name: first.name.as_bytes(), value: first.value })
            }
            FieldList::Remembered(list, block) => {
                let (&(name, value), rest) = list.split_first()?;
                *list = rest;
                Some(Field { name: name.of(block), value: value.of(block) })
            }
        }
    }
}

/// From the last field back: `X-Forwarded-For` is read newest hop first.
impl<'b> DoubleEndedIterator for HeaderFields<'b> {
    fn next_back(&mut self) -> Option<Field<'b>> {
        match &mut self.fields {
            FieldList::Parsed(list) => {
                let (last, rest) = list.split_last()?;
                *list = rest;
                Some(Field { name: last.name.as_bytes(), value: last.value })
            }
            FieldList::Remembered(list, block) => {
                let (&(name, value), rest) = list.split_last()?;
                *list = rest;
                Some(Field { name: name.of(block), value: value.of(block) })
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// `400` and close; the text is the one-sentence `message` of the reply.
    Malformed(&'static str),
    /// `431` and close: the head is over `MAX_HEAD_BYTES`.
    TooLarge,
    /// `431` and close: the head has more fields than `MAX_HEADERS`.
    TooManyFields,
    /// `414` and close: the request target alone is over `MAX_HEAD_BYTES`.
    TargetTooLong,
    /// `501` and close: a transfer coding this server does not implement.
    NotImplemented(&'static str),
    /// `417` and close: an `Expect` member other than `100-continue`.
    ExpectationFailed,
    /// `HTTP/1.x` with x > 1: call `serve_as_http11` on the buffer and parse again.
    NewerMinorVersion,
    /// `505` and close: a major version other than 1 (`HTTP/2.0`, `HTTP/0.9`).
    OtherMajorVersion,
}

/// Whether `parse_head` could now return something other than `Ok(None)`, given
/// that `buf[..searched_from]` was already looked at by an earlier call. Callers
/// pass the previous `buf.len()` so a slowly arriving head costs O(new bytes)
/// instead of one full httparse run per read.
///
/// True when a new `\r\n\r\n` may end the head, when a bare LF or CR arrived (so a
/// malformed head gets its `400` now rather than at the head timeout), or when the
/// buffer is over `MAX_HEAD_BYTES` (so it gets its `431`).
pub fn head_may_be_complete(buf: &[u8], searched_from: usize) -> bool {
    if buf.len() > MAX_HEAD_BYTES || searched_from == 0 {
        return true;
    }
    // Each byte is judged with the one before it, so a CR that ended the previous
    // read is judged by the byte that follows it. A control or non-ASCII byte
    // (a NUL, a TLS handshake, stray binary) opens the gate too: httparse may
    // refuse it, and then the 400 comes at once.
    for i in searched_from.min(buf.len())..buf.len() {
        let prev = if i == 0 { 0 } else { buf[i - 1] };
        match buf[i] {
            b'\n' if prev != b'\r' || (i >= 3 && &buf[i - 3..i - 1] == b"\r\n") => return true,
            b'\n' => {}
            _ if prev == b'\r' => return true,
            b'\r' | b'\t' => {}
            b if !(0x20..0x7f).contains(&b) => return true,
            _ => {}
        }
    }
    false
}

/// The last `Host` value of a connection that passed `valid_host`. A
/// keep-alive client sends the same one on every request, and then one
/// compare stands in for the check.
#[derive(Clone, Copy)]
pub struct KnownHost {
    bytes: [u8; KnownHost::ROOM],
    len: usize,
}

impl Default for KnownHost {
    fn default() -> KnownHost {
        // A length no value has: nothing is known yet.
        KnownHost { bytes: [0; KnownHost::ROOM], len: usize::MAX }
    }
}

impl KnownHost {
    /// Longer values are checked every time.
    const ROOM: usize = 64;

    /// Whether `value` is valid, remembering it when it is.
    fn check(&mut self, value: &[u8]) -> bool {
        if value.len() == self.len && same_bytes(value, &self.bytes[..self.len]) {
            return true;
        }
        let valid = valid_host(value);
        if valid && value.len() <= KnownHost::ROOM {
            self.bytes[..value.len()].copy_from_slice(value);
            self.len = value.len();
        }
        valid
    }
}

/// Parses the request head at the start of `buf`. `Ok(None)` means the head is not
/// complete yet; keep the bytes and call again once `head_may_be_complete` says so.
pub fn parse_head<'b>(buf: &'b [u8], storage: &'b mut HeaderStorage<'b>) -> Result<Option<Head<'b>>, HeadError> {
    parse_full(buf, storage, None, false)
}

/// `parse_head` for a connection that remembers the header blocks it sent
/// before (see `memo`): a block it remembers is not judged again.
///
/// A head whose request line is the remembered one too borrows that line's
/// text from `memo`, which stays borrowed as long as the head.
pub fn parse_head_on<'b>(
    buf: &'b [u8],
    storage: &'b mut HeaderStorage<'b>,
    memo: &'b mut HeadMemo,
) -> Result<Option<Head<'b>>, HeadError> {
    let probe = memo.blocks.probe();
    // Leading empty lines are left to the full parse.
    let found = match buf.first() {
        Some(b'\r' | b'\n') => None,
        _ if probe && !memo.blocks.is_empty() => memo.blocks.recall(buf),
        _ => None,
    };
    if let Some(found) = found {
        let line = match found.line {
            LineRecall::Same => Some(Line::Remembered(*memo.blocks.line_spans(found.entry))),
            LineRecall::Like => {
                let spans = *memo.blocks.line_spans(found.entry);
                read_line_like(buf, memo.blocks.line_text(found.entry), spans).map(|target| Line::Like(spans, target))
            }
            LineRecall::Unknown => None,
        };
        let line = line.or_else(|| read_line_alone(buf, found.line_len).map(|(m, t, v)| Line::Read(m, t, v)));
        if let Some(line) = line {
            // The head borrows the remembered fields (and line) from here on.
            let memo: &'b HeadMemo = memo;
            return recalled(buf, memo, &found, line);
        }
    }
    parse_full(buf, storage, Some(memo), probe)
}

/// Parses a whole head with httparse and checks it; with a `memo`, its
/// known `Host` is used, and a head that passes is remembered when
/// `remember`.
fn parse_full<'b>(
    buf: &'b [u8],
    storage: &'b mut HeaderStorage<'b>,
    mut memo: Option<&mut HeadMemo>,
    remember: bool,
) -> Result<Option<Head<'b>>, HeadError> {
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, storage) {
        Ok(Status::Complete(n)) => n,
        Ok(Status::Partial) => return partial(buf),
        // Too many fields, or a version other than 1.0 and 1.1, can be told
        // before the head (or its request line) is complete; the verdict waits
        // for it, so that it does not depend on how the head was split into
        // reads, and bare line ends in it are named first, as in any head.
        Err(httparse::Error::TooManyHeaders) => {
            let Some(head) = complete_head(buf) else { return partial(buf) };
            check_line_endings(head)?;
            return Err(HeadError::TooManyFields);
        }
        Err(httparse::Error::Version) if !buf.contains(&b'\n') => return partial(buf),
        Err(httparse::Error::Version) if newer_minor_version(buf).is_some() => {
            return Err(HeadError::NewerMinorVersion)
        }
        Err(httparse::Error::Version) if other_major_version(buf) => return Err(HeadError::OtherMajorVersion),
        Err(e) => return Err(refused(buf, e)),
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(too_large(&buf[..head_len]));
    }
    let httparse::Request { method, path, version, headers } = req;
    let headers: &'b [Header<'b>] = headers;
    let (Some(method), Some(target), Some(version)) = (method, path, version) else {
        return Err(HeadError::Malformed("The request line is incomplete."));
    };
    // httparse takes a lone LF as a line ending; a proxy in front of us may not,
    // and two readings of one head is how requests get smuggled. Checking the
    // few line ends httparse found is enough when they all hold a CR; anything
    // else gets the exact byte scan, which also words the error.
    if !line_ends_are_crlf(buf, head_len, target, headers) {
        check_line_endings(&buf[..head_len])?;
    }
    let line = RequestLine::check(method, target.as_bytes(), version)?;
    // The request line ends `<target> HTTP/1.x\r\n`; the fields follow.
    let block_start = offset_in(buf, target.as_bytes()) + target.len() + REQUEST_LINE_TAIL;
    let block = &buf[block_start..head_len];
    let mut fields = FieldSpans::default();
    scan_fields(headers, block, &mut fields)?;
    let host_ok = match (fields.host.map(|host| host.of(block)), memo.as_deref_mut()) {
        (None, _) => true,
        (Some(host), Some(memo)) => memo.host.check(host),
        (Some(host), None) => valid_host(host),
    };
    if !host_ok {
        return Err(HeadError::Malformed("The Host header is not a valid host[:port]."));
    }
    if let Some(memo) = memo.filter(|_| remember) {
        let line_spans = LineSpans {
            method: Span::within(buf, method.as_bytes()),
            target: Span::within(buf, target.as_bytes()),
            version,
            kind: line.method,
            path: Span::within(buf, line.path),
            authority: line.authority.map(|a| Span::within(buf, a)),
        };
        let line = &buf[..block_start];
        let places = headers.iter().map(|h| (Span::within(block, h.name.as_bytes()), Span::within(block, h.value)));
        let may_vary = headers.iter().filter(|h| value_may_vary(h.name.as_bytes())).map(|h| {
            let value = Span::within(block, h.value);
            (value.start as usize, value.end())
        });
        memo.blocks.remember(line, line_spans, block, fields, places, may_vary);
    }
    let headers = HeaderFields { fields: FieldList::Parsed(headers) };
    assemble(line, head_len, block, &fields, headers, None)
}

/// A head not complete yet: what came of it is judged for its line ends and
/// size, and more is awaited.
fn partial<'b>(buf: &[u8]) -> Result<Option<Head<'b>>, HeadError> {
    check_line_endings(buf)?;
    if buf.len() > MAX_HEAD_BYTES {
        return Err(too_large(buf));
    }
    Ok(None)
}

/// What a head over `MAX_HEAD_BYTES` is refused as. When its request line
/// alone is that long, `400` if the method runs past the limit (no method is
/// that long, and the line is not one), `414` if the target does (RFC 9112
/// §3: a target longer than the server parses MUST get it). Else `431`.
fn too_large(head: &[u8]) -> HeadError {
    // The empty lines a request line may follow (RFC 9112 §2.2) are not it.
    let head = &head[head.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(head.len())..];
    let line_len = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    if line_len <= MAX_HEAD_BYTES {
        return HeadError::TooLarge;
    }
    let line = &head[..line_len];
    let method_end = line.iter().position(|&b| b == b' ').unwrap_or(line_len);
    if method_end > MAX_HEAD_BYTES {
        return HeadError::Malformed("The request method runs past 16 KiB; no method is that long.");
    }
    let target_end = line[method_end + 1..].iter().position(|&b| b == b' ').map_or(line_len, |i| method_end + 1 + i);
    if target_end > MAX_HEAD_BYTES {
        HeadError::TargetTooLong
    } else {
        HeadError::TooLarge
    }
}

/// For a head refused before its fields were read (a `HeadError`): the
/// pool the router in front placed it by (`X-Nthpool-Pool`), when the head
/// also says the router moved that pool here (`X-Nthpool-Moved`). The router
/// moved the pool whatever this server makes of the rest, so the two fields
/// are read from the raw lines, up to the empty line or `MAX_HEAD_BYTES`;
/// `None` when either is missing or the pool field is sent twice.
pub fn moved_placed_as(buf: &[u8]) -> Option<&[u8]> {
    let head = &buf[..buf.len().min(MAX_HEAD_BYTES)];
    let (mut moved, mut placed_as) = (false, None);
    let lines = head.split(|&b| b == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    for line in lines.skip(1).take_while(|line| !line.is_empty()) {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name_is(name, b"x-nthpool-moved") {
            moved = true;
        } else if name_is(name, b"x-nthpool-pool") {
            if placed_as.is_some() {
                return None;
            }
            placed_as = Some(value);
        }
    }
    placed_as.filter(|_| moved)
}

/// The head at the start of `buf`, up to and with its empty line, when that
/// has come: what follows it (a body, the next request) is none of its bytes.
fn complete_head(buf: &[u8]) -> Option<&[u8]> {
    let searched = &buf[..buf.len().min(MAX_HEAD_BYTES + 4)];
    searched.windows(4).position(|w| w == b"\r\n\r\n").map(|at| &buf[..at + 4])
}

/// `<target>` is followed by ` HTTP/1.x\r\n` in a request line.
const REQUEST_LINE_TAIL: usize = b" HTTP/1.1\r\n".len();

/// Where `part`, a slice of `buf`, starts in it.
fn offset_in(buf: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - buf.as_ptr() as usize
}

/// The request line of a head whose header block was recalled.
enum Line<'b> {
    /// The very line remembered with the block: what httparse read in it.
    Remembered(LineSpans),
    /// A line that differs from the remembered one (read as these spans)
    /// only in its target: this target (the method and version are the
    /// remembered ones).
    Like(LineSpans, &'b [u8]),
    /// Another line of the same length, read now: method, target, version.
    Read(&'b str, &'b [u8], u8),
}

/// httparse's reading of `buf[..line_len]` as a request line alone (the
/// fields are not in the slice, so it stops, `Partial`, where they would
/// start): method, target and version, when the line is exactly that long and
/// ends with CRLF. `None` sends the head to the full parse.
fn read_line_alone(buf: &[u8], line_len: usize) -> Option<(&str, &[u8], u8)> {
    let mut req = httparse::Request::new(&mut []);
    if req.parse_with_uninit_headers(&buf[..line_len], &mut []) != Ok(Status::Partial) {
        return None;
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return None;
    };
    (offset_in(buf, target.as_bytes()) + target.len() + REQUEST_LINE_TAIL == line_len).then_some((
        method,
        target.as_bytes(),
        version,
    ))
}

/// The request line at the start of `buf`, read by comparison with
/// `remembered`, a line of the same length in which httparse read `spans`:
/// the target, when the two lines differ only inside the target
/// and the head's target is printable ASCII without spaces. httparse would
/// then read the same method, stop the target at the same space and read
/// the same version, so its verdict on the line is the one it gave before.
/// A release's line differs from the last one only in its slot id, so this
/// takes the place of a parse. `None` leaves the line to httparse. Kept
/// out of line: inlined into the pipeline's `process` (as the compiler
/// chose once the head parser's refusals grew), a request cost about 12
/// instructions more under callgrind.
#[inline(never)]
fn read_line_like<'b>(buf: &'b [u8], remembered: &str, spans: LineSpans) -> Option<&'b [u8]> {
    let old = remembered.as_bytes();
    let line = buf.get(..old.len())?;
    let (start, end) = (spans.target.start as usize, spans.target.end());
    let target = &line[start..end];
    (same_bytes(&line[..start], &old[..start]) && same_bytes(&line[end..], &old[end..]) && uri_ascii(target))
        .then_some(target)
}

/// Every byte is printable ASCII other than space (`!` to `~`): bytes
/// httparse takes in a target with no further check, and valid UTF-8.
/// Eight at a time: with no high bit set in a word, adding 0x01 to each byte
/// sets it only in 0x7f (DEL), and adding 0x5f sets it in `!` and above,
/// without a carry into the next byte.
fn uri_ascii(bytes: &[u8]) -> bool {
    if bytes.len() < 8 {
        return bytes.iter().all(|b| (b'!'..=b'~').contains(b));
    }
    or_over_words(bytes, |x| (x | x.wrapping_add(LO) | !x.wrapping_add(0x5f * LO)) & (LO << 7)) == 0
}

/// The head at the start of `buf`, whose header block is the one `memo`
/// remembered with `found`, after the request line `line`.
fn recalled<'b>(
    buf: &'b [u8],
    memo: &'b HeadMemo,
    found: &Recalled,
    line: Line<'b>,
) -> Result<Option<Head<'b>>, HeadError> {
    let text = memo.blocks.line_text(found.entry);
    let remembered_method = |spans: LineSpans| {
        // A method the line was found to be is named by a constant.
        if let Some(name) = spans.kind.name() {
            return Ok(name);
        }
        let method = spans.method.str_in(text);
        // The spans were taken from this very text.
        debug_assert!(method.is_some(), "a remembered request line without its spans");
        method.ok_or(HeadError::Malformed("The request line is invalid."))
    };
    let recall = HeadRecall {
        entry: found.entry as u8,
        version: found.version,
        same_line: matches!(line, Line::Remembered(_)),
        path: (text.len() == found.line_len).then(|| memo.blocks.line_spans(found.entry).path.of(text.as_bytes())),
    };
    // A remembered line passed `RequestLine::check`, and what it found is
    // kept with it; a line like it has the same method and version, so only
    // its target is looked at again.
    let line = match line {
        Line::Read(method, target, version) => RequestLine::check(method, target, version)?,
        Line::Like(spans, target) => {
            let method_name = remembered_method(spans)?;
            let (path, authority) = request_target(method_name, target)?;
            RequestLine { method: spans.kind, method_name, path, authority, http11: spans.version == 1, checked: false }
        }
        Line::Remembered(spans) => RequestLine {
            method: spans.kind,
            method_name: remembered_method(spans)?,
            path: spans.path.of(text.as_bytes()),
            authority: spans.authority.map(|a| a.of(text.as_bytes())),
            http11: spans.version == 1,
            checked: true,
        },
    };
    let head_len = found.line_len + found.block_len;
    if head_len > MAX_HEAD_BYTES {
        return Err(too_large(&buf[..head_len]));
    }
    let block = &buf[found.line_len..head_len];
    let headers = HeaderFields { fields: FieldList::Remembered(memo.blocks.fields(found.entry), block) };
    assemble(line, head_len, block, memo.blocks.spans(found.entry), headers, Some(recall))
}

/// What the request line says, checked.
struct RequestLine<'b> {
    method: Method,
    method_name: &'b str,
    path: &'b [u8],
    /// The authority of an absolute-form target.
    authority: Option<&'b [u8]>,
    http11: bool,
    /// The target's bytes were checked (see `Head::target_checked`).
    checked: bool,
}

impl<'b> RequestLine<'b> {
    fn check(method_name: &'b str, target: &'b [u8], version: u8) -> Result<RequestLine<'b>, HeadError> {
        let method = match method_name {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            _ => Method::Other,
        };
        let (path, authority) = request_target(method_name, target)?;
        if !valid_target_bytes(path) {
            return Err(BAD_TARGET_BYTE);
        }
        let http11 = match version {
            1 => true,
            0 => false,
            _ => return Err(HeadError::Malformed("Only HTTP/1.0 and HTTP/1.1 are served.")),
        };
        Ok(RequestLine { method, method_name, path, authority, http11, checked: true })
    }
}

/// The head of a checked request line and the fields of its header block,
/// with the rules that depend on both. Inline, so the head is built where
/// the caller's result lives: out of line, the compiler builds it in a frame
/// of its own and the head is copied once more (about 40 instructions a
/// request).
#[inline(always)]
fn assemble<'b>(
    line: RequestLine<'b>,
    head_len: usize,
    block: &'b [u8],
    f: &FieldSpans,
    headers: HeaderFields<'b>,
    recall: Option<HeadRecall<'b>>,
) -> Result<Option<Head<'b>>, HeadError> {
    let http11 = line.http11;
    if http11 && f.host.is_none() {
        return Err(HeadError::Malformed("An HTTP/1.1 request needs a Host header."));
    }
    let framing = match (f.chunked, f.content_length) {
        (true, Some(_)) => {
            return Err(HeadError::Malformed("Content-Length and Transfer-Encoding cannot be sent together."))
        }
        (true, None) if !http11 => {
            return Err(HeadError::Malformed("Transfer-Encoding is not allowed in an HTTP/1.0 request."))
        }
        (true, None) if f.unimplemented_coding => return Err(UNIMPLEMENTED_CODING),
        (true, None) => BodyFraming::Chunked,
        (false, None | Some(0)) => BodyFraming::None,
        (false, Some(n)) => BodyFraming::Length(n),
    };
    // Built where the caller's result lives: a head is large, and wrapping
    // it again on the way out would copy it.
    Ok(Some(Head {
        method: line.method,
        method_name: line.method_name,
        path: line.path,
        http11,
        keep_alive: !f.close && (http11 || f.keep_alive),
        framing,
        // An HTTP/1.0 client may not know 1xx answers (RFC 9110 §10.1.1).
        expect_continue: f.expect_continue && http11,
        // An absolute-form target's authority takes the place of Host (RFC 9112 §3.2.2).
        host: line.authority.or(f.host.map(|host| host.of(block))),
        head_len,
        api: ApiFields { block, spans: f.api },
        headers,
        recall,
        target_checked: line.checked,
    }))
}

/// The position of the minor-version digit when the request line ends in
/// `HTTP/1.<2-9>`: a later HTTP/1 minor version, served as 1.1 (RFC 9110 §2.5).
fn newer_minor_version(buf: &[u8]) -> Option<usize> {
    let line = whole_first_line(buf)?;
    let at = line.len().checked_sub(1)?;
    (line.len() > b" HTTP/1.x".len() && line[..at].ends_with(b" HTTP/1.") && (b'2'..=b'9').contains(&line[at]))
        .then_some(at)
}

/// Whether the request line ends in a well-formed `HTTP/d.d` of a major
/// version other than 1 (RFC 9110 §15.6.6: `505`, where a malformed version
/// is `400`).
fn other_major_version(buf: &[u8]) -> bool {
    let Some(line) = whole_first_line(buf) else { return false };
    match line.len().checked_sub(b" HTTP/d.d".len()).map(|at| &line[at..]) {
        Some([b' ', b'H', b'T', b'T', b'P', b'/', major, b'.', minor]) => {
            major.is_ascii_digit() && minor.is_ascii_digit() && *major != b'1'
        }
        _ => false,
    }
}

/// Rewrites a request line's `HTTP/1.x` (x > 1) to `HTTP/1.1` in place, after
/// `parse_head` answered `NewerMinorVersion`. Returns whether it did.
pub fn serve_as_http11(buf: &mut [u8]) -> bool {
    match newer_minor_version(buf) {
        Some(at) => {
            buf[at] = b'1';
            true
        }
        None => false,
    }
}

/// The path of a request target in a form this server takes and, for the
/// absolute form, its authority: the origin form (`/path?query`), the
/// absolute form (`http://host[:port]/path`, RFC 9112 §3.2.2) and, for
/// `OPTIONS` alone, the asterisk form (`*`, §3.2.4). `CONNECT` (the
/// authority form) asks for a tunnel, which this server does not open.
fn request_target<'b>(method: &str, target: &'b [u8]) -> Result<(&'b [u8], Option<&'b [u8]>), HeadError> {
    match method {
        "CONNECT" => Err(HeadError::NotImplemented("CONNECT is not implemented: this server opens no tunnels.")),
        "OPTIONS" if target == b"*" => Ok((target, None)),
        _ => split_target(target).map_err(HeadError::Malformed),
    }
}

const BAD_TARGET_BYTE_MESSAGE: &str =
    "The request target holds a byte a URI may not (a '#' fragment, a backslash, a quote or angle bracket, or non-ASCII).";

const BAD_TARGET_BYTE: HeadError = HeadError::Malformed(BAD_TARGET_BYTE_MESSAGE);

/// Whether every line end of a complete head is CRLF, looking only where
/// httparse ended each line. httparse has already refused any CR not followed
/// by LF, obsolete line folding and extra spaces in the request line, so each
/// header is one line and each line ends right after its value (and optional
/// spaces or tabs). `false` means "not proven", not "malformed".
fn line_ends_are_crlf(buf: &[u8], head_len: usize, path: &str, headers: &[Header]) -> bool {
    let base = buf.as_ptr() as usize;
    let is_cr = |at: usize| buf.get(at) == Some(&b'\r');
    // Leading empty lines, which httparse skips, are left to the exact scan.
    if matches!(buf.first(), Some(b'\r' | b'\n')) {
        return false;
    }
    // `<path> HTTP/1.x` then the line end.
    let path_end = path.as_ptr() as usize - base + path.len();
    if !is_cr(path_end + b" HTTP/1.1".len()) {
        return false;
    }
    for h in headers {
        let mut at = h.value.as_ptr() as usize - base + h.value.len();
        while matches!(buf.get(at), Some(b' ' | b'\t')) {
            at += 1;
        }
        if !is_cr(at) {
            return false;
        }
    }
    buf[..head_len].ends_with(b"\r\n\r\n")
}

/// `name == lower`, ignoring ASCII case, for a `lower` made of lowercase
/// letters, digits and `-` (every field name this server looks for). Eight
/// bytes per step, the last word overlapping the one before it: OR-ing 0x20
/// folds letters and leaves `-` and digits alone.
fn name_is(name: &[u8], lower: &[u8]) -> bool {
    const FOLD: u64 = 0x2020_2020_2020_2020;
    let n = name.len();
    if n != lower.len() {
        return false;
    }
    if n < 8 {
        return name.iter().zip(lower).all(|(x, y)| x | 0x20 == *y);
    }
    words_equal(name, lower, FOLD)
}

/// What the header fields say about framing, the connection and the lock
/// API, gathered in one pass over them, with values as spans of their
/// header block, so a connection's `HeadMemo` can keep them with the
/// block's bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct FieldSpans {
    host: Option<Span>,
    content_length: Option<u64>,
    /// The first `Content-Type`, to refuse a second one that differs.
    content_type: Option<Span>,
    chunked: bool,
    /// `chunked` after codings this server does not implement (`gzip,
    /// chunked`): `501`, unless `Content-Length` came too, which is `400`
    /// whatever the codings (SPEC §4: both at once).
    unimplemented_coding: bool,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    api: ApiSpans,
}

/// Where the values of `ApiFields` lie in their header block.
#[derive(Clone, Copy, Debug, Default)]
struct ApiSpans {
    key: Option<Span>,
    authorization: Option<Span>,
    queue_timeout_ms: Option<Span>,
    no_queue: bool,
    moved: bool,
    placed_as: Option<Span>,
    idempotency_key: Option<Span>,
}

/// What a connection remembers of the heads it sent: its last header blocks
/// and request lines (`memo`), and, for heads that are parsed in full, its
/// last valid `Host`.
#[derive(Default)]
pub struct HeadMemo {
    blocks: BlockMemo<FieldSpans, LineSpans, (Span, Span)>,
    host: KnownHost,
}

/// What httparse read in a request line, as spans of it, and what
/// `RequestLine::check` found in that.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineSpans {
    method: Span,
    target: Span,
    version: u8,
    kind: Method,
    path: Span,
    authority: Option<Span>,
}

/// Where a value lies in its header block.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// `part`'s place in `whole`, of which it is a slice.
    fn within(whole: &[u8], part: &[u8]) -> Span {
        // Heads are at most `MAX_HEAD_BYTES`, so every offset fits.
        Span { start: offset_in(whole, part) as u32, len: part.len() as u32 }
    }

    fn of(self, block: &[u8]) -> &[u8] {
        &block[self.start as usize..][..self.len as usize]
    }

    /// Where the span ends.
    fn end(self) -> usize {
        self.start as usize + self.len as usize
    }

    /// `of` for a span of text.
    fn str_in(self, text: &str) -> Option<&str> {
        text.get(self.start as usize..self.start as usize + self.len as usize)
    }
}

/// Fills `f` from `headers`, whose values are slices of `block` (in place:
/// it is large, and returning it would copy it).
fn scan_fields(headers: &[Header], block: &[u8], f: &mut FieldSpans) -> Result<(), HeadError> {
    for h in headers {
        let name = h.name.as_bytes();
        let value = Span::within(block, h.value);
        // The length dispatch keeps most fields at one integer compare.
        match name.len() {
            4 if name_is(name, b"host") => {
                // Two Hosts are rejected on HTTP/1.0 too: which one a proxy used
                // cannot be known, and `publicHost` routing depends on it.
                if f.host.is_some() {
                    return Err(HeadError::Malformed("The Host header is repeated."));
                }
                f.host = Some(value);
            }
            // Each of these is one value: a second copy is refused, since which
            // one counts would be a guess (a key that passes beside one that
            // does not, a wait budget beside a malformed one).
            13 if name_is(name, b"x-nthpool-key") => {
                once(&mut f.api.key, value, "X-Nthpool-Key is sent twice; send it once.")?
            }
            13 if name_is(name, b"authorization") => {
                once(&mut f.api.authorization, value, "Authorization is sent twice; send it once.")?
            }
            26 if name_is(name, b"x-nthpool-queue-timeout-ms") => {
                once(&mut f.api.queue_timeout_ms, value, "X-Nthpool-Queue-Timeout-Ms is sent twice; send it once.")?
            }
            18 if name_is(name, b"x-nthpool-no-queue") => f.api.no_queue = true,
            15 if name_is(name, b"x-nthpool-moved") => f.api.moved = true,
            14 if name_is(name, b"x-nthpool-pool") => {
                once(&mut f.api.placed_as, value, "X-Nthpool-Pool is sent twice; send it once.")?
            }
            15 if name_is(name, b"idempotency-key") => {
                once(&mut f.api.idempotency_key, value, "Idempotency-Key is sent twice; send it once.")?
            }
            // `100-continue` is the only expectation there is (RFC 9110
            // §10.1.1); a server cannot meet one it does not know: `417`.
            6 if name_is(name, b"expect") => {
                for member in h.value.split(|&b| b == b',').map(trim).filter(|m| !m.is_empty()) {
                    if !member.eq_ignore_ascii_case(b"100-continue") {
                        return Err(HeadError::ExpectationFailed);
                    }
                    f.expect_continue = true;
                }
            }
            10 if name_is(name, b"connection") => {
                for token in h.value.split(|&b| b == b',').map(trim) {
                    if token.eq_ignore_ascii_case(b"close") {
                        f.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        f.keep_alive = true;
                    }
                }
            }
            14 if name_is(name, b"content-length") => {
                let n = parse_content_length(h.value)?;
                if f.content_length.is_some_and(|m| m != n) {
                    return Err(HeadError::Malformed("Content-Length is sent twice with different values."));
                }
                f.content_length = Some(n);
            }
            // One value (RFC 9110 §8.3): two that differ leave the body's
            // type to whoever reads it.
            12 if name_is(name, b"content-type") => match f.content_type {
                Some(first) if trim(first.of(block)) != trim(h.value) => {
                    return Err(HeadError::Malformed("Content-Type is sent twice with different values."));
                }
                Some(_) => {}
                None => f.content_type = Some(value),
            },
            17 if name_is(name, b"transfer-encoding") => {
                // One field holding exactly `chunked`: a list (even split over
                // two fields) would make the body's framing depend on who reads it.
                if f.chunked {
                    return Err(HeadError::Malformed("Transfer-Encoding is repeated."));
                }
                let value = trim(h.value);
                if !value.eq_ignore_ascii_case(b"chunked") {
                    match other_transfer_codings(value) {
                        HeadError::NotImplemented(_) => f.unimplemented_coding = true,
                        malformed => return Err(malformed),
                    }
                }
                f.chunked = true;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a field's value may change from head to head without changing
/// what a remembered block was judged to be (`memo`: a trace id, a request
/// id). Not for the fields `scan_fields` reads, nor for `X-Forwarded-For`,
/// from which the client's address is taken and kept with a verdict
/// (`api::verdict`), nor for any other field a check of this server reads:
/// `X-Nthpool-*`, the key in `x-api-key`, `Forwarded`, `Upgrade`, `Cookie`,
/// Cloudflare's token and the hop-by-hop fields.
fn value_may_vary(name: &[u8]) -> bool {
    const READ: [&[u8]; 17] = [
        b"host",
        b"authorization",
        b"x-api-key",
        b"idempotency-key",
        b"expect",
        b"connection",
        b"content-length",
        b"content-type",
        b"transfer-encoding",
        b"x-forwarded-for",
        b"forwarded",
        b"upgrade",
        b"cookie",
        b"cf-access-jwt-assertion",
        b"te",
        b"trailer",
        b"keep-alive",
    ];
    let starts = |prefix: &[u8]| name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix);
    !starts(b"x-nthpool-") && !starts(b"proxy-") && !READ.iter().any(|read| name_is(name, read))
}

const UNIMPLEMENTED_CODING: HeadError = HeadError::NotImplemented("Only the chunked transfer coding is implemented.");

/// The refusal of a `Transfer-Encoding` other than `chunked` alone. A list
/// of codings, each a token and only the last `chunked`, names codings
/// this server does not implement: `501` (RFC 9112 §6.1). Anything else is
/// framing that cannot be read: chunked not last or applied twice (§6.1,
/// §6.3), an empty member, a parameter, or no chunked at all: `400`.
fn other_transfer_codings(value: &[u8]) -> HeadError {
    let mut codings = value.split(|&b| b == b',').map(trim);
    let last_is_chunked = codings.next_back().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
    let others_are_codings =
        codings.all(|c| !c.is_empty() && c.iter().all(|&b| is_tchar(b)) && !c.eq_ignore_ascii_case(b"chunked"));
    if value.contains(&b',') && last_is_chunked && others_are_codings {
        UNIMPLEMENTED_CODING
    } else {
        HeadError::Malformed("Transfer-Encoding must be exactly 'chunked'.")
    }
}

/// Takes the value of a field that may appear once; a second is refused
/// with `why`.
fn once(slot: &mut Option<Span>, value: Span, why: &'static str) -> Result<(), HeadError> {
    if slot.replace(value).is_some() {
        return Err(HeadError::Malformed(why));
    }
    Ok(())
}

/// `1*DIGIT` around optional spaces or tabs; no sign, no list. A number past
/// `u64::MAX` is no length this server can frame a body by (RFC 9110 §8.6
/// has the recipient guard against overflow): malformed, as a chunk size
/// past it is.
pub(crate) fn parse_content_length(value: &[u8]) -> Result<u64, HeadError> {
    const BAD: HeadError = HeadError::Malformed("Content-Length must be a plain decimal number.");
    let digits = trim(value);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BAD);
    }
    // `1*DIGIT` allows `007`, but a reader that takes a leading zero for
    // octal frames the body differently: nobody sends one who means well.
    if digits.len() > 1 && digits[0] == b'0' {
        return Err(HeadError::Malformed("Content-Length has a leading zero."));
    }
    let mut n: u64 = 0;
    for &b in digits {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(HeadError::Malformed("Content-Length is too large a number."))?;
    }
    Ok(n)
}

/// Every LF must follow a CR and every CR precede an LF, and no line may start
/// with whitespace (obsolete folding). One scan over the head, eight bytes at a
/// time: only the CR and LF bytes are looked at, each judged with its
/// neighbours, so skipping everything else is exact.
/// A CR as the last byte of a partial head is left for the next call.
fn check_line_endings(head: &[u8]) -> Result<(), HeadError> {
    let mut words = head.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let mut found = bytes_equal(w, b'\r') | bytes_equal(w, b'\n');
        while found != 0 {
            check_line_byte(head, at + (found.trailing_zeros() / 8) as usize)?;
            found &= found - 1;
        }
        at += 8;
    }
    for i in at..head.len() {
        check_line_byte(head, i)?;
    }
    Ok(())
}

fn check_line_byte(head: &[u8], i: usize) -> Result<(), HeadError> {
    match head[i] {
        b'\n' => {
            if i == 0 || head[i - 1] != b'\r' {
                return Err(HeadError::Malformed("Lines of the request head must end with CRLF, not a bare LF."));
            }
            if let Some(b' ' | b'\t') = head.get(i + 1) {
                return Err(HeadError::Malformed(if ends_the_request_line(head, i) {
                    "Whitespace between the request line and the first header field is not accepted."
                } else {
                    "Obsolete line folding is not accepted."
                }));
            }
        }
        b'\r' if head.get(i + 1).is_some_and(|&next| next != b'\n') => {
            return Err(HeadError::Malformed("A CR in the request head must be followed by LF."));
        }
        _ => {}
    }
    Ok(())
}

/// Whether the LF at `i` ends the request line (the first line after any
/// empty ones): whitespace after it starts no folded value, as there is no
/// field before it to fold into (RFC 9112 §2.2).
fn ends_the_request_line(head: &[u8], i: usize) -> bool {
    let start = head.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(head.len());
    head[start..].iter().position(|&b| b == b'\n').map(|n| start + n) == Some(i)
}

const MORE_THAN_THREE_WORDS: &str =
    "The request line has more than a method, a target and a version; a space in a target is sent as %20.";

/// Why httparse refused the head in `buf` (`e`), in a sentence. Out of line,
/// so the refusals' reading costs the request path nothing.
#[cold]
#[inline(never)]
fn refused(buf: &[u8], e: httparse::Error) -> HeadError {
    // Line ends first, so a folded or bare-LF line is named as such
    // whichever byte httparse stumbled on; only the head's, as the
    // bytes after it are not part of it.
    if let Err(bare) = check_line_endings(complete_head(buf).unwrap_or(buf)) {
        return bare;
    }
    HeadError::Malformed(match e {
        // httparse reads the third word as the version: a line with
        // more words than three (a space in the target) ends there.
        httparse::Error::Version if more_than_three_words(buf) => MORE_THAN_THREE_WORDS,
        // httparse stops at a byte past ASCII in the target before
        // the target's own check could name it.
        httparse::Error::Token if target_so_far_past_ascii(buf) => BAD_TARGET_BYTE_MESSAGE,
        e => httparse_reason(e),
    })
}

/// Whether the first line of `buf` has more than two spaces.
fn more_than_three_words(buf: &[u8]) -> bool {
    whole_first_line(buf).is_some_and(|line| line.iter().filter(|&&b| b == b' ').nth(2).is_some())
}

/// Whether the target of the request line in `buf`, as far as it came
/// (after the empty lines a request line may follow), holds a byte past ASCII.
fn target_so_far_past_ascii(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    let line = buf[start..].split(|&b| b == b'\n').next().unwrap_or_default();
    line.split(|&b| b == b' ').nth(1).is_some_and(|target| !target.is_ascii())
}

/// The first line of `buf` without its line end, once that has come.
fn whole_first_line(buf: &[u8]) -> Option<&[u8]> {
    let line_end = buf.iter().position(|&b| b == b'\n')?;
    Some(buf[..line_end].strip_suffix(b"\r").unwrap_or(&buf[..line_end]))
}

fn httparse_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "A header name is invalid.",
        httparse::Error::HeaderValue => "A header value contains an invalid byte.",
        // The line ends are right (checked first): the request line goes on
        // after its version (`HTTP/1.10`, `HTTP/1.1 x`).
        httparse::Error::NewLine => "The request line goes on after its HTTP version.",
        httparse::Error::Version => "Only HTTP/1.0 and HTTP/1.1 are served.",
        httparse::Error::Token | httparse::Error::Status | httparse::Error::TooManyHeaders => {
            "The request line is invalid."
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::target::implied_slash;
    use proptest::prelude::*;

    #[test]
    fn a_refused_head_still_names_the_pool_the_router_moved() {
        let moved = b"POST /p HTTP/1.1\r\nHost: h\r\nX-Nthpool-Key: k\r\nX-Nthpool-Key: k\r\nx-nthpool-moved: n3\r\nX-Nthpool-Pool:  demo \r\n\r\nX-Nthpool-Pool: body";
        assert_eq!(moved_placed_as(moved), Some(&b"demo"[..]));
        let not_moved = b"POST /p HTTP/1.1\r\nHost: h\r\nX-Nthpool-Pool: demo\r\n\r\nX-Nthpool-Moved: n3\r\n";
        assert_eq!(moved_placed_as(not_moved), None, "a field past the head's end is none of it");
        let twice = b"POST /p HTTP/1.1\r\nX-Nthpool-Moved: n3\r\nX-Nthpool-Pool: a\r\nX-Nthpool-Pool: b\r\n\r\n";
        assert_eq!(moved_placed_as(twice), None);
        assert_eq!(moved_placed_as(b"POST /p HTTP/1.1\r\nX-Nthpool-Moved: n3\r\n\r\n"), None);
    }

    #[test]
    fn another_major_version_is_its_own_error() {
        for raw in [&b"POST / HTTP/2.0\r\nHost: h\r\n\r\n"[..], b"GET / HTTP/0.9\r\n\r\n", b"GET / HTTP/3.0\r\n\r\n"] {
            let mut storage = header_storage();
            let got = parse_head(raw, &mut storage).map(|_| ());
            assert_eq!(got, Err(HeadError::OtherMajorVersion), "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn a_version_verdict_waits_for_the_whole_request_line() {
        for line in
            [&b"GET / HTTP/3.0"[..], b"PRI * HTTP/2.0", b"GET / HTTP/0.9", b"POST / HTTP/1.2", b"POST / HTTP/1.x"]
        {
            for cut in 1..=line.len() {
                let mut storage = header_storage();
                let got = parse_head(&line[..cut], &mut storage).map(|h| h.is_some());
                assert_eq!(got, Ok(false), "{} cut at {cut}", String::from_utf8_lossy(line));
            }
        }
    }

    #[test]
    fn too_many_fields_is_judged_on_the_head_alone_once_it_is_whole() {
        let mut head = b"POST / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for i in 0..80 {
            head.extend_from_slice(format!("X-F{i}: v\r\n").as_bytes());
        }
        let mut storage = header_storage();
        assert_eq!(parse_head(&head, &mut storage).map(|h| h.is_some()), Ok(false), "the empty line is still to come");
        head.extend_from_slice(b"\r\n");
        for after in [&b""[..], b"{}\n", b"\r\n x", b"{\r}", b"GET / HTTP/1.1\n\n"] {
            let raw = [&head[..], after].concat();
            let mut storage = header_storage();
            let got = parse_head(&raw, &mut storage).map(|_| ());
            assert_eq!(got, Err(HeadError::TooManyFields), "followed by {:?}", String::from_utf8_lossy(after));
        }
        // A bare LF inside such a head is named, as in any head.
        let mut bare = head.clone();
        bare[20] = b'\n';
        let mut storage = header_storage();
        assert!(matches!(parse_head(&bare, &mut storage), Err(HeadError::Malformed(_))));
    }

    #[test]
    fn a_malformed_head_is_named_for_what_is_wrong_with_it() {
        for (raw, why) in [
            (&b"POST / HTTP/1.10\r\nHost: h\r\n\r\n"[..], "The request line goes on after its HTTP version."),
            (b"POST / HTTP/1.1 x\r\nHost: h\r\n\r\n", "The request line goes on after its HTTP version."),
            (b"POST / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n b\r\n\r\n", "Obsolete line folding is not accepted."),
            (
                b"POST / HTTP/1.1\r\n Host: h\r\n\r\n",
                "Whitespace between the request line and the first header field is not accepted.",
            ),
            (
                b"\r\nPOST / HTTP/1.1\r\n\tHost: h\r\n\r\n",
                "Whitespace between the request line and the first header field is not accepted.",
            ),
            (b"POST / HTTP/1.x\r\nHost: h\r\n\r\n", "Only HTTP/1.0 and HTTP/1.1 are served."),
            (b"POST /a b HTTP/1.1\r\nHost: h\r\n\r\n", MORE_THAN_THREE_WORDS),
            (b"Extra lineGET / HTTP/1.1\r\nHost: h\r\n\r\n", MORE_THAN_THREE_WORDS),
        ] {
            let mut storage = header_storage();
            let got = parse_head(raw, &mut storage).map(|_| ());
            assert_eq!(got, Err(HeadError::Malformed(why)), "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn field_names_match_without_case_and_only_whole() {
        for lower in [&b"host"[..], b"expect", b"x-nthpool-key", b"content-length", b"x-nthpool-queue-timeout-ms"] {
            assert!(name_is(lower, lower));
            assert!(name_is(&lower.to_ascii_uppercase(), lower));
            assert!(!name_is(&lower[1..], lower), "shorter");
            for at in 0..lower.len() {
                let mut other = lower.to_vec();
                other[at] = if other[at] == b'x' { b'y' } else { b'x' };
                assert!(!name_is(&other, lower), "{} differs at {at}", String::from_utf8_lossy(&other));
            }
        }
    }

    /// Parses `raw` and hands the result to `check`, since `Head` borrows locals.
    fn with_head<R>(raw: &[u8], check: impl FnOnce(Result<Option<Head<'_>>, HeadError>) -> R) -> R {
        let mut storage = header_storage();
        check(parse_head(raw, &mut storage))
    }

    /// The parts of a complete head that tests compare.
    fn summary(raw: &[u8]) -> (Method, bool, bool, BodyFraming, bool, usize) {
        with_head(raw, |r| {
            let h = r.expect("valid head").expect("complete head");
            (h.method, h.http11, h.keep_alive, h.framing, h.expect_continue, h.head_len)
        })
    }

    fn error(raw: &[u8]) -> HeadError {
        with_head(raw, |r| match r {
            Err(e) => e,
            Ok(h) => panic!("accepted {:?}: {h:?}", String::from_utf8_lossy(raw)),
        })
    }

    fn is_malformed(raw: &[u8]) -> bool {
        matches!(error(raw), HeadError::Malformed(_))
    }

    fn incomplete(raw: &[u8]) -> bool {
        with_head(raw, |r| matches!(r, Ok(None)))
    }

    #[test]
    fn simple_get_keeps_alive_on_1_1() {
        let raw = b"GET /v1/pools?x=1 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n";
        with_head(raw, |r| {
            let h = r.unwrap().unwrap();
            assert_eq!(h.method, Method::Get);
            assert_eq!(h.path, b"/v1/pools?x=1");
            assert!(h.http11);
            assert!(h.keep_alive);
            assert_eq!(h.framing, BodyFraming::None);
            assert!(!h.expect_continue);
            assert_eq!(h.host, Some(&b"example.com:8080"[..]));
            assert_eq!(h.head_len, raw.len());
            assert_eq!(h.headers.count(), 1);
        });
    }

    #[test]
    fn head_len_stops_before_body_and_pipelined_bytes() {
        let head = b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n";
        let mut raw = head.to_vec();
        raw.extend_from_slice(b"{}GET / HTTP/1.1\r\n");
        let s = summary(&raw);
        assert_eq!(s.0, Method::Post);
        assert_eq!(s.3, BodyFraming::Length(2));
        assert_eq!(s.5, head.len());
    }

    #[test]
    fn connection_rules_for_1_0_and_1_1() {
        let ka = |raw: &[u8]| summary(raw).2;
        assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: CLOSE\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade ,\tclose\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: closed\r\n\r\n"));
    }

    #[test]
    fn http_1_0_needs_no_host() {
        let s = summary(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!s.1);
        with_head(b"GET / HTTP/1.0\r\n\r\n", |r| assert_eq!(r.unwrap().unwrap().host, None));
    }

    #[test]
    fn methods() {
        let m = |raw: &[u8]| summary(raw).0;
        assert_eq!(m(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n"), Method::Head);
        assert_eq!(m(b"POST / HTTP/1.1\r\nHost: h\r\n\r\n"), Method::Post);
        assert_eq!(m(b"DELETE / HTTP/1.1\r\nHost: h\r\n\r\n"), Method::Other);
        // Methods are case-sensitive.
        assert_eq!(m(b"post / HTTP/1.1\r\nHost: h\r\n\r\n"), Method::Other);
    }

    #[test]
    fn content_length_framing() {
        let f = |raw: &[u8]| summary(raw).3;
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 42\r\n\r\n"), BodyFraming::Length(42));
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\ncontent-length:\t7 \r\n\r\n"), BodyFraming::Length(7));
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"), BodyFraming::None);
        for zeros in ["00", "007", "0200", " 01 "] {
            let raw = format!("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: {zeros}\r\n\r\n");
            assert!(is_malformed(raw.as_bytes()), "{zeros}");
        }
        // Past u64 is no length at all; u64::MAX itself is one (too large for
        // any body limit, refused as such by the caller).
        assert!(is_malformed(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n"));
        assert!(is_malformed(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n"));
        assert_eq!(
            f(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n"),
            BodyFraming::Length(u64::MAX)
        );
        // Identical duplicates say the same thing to every reader.
        assert_eq!(
            f(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            BodyFraming::Length(5)
        );
        // HTTP/1.0 bodies are framed by Content-Length.
        assert_eq!(f(b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n"), BodyFraming::Length(3));
    }

    #[test]
    fn a_second_content_type_must_say_the_same() {
        let ct =
            |a: &str, b: &str| format!("POST / HTTP/1.1\r\nHost: h\r\nContent-Type: {a}\r\ncontent-type:{b}\r\n\r\n");
        assert!(is_malformed(ct("text/plain", "text/html").as_bytes()));
        assert!(is_malformed(ct("application/json", "application/json; charset=utf-8").as_bytes()));
        assert_eq!(summary(ct("application/json", " application/json ").as_bytes()).3, BodyFraming::None);
    }

    #[test]
    fn chunked_framing() {
        let f = |raw: &[u8]| summary(raw).3;
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"), BodyFraming::Chunked);
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding: CHUNKED \r\n\r\n"), BodyFraming::Chunked);
        // A tab is optional whitespace like a space (RFC 9110 OWS), so it is not a
        // second reading of the field.
        assert_eq!(f(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \tchunked\r\n\r\n"), BodyFraming::Chunked);
        // Other codings before chunked are codings not implemented; chunked
        // twice, an empty member or a parameter is framing that cannot be read.
        let te =
            |value: &str| error(format!("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: {value}\r\n\r\n").as_bytes());
        for unimplemented in ["gzip, chunked", "gzip,deflate , chunked", "x-custom,chunked"] {
            assert!(matches!(te(unimplemented), HeadError::NotImplemented(_)), "{unimplemented}");
        }
        for malformed in [
            "chunked, chunked",
            ", chunked",
            "gzip,, chunked",
            "gzip;q=1, chunked",
            "chunked, gzip",
            "gzip",
            "g zip, chunked",
        ] {
            assert!(matches!(te(malformed), HeadError::Malformed(_)), "{malformed}");
        }
    }

    #[test]
    fn expect_continue() {
        let e = |raw: &[u8]| summary(raw).4;
        assert!(e(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
        assert!(e(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nexpect: 100-Continue\r\n\r\n"));
        assert!(e(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: , 100-continue ,\r\n\r\n"));
        assert!(!e(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect:\r\n\r\n"));
        assert!(!e(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n"));
        for other in ["200-ok", "100-continue, x", "100-continue;a=b", "continue"] {
            let mut storage = header_storage();
            let raw = format!("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: {other}\r\n\r\n");
            assert!(matches!(parse_head(raw.as_bytes(), &mut storage), Err(HeadError::ExpectationFailed)), "{other}");
        }
    }

    #[test]
    fn header_lookup_is_case_insensitive_and_first_wins() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-Api-Key: one\r\nx-api-key: two\r\n\r\n";
        with_head(raw, |r| {
            let h = r.unwrap().unwrap();
            assert_eq!(h.header("x-api-key"), Some(&b"one"[..]));
            assert_eq!(h.header("host"), Some(&b"h"[..]));
            assert_eq!(h.header("authorization"), None);
        });
    }

    #[test]
    fn leading_empty_line_is_skipped() {
        let raw = b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(summary(raw).5, raw.len());
    }

    #[test]
    fn incomplete_heads() {
        assert!(incomplete(b""));
        assert!(incomplete(b"GET / HTTP/1.1\r\nHost: h\r\n"));
        assert!(incomplete(b"GET / HTTP/1.1\r\nHost: h\r\n\r"));
        assert!(incomplete(b"GET /pa"));
    }

    #[test]
    fn too_large_heads() {
        let mut big = b"GET / HTTP/1.1\r\nHost: h\r\nX-Pad: ".to_vec();
        big.resize(MAX_HEAD_BYTES + 1, b'a');
        assert_eq!(error(&big), HeadError::TooLarge);
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(error(&big), HeadError::TooLarge);

        // A request line that alone runs past the limit: in its target (whole
        // or still coming), or in its method (with no space at all, too).
        let line = |method: usize, target: usize, end: &str| {
            let mut raw = vec![b'G'; method];
            raw.extend_from_slice(b" /");
            raw.resize(method + 1 + target, b'a');
            raw.extend_from_slice(end.as_bytes());
            raw
        };
        let rest = " HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(error(&line(3, MAX_HEAD_BYTES, rest)), HeadError::TargetTooLong);
        assert_eq!(error(&line(3, MAX_HEAD_BYTES, "")), HeadError::TargetTooLong);
        assert_eq!(error(&[&b"\r\n"[..], &line(3, MAX_HEAD_BYTES, "")].concat()), HeadError::TargetTooLong);
        assert_eq!(error(&line(MAX_HEAD_BYTES / 2, MAX_HEAD_BYTES / 2 + 8, "")), HeadError::TargetTooLong);
        assert!(is_malformed(&line(3, MAX_HEAD_BYTES - 8, " HTTP/1.1 and on and on")), "a line past its version");
        assert!(is_malformed(&line(MAX_HEAD_BYTES + 1, 4, rest)));
        assert!(is_malformed(&vec![b'G'; MAX_HEAD_BYTES + 1]));

        let mut many = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for _ in 0..MAX_HEADERS {
            many.extend_from_slice(b"X-A: b\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(error(&many), HeadError::TooManyFields);
    }

    #[test]
    fn largest_allowed_head_is_accepted() {
        let mut raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-Pad: ".to_vec();
        raw.resize(MAX_HEAD_BYTES - 4, b'a');
        raw.extend_from_slice(b"\r\n\r\n");
        assert_eq!(summary(&raw).5, MAX_HEAD_BYTES);

        let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
        for _ in 0..MAX_HEADERS - 1 {
            raw.extend_from_slice(b"X-A: b\r\n");
        }
        raw.extend_from_slice(b"Host: h\r\n\r\n");
        assert_eq!(summary(&raw).5, raw.len());
    }

    #[test]
    fn bare_lf_and_cr_are_rejected() {
        assert!(is_malformed(b"GET / HTTP/1.1\nHost: h\n\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\n\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\r\n\r\n"));
        // Found before the head is complete, so no waiting for the head timeout.
        assert!(is_malformed(b"GET / HTTP/1.1\nHost: h"));
    }

    #[test]
    fn host_rules() {
        assert!(is_malformed(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"));
    }

    #[test]
    fn request_smuggling_vectors() {
        let cl_te = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\
                      Transfer-Encoding: chunked\r\n\r\n";
        let te_cl = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\
                      Content-Length: 6\r\n\r\n";
        for raw in [
            &cl_te[..],
            &te_cl[..],
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding\t: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\n Transfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\
              Transfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\
              Transfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\x0b\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \"chunked\"\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5,5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5.0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n\tTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(is_malformed(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        // Each refusal says what is wrong: a list or a hex number is not a
        // leading zero.
        for (value, message) in [
            ("0, 0", "Content-Length must be a plain decimal number."),
            ("0x5", "Content-Length must be a plain decimal number."),
            ("05", "Content-Length has a leading zero."),
            ("99999999999999999999", "Content-Length is too large a number."),
        ] {
            assert_eq!(parse_content_length(value.as_bytes()), Err(HeadError::Malformed(message)), "{value}");
        }
        let gzip = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert!(matches!(error(gzip), HeadError::NotImplemented(_)));
        let both = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n";
        assert!(matches!(error(both), HeadError::Malformed(_)), "both at once is 400, whatever the codings");
    }

    #[test]
    fn absolute_form_and_later_minor_versions() {
        with_head(b"POST http://h:1/pools/p?x HTTP/1.1\r\nHost: other\r\n\r\n", |r| {
            let h = r.unwrap().unwrap();
            assert_eq!((h.path, h.host), (&b"/pools/p?x"[..], Some(&b"h:1"[..])));
        });
        assert!(is_malformed(b"GET http://a@h/ HTTP/1.1\r\nHost: h\r\n\r\n"));
        with_head(b"GET http://h:1?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", |r| {
            let h = r.unwrap().unwrap();
            assert_eq!((h.path, h.host), (&b"?x=1"[..], Some(&b"h:1"[..])));
            assert_eq!(implied_slash(h.path), b"/");
        });
        with_head(b"GET http://h HTTP/1.1\r\nHost: h\r\n\r\n", |r| assert_eq!(r.unwrap().unwrap().path, b"/"));
        assert_eq!(implied_slash(b"/?x=1"), b"");
        let mut raw = *b"GET / HTTP/1.2\r\nHost: h\r\n\r\n";
        assert_eq!(error(&raw), HeadError::NewerMinorVersion);
        assert!(serve_as_http11(&mut raw));
        assert!(summary(&raw).1, "served as HTTP/1.1");
        let gone = b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n";
        assert!(!summary(gone).4, "no 100-continue for HTTP/1.0");
    }

    #[test]
    fn request_line_rules() {
        with_head(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", |r| {
            let h = r.unwrap().unwrap();
            assert_eq!((h.method_name, h.path), ("OPTIONS", &b"*"[..]));
        });
        assert!(matches!(error(b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n"), HeadError::NotImplemented(_)));
        for target in ["/a#b", "/a\\b", "/a?x=\"1\"", "/<a>", "/a`b", "/caf\u{e9}", "/x?#"] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
            assert!(is_malformed(raw.as_bytes()), "{target}");
        }
        for target in ["/a?b={c}|d^e[0]", "/%23%5C", "/a;b=c!$&'()*+,:@~"] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
            with_head(raw.as_bytes(), |r| assert_eq!(r.unwrap().unwrap().path, target.as_bytes()));
        }
        for raw in [
            &b"GET * HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"OPTIONS *x HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET h/ HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / http/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/2\r\nHost: h\r\n\r\n",
            b"GET / HTTP/a.0\r\nHost: h\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / a HTTP/1.1\r\nHost: h\r\n\r\n",
            b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert!(is_malformed(raw), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn bad_header_bytes() {
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\nX A: b\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\n: b\r\n\r\n"));
        assert!(is_malformed(b"GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n"));
    }

    #[test]
    fn may_be_complete_looks_only_at_new_bytes() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n";
        // Every split of a valid head: once a first parse found it partial, the
        // earlier part never triggers another, the whole always does, whichever
        // read brought the last byte. Nothing parsed yet means parse at once.
        for cut in 1..raw.len() {
            assert!(!head_may_be_complete(&raw[..cut], 1), "cut {cut}");
            assert!(head_may_be_complete(raw, cut), "cut {cut}");
        }
        assert!(head_may_be_complete(b"GET", 0));
        assert!(!head_may_be_complete(raw, raw.len()));
        assert!(!head_may_be_complete(b"GET / HTTP/1.1\r\nHost: h\r\n", 3));
    }

    #[test]
    fn may_be_complete_flags_bad_endings_and_overflow() {
        assert!(head_may_be_complete(b"GET / HTTP/1.1\n", 0));
        assert!(head_may_be_complete(b"\n", 0));
        assert!(head_may_be_complete(b"GET / HTTP/1.1\rX", 15));
        assert!(!head_may_be_complete(b"GET / HTTP/1.1\r", 1));
        assert!(head_may_be_complete(b"GET / HTTP/1.1\r\nX: \x00", 16), "a NUL opens the gate");
        assert!(head_may_be_complete(b"GET /\xcf", 4), "so does a non-ASCII byte");
        let big = vec![b'a'; MAX_HEAD_BYTES + 1];
        assert!(head_may_be_complete(&big, MAX_HEAD_BYTES));
        assert!(!head_may_be_complete(&big[..MAX_HEAD_BYTES], 1));
    }

    #[test]
    fn may_be_complete_agrees_with_parse_when_fed_byte_by_byte() {
        // The caller only parses when the helper says so; it must still see the
        // same outcome as parsing after every byte.
        let cases: [&[u8]; 4] = [
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
            b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n",
            b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
        ];
        for raw in cases {
            let mut searched = 0;
            let mut gated = None;
            for end in 1..=raw.len() {
                let buf = &raw[..end];
                let decided = with_head(buf, |r| match r {
                    Ok(None) => None,
                    Ok(Some(h)) => Some(Ok(h.head_len)),
                    Err(e) => Some(Err(e)),
                });
                if head_may_be_complete(buf, searched) {
                    gated = decided;
                    if gated.is_some() {
                        break;
                    }
                } else {
                    assert_eq!(decided, None, "{:?} at {end}", String::from_utf8_lossy(raw));
                }
                searched = end;
            }
            assert!(gated.is_some(), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    /// Everything a parse says (a head's fields included), owned, so two
    /// parses can be compared: all but where the head came from (`recall`).
    fn digest(r: Result<Option<Head<'_>>, HeadError>) -> String {
        // A target whose check was left to the reader is checked here, as
        // every reader of one does.
        let r = r.and_then(|h| match h {
            Some(h) => h.check_target().map(|()| Some(Head { recall: None, target_checked: true, ..h })),
            None => Ok(None),
        });
        // The fields read from the end too, as `X-Forwarded-For` is.
        let backwards = format!("{:?}", r.as_ref().map(|h| h.as_ref().map(|h| h.headers.rev().collect::<Vec<_>>())));
        format!("{r:?} {backwards}")
    }

    #[test]
    fn a_known_host_stands_in_for_the_check_only_when_equal() {
        let mut known = KnownHost::default();
        assert!(known.check(b"127.0.0.1:7070"));
        assert!(known.check(b"127.0.0.1:7070"));
        // A different value is checked again, and a bad one is not remembered.
        for bad in ["127.0.0.1:7070/", "127.0.0.1:707", "127.0.0.1 7070", "exa mple"] {
            let valid = valid_host(bad.as_bytes());
            assert_eq!(known.check(bad.as_bytes()), valid, "{bad}");
            assert_eq!(known.check(bad.as_bytes()), valid, "{bad} again");
        }
        let long = format!("{}.example", "a".repeat(80));
        assert!(known.check(long.as_bytes()));
        assert!(!known.check(format!("{long} x").as_bytes()));
        assert!(!known.check(b""));
    }

    #[test]
    fn header_fields_read_each_field_as_httparse_does() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-A:\r\nX-B: \t v  w \t\r\nx-c:v:w\r\nX-D:  \r\n\r\nbody";
        let mut fields = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut fields);
        req.parse(raw).unwrap();
        let expected: Vec<_> = req.headers.iter().map(|h| (h.name.as_bytes(), h.value)).collect();
        with_head(raw, |r| {
            let h = r.unwrap().unwrap();
            assert_eq!(h.headers.map(|f| (f.name, f.value)).collect::<Vec<_>>(), expected);
            let mut backwards: Vec<_> = h.headers.rev().map(|f| (f.name, f.value)).collect();
            backwards.reverse();
            assert_eq!(backwards, expected);
            assert_eq!(h.header("x-b"), Some(&b"v  w"[..]));
            assert_eq!(h.header("x-d"), Some(&b""[..]));
        });
        // The lock API's fields come without the white space around them too.
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-Nthpool-Key: \t k \t\r\nAuthorization:  Bearer t \r\n\r\n";
        with_head(raw, |r| {
            let h = r.unwrap().unwrap();
            assert_eq!((h.api.key(), h.api.authorization()), (Some(&b"k"[..]), Some(&b"Bearer t"[..])));
        });
    }

    #[test]
    fn uri_ascii_takes_printable_ascii_without_space_only() {
        for b in 0..=255u8 {
            let want = (b'!'..=b'~').contains(&b);
            // In every place of a word and of the bytes after the last word.
            for len in 1..20 {
                for at in 0..len {
                    let mut t = vec![b'a'; len];
                    t[at] = b;
                    assert_eq!(uri_ascii(&t), want, "{b:#x} at {at} of {len}");
                }
            }
        }
        assert!(uri_ascii(b""));
    }

    /// Heads built from pieces, good and bad, for the memo property below.
    /// Slot-like ids of three bytes make lines of one length that differ
    /// only in their target, with bytes httparse refuses or takes among them.
    fn request_line() -> impl Strategy<Value = Vec<u8>> {
        let method = prop_oneof![Just("GET"), Just("PUT"), Just("POST"), Just("PATCH"), Just("G T")];
        let target = prop_oneof![
            Just(b"/pools/p/lock/acquire".to_vec()),
            "[a-z0-9]{1,30}".prop_map(|id| format!("/pools/p/lock/{id}/release").into_bytes()),
            release_target(),
            Just(b"http://h:1/pools/p/lock/acquire".to_vec()),
            Just(b"nope".to_vec()),
        ];
        let version = prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0"), Just("HTTP/1.3")];
        let end = prop_oneof![8 => Just("\r\n"), 1 => Just("\n")];
        (method, target, version, end)
            .prop_map(|(m, t, v, e)| [m.as_bytes(), b" ", &t, b" ", v.as_bytes(), e.as_bytes()].concat())
    }

    /// Nothing (origin form), or the scheme and authority of an absolute-form
    /// target, of one length, good and bad.
    fn authority() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just(""),
            Just("http://h:1"),
            Just("http://h:2"),
            Just("HTTP://h:9"),
            Just("http://h,1"),
            Just("http://h?1")
        ]
    }

    /// A release target whose slot id is three bytes, good or bad for a target.
    fn release_target() -> impl Strategy<Value = Vec<u8>> {
        let id_byte = prop::sample::select(vec![
            &b"a"[..],
            b"Z",
            b"~",
            b"!",
            b"%",
            b"?",
            b"/",
            b"#",
            b"\\",
            b"\"",
            b"<",
            b"`",
            b"{",
            b" ",
            b"\t",
            b"\x7f",
            b"\x00",
            b"\x80",
            b"\xff",
            "\u{e9}".as_bytes(),
        ]);
        prop::collection::vec(id_byte, 3).prop_map(|id| [&b"/pools/p/lock/"[..], &id.concat(), b"/release"].concat())
    }

    /// A field of a header block: good or bad as it stands, or a name whose
    /// three-byte value is new in every head (`fill`).
    #[derive(Clone, Debug)]
    enum Part {
        Fixed(&'static str),
        Varying(&'static str),
    }

    fn part() -> impl Strategy<Value = Part> {
        // Names the server reads, and one it does not.
        let names =
            prop::sample::select(vec!["Traceparent", "X-Nthpool-Key", "X-Forwarded-For", "Host", "Content-Length"]);
        prop_oneof![3 => fixed_field().prop_map(Part::Fixed), 2 => names.prop_map(Part::Varying)]
    }

    /// A value for a `Part::Varying`: mostly visible characters.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            12 => prop::sample::select(b"0123456789abcdef-~!\"(@/[".to_vec()),
            1 => prop::sample::select(b" \t\r\n\x00\x7f\x80\xff,:".to_vec()),
        ];
        prop::collection::vec(byte, 3)
    }

    /// The header block `parts` make with `values` for its varying fields.
    fn fill(parts: &[Part], values: &[Vec<u8>]) -> Vec<u8> {
        let mut values = values.iter().cycle();
        let mut block = Vec::new();
        for part in parts {
            match part {
                Part::Fixed(field) => block.extend_from_slice(field.as_bytes()),
                Part::Varying(name) => {
                    let value = values.next().expect("values to fill with");
                    block.extend_from_slice(&[name.as_bytes(), b": ", value, b"\r\n"].concat());
                }
            }
        }
        block.extend_from_slice(b"\r\n");
        block
    }

    fn fixed_field() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("Host: 127.0.0.1:7070\r\n"),
            Just("Host: exa mple\r\n"),
            Just("host:h\r\n"),
            Just("X-Nthpool-Key: k1\r\n"),
            Just("x-nthpool-key:  k2 \r\n"),
            Just("Authorization: Bearer t\r\n"),
            Just("Content-Length: 0\r\n"),
            Just("Content-Length: 14\r\n"),
            Just("Content-Length: 1x\r\n"),
            Just("Transfer-Encoding: chunked\r\n"),
            Just("Transfer-Encoding: gzip, chunked\r\n"),
            Just("Connection: close\r\n"),
            Just("Connection: keep-alive\r\n"),
            Just("Expect: 100-continue\r\n"),
            Just("X-Nthpool-Queue-Timeout-Ms: 50\r\n"),
            Just("X-Nthpool-No-Queue: 1\r\n"),
            Just("Idempotency-Key: abc\r\n"),
            Just("Content-Type: application/json\r\n"),
            Just("X-Trace: 1\r\n"),
            Just("X-Trace: 2\n"),
            Just(" folded\r\n"),
            Just("Bad Name: v\r\n"),
        ]
    }

    fn block() -> impl Strategy<Value = Vec<Part>> {
        prop::collection::vec(part(), 0..6)
    }

    proptest::proptest! {
        /// After a good head is remembered, heads with its header block and
        /// a request line of the same length that differs in the method, the
        /// target (any bytes, good or bad) or the version get a fresh parse's
        /// verdict: the line read by comparison is exactly httparse's.
        #[test]
        fn a_line_like_the_remembered_one_gets_a_fresh_verdict(
            first_authority in prop_oneof![Just(""), Just("http://h:1"), Just("HTTP://h:9")],
            first_version in prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0")],
            lines in prop::collection::vec(
                (prop_oneof![Just("POST"), Just("PUSH"), Just("P\x01ST")], authority(), release_target(),
                 prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0"), Just("HTTP/1.3"), Just("HTTP/1.1 ")]),
                1..12,
            ),
        ) {
            let block = &b"Host: h\r\nContent-Length: 0\r\n\r\n"[..];
            let mut memo = HeadMemo::default();
            let first = format!("POST {first_authority}/pools/p/lock/abc/release {first_version}\r\n");
            let first = [first.as_bytes(), block].concat();
            prop_assert!(parse_head_on(&first, &mut header_storage(), &mut memo).is_ok_and(|h| h.is_some()));
            // The very head again: its request line is the remembered one.
            let again = digest(parse_head_on(&first, &mut header_storage(), &mut memo));
            prop_assert_eq!(again, with_head(&first, digest));
            for (method, authority, target, version) in lines {
                let raw = [method.as_bytes(), b" ", authority.as_bytes(), &target, b" ", version.as_bytes(), b"\r\n", block]
                    .concat();
                let mut storage = header_storage();
                let remembered = digest(parse_head_on(&raw, &mut storage, &mut memo));
                let fresh = with_head(&raw, digest);
                prop_assert_eq!(remembered, fresh, "{:?}", String::from_utf8_lossy(&raw));
            }
        }

        /// A client whose good heads differ only in the values of some
        /// fields, read by the server or not, gets a fresh parse's verdict
        /// for each, once the memo has learned which values change too.
        #[test]
        fn values_that_change_get_a_fresh_verdict(
            parts in prop::collection::vec(
                prop_oneof![
                    Just(Part::Fixed("X-Nthpool-Key: k1\r\n")),
                    Just(Part::Fixed("Content-Type: application/json\r\n")),
                    Just(Part::Varying("Traceparent")),
                    Just(Part::Varying("X-Request-Id")),
                    Just(Part::Varying("X-Nthpool-Key")),
                    Just(Part::Varying("X-Forwarded-For")),
                    Just(Part::Varying("Content-Length")),
                ],
                1..5,
            ),
            host in prop_oneof![Just(Part::Fixed("Host: h\r\n")), Just(Part::Varying("Host"))],
            values in prop::collection::vec(prop::collection::vec(value(), 1..4), 1..40),
        ) {
            let parts = [vec![host], parts].concat();
            let mut memo = HeadMemo::default();
            for values in values {
                let raw = [&b"POST /pools/p/lock/acquire HTTP/1.1\r\n"[..], &fill(&parts, &values)].concat();
                let mut storage = header_storage();
                let remembered = digest(parse_head_on(&raw, &mut storage, &mut memo));
                let fresh = with_head(&raw, digest);
                prop_assert_eq!(remembered, fresh, "{:?}", String::from_utf8_lossy(&raw));
            }
        }

        /// A connection that remembers header blocks answers every head
        /// exactly as a fresh parse does, whatever came before it: a block
        /// reused with another request line, a block cut short, bytes after
        /// the head, a request line that differs from the remembered one only
        /// in its target, fields whose values change from head to head (read
        /// by the server or not, good or bad), and bad heads mixed in.
        #[test]
        fn the_memo_never_changes_a_verdict(
            blocks in prop::collection::vec(block(), 1..4),
            requests in prop::collection::vec(
                (request_line(), 0usize..4, 0usize..3, prop::collection::vec(value(), 1..3)),
                1..32,
            ),
        ) {
            let mut memo = HeadMemo::default();
            for (line, which, tail, values) in requests {
                let mut raw = [line, fill(&blocks[which % blocks.len()], &values)].concat();
                match tail {
                    0 => {}
                    1 => raw.extend_from_slice(b"{\"status\":200}POST / HTTP/1.1\r\n"),
                    _ => {
                        let cut = raw.len() - 1;
                        raw.truncate(cut);
                    }
                }
                let mut storage = header_storage();
                let remembered = digest(parse_head_on(&raw, &mut storage, &mut memo));
                let fresh = with_head(&raw, digest);
                prop_assert_eq!(remembered, fresh, "{:?}", String::from_utf8_lossy(&raw));
            }
        }
    }
}
