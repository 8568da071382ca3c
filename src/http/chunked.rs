//! The `Transfer-Encoding: chunked` body decoder: a byte-level state machine that
//! takes the body in whatever pieces reads deliver and appends the decoded bytes
//! to the caller's buffer.
//!
//! It owns the chunked framing rules of SPEC §4: strict size lines (hex digits,
//! then extensions to RFC 9112 §7.1.1's grammar, then CRLF), CRLF after every
//! chunk, a cap on size lines and trailers, and the body limit (`413` for a chunk
//! or a sum beyond it, answered before its data is read; a size past 64 bits is
//! `400`). Trailers are read to the field-line grammar and
//! dropped. It never allocates beyond growing `out`, never touches a socket, and
//! never looks past the final CRLF: what follows is the next pipelined request.

/// Longest size line, digits, extensions and CRLF together.
const MAX_SIZE_LINE: usize = 1024;
/// Longest trailer section, its final empty line included.
const MAX_TRAILERS: usize = 8 * 1024;
// The refusals name these limits ("longer than 1 KiB", "... 8 KiB").
const _: () = assert!(MAX_SIZE_LINE == 1024 && MAX_TRAILERS == 8 * 1024);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkError {
    /// `400` and close; the text is the one-sentence `message` of the reply.
    Malformed(&'static str),
    /// `413`: the decoded body would exceed the limit, in bytes.
    TooLarge(u64),
}

const BARE_LF: ChunkError = ChunkError::Malformed("Chunked framing lines must end with CRLF.");
const BAD_SIZE: ChunkError =
    ChunkError::Malformed("A chunk size must be hexadecimal digits, optionally followed by ';'.");
const NO_CRLF_AFTER_DATA: ChunkError = ChunkError::Malformed("A chunk's data must be followed by CRLF.");
const BAD_TRAILER: ChunkError =
    ChunkError::Malformed("A chunked trailer line must be a header field: a name, a colon and a value.");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Hex digits of a chunk size; `seen_digit` tells whether one arrived.
    Size,
    /// Spaces or tabs after the digits, allowed only before an extension.
    SizeSpace,
    /// A chunk extension, read to its grammar and then ignored.
    Extension(Ext),
    /// The LF ending a size line.
    SizeLf,
    /// `size` bytes of chunk data still to come.
    Data,
    DataCr,
    DataLf,
    /// The start of a trailer line, or the CR of the final empty line.
    TrailerStart,
    /// A trailer field's name, up to its `:`.
    TrailerName,
    /// A trailer field's value, up to its CR.
    Trailer,
    TrailerLf,
    /// The LF of the final empty line.
    EndLf,
    Done,
    /// Sticky, so a caller that feeds again after an error gets the error again.
    Failed(ChunkError),
}

/// Where a size line's extensions are in RFC 9112 §7.1.1's
/// `*( BWS ";" BWS name [ BWS "=" BWS value ] )`, a value a token or a
/// quoted string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ext {
    /// After a `;`: spaces, then the name's first byte.
    BeforeName,
    Name,
    /// Spaces after a name: then `=` or `;`.
    AfterName,
    /// After `=`: spaces, then a token or a quoted string.
    BeforeValue,
    Token,
    Quoted,
    /// After a backslash in a quoted string.
    QuotedEscape,
    /// Right after a quoted string's closing quote.
    QuotedEnd,
    /// Spaces after a value: then `;`.
    AfterValue,
}

const BAD_EXTENSION: ChunkError =
    ChunkError::Malformed("A chunk extension must be ';' and a token, optionally '=' and a token or quoted string.");

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    limit: u64,
    /// Decoded bytes so far, never above `limit`.
    total: u64,
    /// The size being read, then the bytes of the current chunk still to come.
    size: u64,
    seen_digit: bool,
    size_line_len: usize,
    trailer_len: usize,
}

impl ChunkedDecoder {
    /// A decoder for one body of at most `limit` decoded bytes.
    pub fn new(limit: usize) -> Self {
        ChunkedDecoder {
            state: State::Size,
            limit: limit as u64,
            total: 0,
            size: 0,
            seen_digit: false,
            size_line_len: 0,
            trailer_len: 0,
        }
    }

    /// Consumes as much of `input` as it can, appending decoded body bytes to `out`.
    /// Returns the bytes consumed and whether the body is complete. Until the body is
    /// complete every byte is consumed; once complete, nothing past the final CRLF
    /// is, and later calls return `(0, true)`. The outcome does not depend on how
    /// the body was split across calls.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), ChunkError> {
        match self.step(input, out) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.state = State::Failed(e);
                Err(e)
            }
        }
    }

    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), ChunkError> {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        if self.state == State::Done {
            return Ok((0, true));
        }
        let mut pos = 0;
        while pos < input.len() {
            if self.state == State::Data {
                let take = (input.len() - pos).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[pos..pos + take]);
                pos += take;
                self.size -= take as u64;
                self.total += take as u64;
                debug_assert!(self.total <= self.limit);
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = input[pos];
            pos += 1;
            self.state = match self.state {
                State::Size | State::SizeSpace | State::Extension(_) | State::SizeLf => {
                    self.size_line_len += 1;
                    if self.size_line_len > MAX_SIZE_LINE {
                        return Err(ChunkError::Malformed("A chunk size line is longer than 1 KiB."));
                    }
                    self.size_line(b)?
                }
                State::DataCr if b == b'\r' => State::DataLf,
                State::DataLf if b == b'\n' => {
                    self.seen_digit = false;
                    self.size_line_len = 0;
                    State::Size
                }
                State::DataCr | State::DataLf => return Err(NO_CRLF_AFTER_DATA),
                State::TrailerStart | State::TrailerName | State::Trailer | State::TrailerLf | State::EndLf => {
                    self.trailer_len += 1;
                    if self.trailer_len > MAX_TRAILERS {
                        return Err(ChunkError::Malformed("The chunked trailer section is longer than 8 KiB."));
                    }
                    match (self.state, b) {
                        (State::EndLf, b'\n') => {
                            self.state = State::Done;
                            return Ok((pos, true));
                        }
                        (State::TrailerLf, b'\n') => State::TrailerStart,
                        (State::EndLf | State::TrailerLf, _) | (_, b'\n') => return Err(BARE_LF),
                        (State::TrailerStart, b'\r') => State::EndLf,
                        // A trailer line is a field line (RFC 9112 §7.1.2):
                        // a token, a colon, a value; no folding.
                        (State::TrailerStart | State::TrailerName, _) if crate::http::is_tchar(b) => State::TrailerName,
                        (State::TrailerName, b':') => State::Trailer,
                        (State::TrailerStart | State::TrailerName, _) => return Err(BAD_TRAILER),
                        (State::Trailer, b'\r') => State::TrailerLf,
                        // field-vchar, space and tab; no other control byte.
                        (State::Trailer, _) if b == b'\t' || b >= 0x20 && b != 0x7f => State::Trailer,
                        (State::Trailer, _) => return Err(BAD_TRAILER),
                        (other, _) => unreachable!("{other:?} is not a trailer state"),
                    }
                }
                State::Data | State::Done | State::Failed(_) => {
                    unreachable!("{:?} is handled before reading a byte", self.state)
                }
            };
        }
        Ok((pos, self.state == State::Done))
    }

    /// One byte of a size line: `1*HEXDIG [ *WS ";" ext ] CRLF`.
    fn size_line(&mut self, b: u8) -> Result<State, ChunkError> {
        Ok(match (self.state, b) {
            (State::Size, _) if b.is_ascii_hexdigit() => {
                let digit = u64::from(match b {
                    b'0'..=b'9' => b - b'0',
                    _ => (b | 0x20) - b'a' + 10,
                });
                // A size past 64 bits is no size (400). One past the limit
                // makes the body too large (413), told at the line's end;
                // leading zeros never grow the size, and the line cap ends them.
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(digit))
                    .ok_or(ChunkError::Malformed("A chunk size is too large a number."))?;
                self.seen_digit = true;
                State::Size
            }
            (State::Size, b'\r') if self.seen_digit => State::SizeLf,
            (State::Size, b';') if self.seen_digit => State::Extension(Ext::BeforeName),
            // RFC 9112 allows whitespace before an extension's ';', not before CRLF.
            (State::Size, b' ' | b'\t') if self.seen_digit => State::SizeSpace,
            (State::SizeSpace, b' ' | b'\t') => State::SizeSpace,
            (State::SizeSpace, b';') => State::Extension(Ext::BeforeName),
            (State::Size | State::SizeSpace, b'\n') => return Err(BARE_LF),
            (State::Size | State::SizeSpace, _) => return Err(BAD_SIZE),
            (State::Extension(_), b'\n') => return Err(BARE_LF),
            (State::Extension(ext), _) => extension(ext, b)?,
            (State::SizeLf, b'\n') if self.size == 0 => State::TrailerStart,
            (State::SizeLf, b'\n') => {
                if self.size > self.limit - self.total {
                    return Err(ChunkError::TooLarge(self.limit));
                }
                State::Data
            }
            (State::SizeLf, _) => return Err(ChunkError::Malformed("A chunk size line must end with CRLF.")),
            (other, _) => unreachable!("{other:?} is not a size-line state"),
        })
    }
}

/// One byte of a chunk extension in `ext`'s place: the next state, the
/// size line's LF once a CR ends a name or value.
fn extension(ext: Ext, b: u8) -> Result<State, ChunkError> {
    let space = b == b' ' || b == b'\t';
    let token = crate::http::is_tchar(b);
    let next = match (ext, b) {
        (Ext::BeforeName | Ext::AfterName | Ext::BeforeValue | Ext::AfterValue, _) if space => ext,
        (Ext::BeforeName, _) if token => Ext::Name,
        (Ext::Name, _) if token => Ext::Name,
        (Ext::Name, _) if space => Ext::AfterName,
        (Ext::Name | Ext::AfterName, b'=') => Ext::BeforeValue,
        (Ext::BeforeValue, b'"') => Ext::Quoted,
        (Ext::BeforeValue | Ext::Token, _) if token => Ext::Token,
        (Ext::Token | Ext::QuotedEnd, _) if space => Ext::AfterValue,
        (Ext::Quoted, b'"') => Ext::QuotedEnd,
        (Ext::Quoted, b'\\') => Ext::QuotedEscape,
        // qdtext and quoted-pair: tab, space, visible ASCII and obs-text.
        (Ext::Quoted | Ext::QuotedEscape, _) if space || b >= 0x21 && b != 0x7f => Ext::Quoted,
        (Ext::Name | Ext::AfterName | Ext::Token | Ext::QuotedEnd | Ext::AfterValue, b';') => Ext::BeforeName,
        // Spaces may come before a `;` or `=`, not before the CR.
        (Ext::Name | Ext::Token | Ext::QuotedEnd, b'\r') => return Ok(State::SizeLf),
        _ => return Err(BAD_EXTENSION),
    };
    Ok(State::Extension(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a caller ends up with after feeding a whole input.
    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        Done { body: Vec<u8>, consumed: usize },
        Incomplete { body: Vec<u8> },
        Failed(ChunkError),
    }

    /// Feeds `input` cut at `cuts` the way a connection would: unconsumed bytes
    /// stay in its buffer and new bytes are appended to them.
    fn run(input: &[u8], cuts: &[usize], limit: usize) -> Outcome {
        let mut dec = ChunkedDecoder::new(limit);
        let mut out = Vec::new();
        let mut pending = Vec::new();
        let mut consumed = 0;
        let mut start = 0;
        for end in cuts.iter().copied().chain([input.len()]) {
            pending.extend_from_slice(&input[start..end]);
            start = end;
            match dec.feed(&pending, &mut out) {
                Ok((n, done)) => {
                    pending.drain(..n);
                    consumed += n;
                    if done {
                        return Outcome::Done { body: out, consumed };
                    }
                    assert!(pending.is_empty(), "an unfinished decoder consumes all");
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
        Outcome::Incomplete { body: out }
    }

    fn whole(input: &[u8], limit: usize) -> Outcome {
        run(input, &[], limit)
    }

    fn done(body: &[u8], consumed: usize) -> Outcome {
        Outcome::Done { body: body.to_vec(), consumed }
    }

    fn malformed(input: &[u8], limit: usize) -> bool {
        matches!(whole(input, limit), Outcome::Failed(ChunkError::Malformed(_)))
    }

    const VALID: &[&[u8]] = &[
        b"0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"A\r\n0123456789\r\n0\r\n\r\n",
        b"a\r\n0123456789\r\n00\r\n\r\n",
        b"005\r\nhello\r\n0\r\n\r\n",
        b"5;name=value\r\nhello\r\n0;last\r\n\r\n",
        b"5 ;a=\"b c\"\r\nhello\r\n0\r\n\r\n",
        b"5\t; x\r\nhello\r\n0\r\n\r\n",
        b"5;a=\"q\\\"d\" ; b ; c = d\r\nhello\r\n0\r\n\r\n",
        b"5;a=\"\"\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX-Trailer: yes\r\nX-Other: no\r\n\r\n",
        b"3\r\n\r\n\r\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX-Empty:\r\nX-Tab:\ta\tb \r\nX-Obs: \xe9t\xe9\r\n\r\n",
    ];

    const INVALID: &[&[u8]] = &[
        b"\r\n",
        b"; ext\r\n",
        b"x\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b" 5\r\nhello\r\n0\r\n\r\n",
        b"5 \r\nhello\r\n0\r\n\r\n",
        b"5g\r\nhello\r\n0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"5\rhello\r\n0\r\n\r\n",
        b"5\r\nhelloX\r\n0\r\n\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\nhello\r0\r\n\r\n",
        b"5;a\nb\r\nhello\r\n0\r\n\r\n",
        b"5;a\x00\r\nhello\r\n0\r\n\r\n",
        // Extensions to RFC 9112 §7.1.1's grammar: a name that is a token, a
        // value that is a token or a quoted string, spaces only before `;` or `=`.
        b"5;\r\nhello\r\n0\r\n\r\n",
        b"5; \r\nhello\r\n0\r\n\r\n",
        b"5;bad[=x\r\nhello\r\n0\r\n\r\n",
        b"5;a=\r\nhello\r\n0\r\n\r\n",
        b"5;a=b c\r\nhello\r\n0\r\n\r\n",
        b"5;a \r\nhello\r\n0\r\n\r\n",
        b"5;a=\"b\"c\r\nhello\r\n0\r\n\r\n",
        b"5;a=\"b\r\nhello\r\n0\r\n\r\n",
        b"5;;a\r\nhello\r\n0\r\n\r\n",
        b"5;=b\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\n",
        b"5\r\nhello\r\n0\r\n\rX",
        b"5\r\nhello\r\n0\r\nX: y\n\r\n",
        b"5\r\nhello\r\n0\r\nX: y\rZ\r\n\r\n",
        b"5\r\nhello\r\n0\n\r\n",
        // Trailer lines are field lines: a token name, a colon, a value of
        // visible bytes, spaces and tabs.
        b"5\r\nhello\r\n0\r\nbadtrailer\r\n\r\n",
        b"5\r\nhello\r\n0\r\n: no name\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX y: z\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX : z\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX: y\r\n folded\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX: a\x01b\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX: a\x7fb\r\n\r\n",
    ];

    #[test]
    fn valid_bodies() {
        assert_eq!(whole(b"0\r\n\r\n", 10), done(b"", 5));
        assert_eq!(whole(b"5\r\nhello\r\n0\r\n\r\n", 10), done(b"hello", 15));
        assert_eq!(whole(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 64), done(b"hello world", 26));
        assert_eq!(whole(b"A\r\n0123456789\r\n0\r\n\r\n", 10), done(b"0123456789", 20));
        assert_eq!(whole(b"005\r\nhello\r\n0\r\n\r\n", 10), done(b"hello", 17));
        // The data is opaque: CR and LF inside it are body bytes.
        assert_eq!(whole(b"3\r\n\r\n\r\r\n0\r\n\r\n", 10), done(b"\r\n\r", 13));
        for input in VALID {
            assert!(matches!(whole(input, 64), Outcome::Done { .. }), "{input:?}");
        }
    }

    #[test]
    fn extensions_and_trailers_are_dropped() {
        assert_eq!(whole(b"5;name=value\r\nhello\r\n0;last\r\n\r\n", 10), done(b"hello", 31));
        let input = b"5\r\nhello\r\n0\r\nX-Trailer: yes\r\n\r\n";
        assert_eq!(whole(input, 10), done(b"hello", input.len()));
    }

    #[test]
    fn stops_at_the_final_crlf() {
        let input = b"2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        assert_eq!(whole(input, 10), done(b"hi", 12));
        let mut dec = ChunkedDecoder::new(10);
        let mut out = Vec::new();
        assert_eq!(dec.feed(input, &mut out), Ok((12, true)));
        assert_eq!(dec.feed(&input[12..], &mut out), Ok((0, true)));
        assert_eq!(out, b"hi");
    }

    #[test]
    fn incomplete_bodies_keep_what_arrived() {
        assert_eq!(whole(b"5\r\nhel", 10), Outcome::Incomplete { body: b"hel".to_vec() });
        assert_eq!(whole(b"5\r\nhello\r\n0\r\n", 10), Outcome::Incomplete { body: b"hello".to_vec() });
        assert_eq!(whole(b"", 10), Outcome::Incomplete { body: Vec::new() });
    }

    #[test]
    fn malformed_framing() {
        for input in INVALID {
            assert!(malformed(input, 64), "{:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn size_line_cap() {
        let mut input = b"5;".to_vec();
        input.resize(MAX_SIZE_LINE - 2, b'x');
        input.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert_eq!(whole(&input, 10), done(b"hello", input.len()));

        let mut input = b"5;".to_vec();
        input.resize(MAX_SIZE_LINE - 1, b'x');
        input.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert!(malformed(&input, 10));

        // Leading zeros are digits, so the same cap ends them.
        let input = vec![b'0'; MAX_SIZE_LINE + 1];
        assert!(malformed(&input, 10));
    }

    #[test]
    fn trailer_cap() {
        // The trailer section starts after the 3 bytes of "0\r\n".
        let mut ok = b"0\r\nX: ".to_vec();
        ok.resize(3 + MAX_TRAILERS - 4, b'y');
        ok.extend_from_slice(b"\r\n\r\n");
        assert_eq!(whole(&ok, 10), done(b"", ok.len()));

        let mut long = b"0\r\nX: ".to_vec();
        long.resize(3 + MAX_TRAILERS - 3, b'y');
        long.extend_from_slice(b"\r\n\r\n");
        assert!(malformed(&long, 10));
    }

    #[test]
    fn body_limit() {
        // Exactly the limit is fine, in one chunk or many.
        assert_eq!(whole(b"5\r\nhello\r\n0\r\n\r\n", 5), done(b"hello", 15));
        assert_eq!(whole(b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", 5), done(b"hello", 20));
        // One chunk beyond the limit makes the body too large, answered at its size line.
        assert_eq!(whole(b"6\r\n", 5), Outcome::Failed(ChunkError::TooLarge(5)));
        // A size past 64 bits is no size at all.
        assert!(malformed(b"ffffffffffffffffff\r\n", usize::MAX));
        assert!(malformed(b"FFFFFFFFFFFFFFFF0\r\n", 5));
        // A sum beyond the limit is 413, answered before the data that breaks it.
        assert_eq!(whole(b"3\r\nhel\r\n3\r\n", 5), Outcome::Failed(ChunkError::TooLarge(5)));
        assert_eq!(whole(b"1\r\n", 0), Outcome::Failed(ChunkError::TooLarge(0)));
        assert_eq!(whole(b"0\r\n\r\n", 0), done(b"", 5));
        assert_eq!(whole(b"ffffffffffffffff\r\n", usize::MAX), Outcome::Incomplete { body: Vec::new() });
    }

    #[test]
    fn errors_are_sticky() {
        let mut dec = ChunkedDecoder::new(10);
        let mut out = Vec::new();
        let err = dec.feed(b"x", &mut out).unwrap_err();
        assert_eq!(dec.feed(b"0\r\n\r\n", &mut out), Err(err));
    }

    #[test]
    fn appends_to_existing_output() {
        let mut dec = ChunkedDecoder::new(5);
        let mut out = b"already here".to_vec();
        assert_eq!(dec.feed(b"5\r\nhello\r\n0\r\n\r\n", &mut out), Ok((15, true)));
        assert_eq!(out, b"already herehello");
    }

    #[test]
    fn same_outcome_for_every_split() {
        let mut pipelined = b"4\r\nabcd\r\n0\r\nT: 1\r\n\r\n".to_vec();
        pipelined.extend_from_slice(b"POST / HTTP/1.1\r\n");
        let limited: &[u8] = b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
        let mut all: Vec<(&[u8], usize)> = Vec::new();
        all.extend(VALID.iter().chain(INVALID).map(|i| (*i, 64)));
        all.push((&pipelined, 64));
        all.push((limited, 5));
        all.push((limited, 2));
        for (input, limit) in all {
            let expected = whole(input, limit);
            let every_byte: Vec<usize> = (1..input.len()).collect();
            assert_eq!(run(input, &every_byte, limit), expected, "{input:?} byte by byte");
            for a in 0..=input.len() {
                assert_eq!(run(input, &[a], limit), expected, "{input:?} cut at {a}");
                for b in a..=input.len() {
                    assert_eq!(run(input, &[a, b], limit), expected, "{input:?} cut at {a}, {b}");
                }
            }
        }
    }
}
