//! Moving one message body across the proxy, in either direction, as it arrives.
//!
//! A `Relay` takes the bytes of a body framed one way (`Content-Length`,
//! chunked, or up to the close) and appends them to the other side's output
//! framed the way that side is told: as they are under a `Content-Length`,
//! or re-chunked. Chunked input is always decoded and re-encoded, never
//! copied: the far side sees only framing this server wrote, so no framing
//! trick of a client can reach an upstream as two messages. Pure byte work:
//! it never touches a socket, and the caller bounds how much it is fed.

use crate::http::chunked::{ChunkError, ChunkedDecoder};

/// How a body arrives.
#[derive(Debug)]
pub enum Framing {
    /// Exactly this many bytes still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Everything until the sender closes (responses only).
    Close,
}

#[derive(Debug)]
pub struct Relay {
    framing: Framing,
    /// Write the body chunked (else as it is: under a `Content-Length`, or to a close).
    chunked_out: bool,
    done: bool,
}

/// Eight hex digits and CRLF: a chunk-size line of fixed width, written before the data
/// and filled in after, so decoded bytes go straight to the output.
const SIZE_LINE: usize = 10;

impl Relay {
    pub fn new(framing: Framing, chunked_out: bool) -> Relay {
        let done = matches!(framing, Framing::Length(0));
        Relay { framing, chunked_out, done }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the body ends only when its sender closes.
    pub fn close_delimited(&self) -> bool {
        matches!(self.framing, Framing::Close)
    }

    /// Relays what `input` holds of the body into `out`; returns the bytes of
    /// `input` consumed. Nothing past the body's end is consumed.
    pub fn pump(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkError> {
        if self.done || input.is_empty() {
            return Ok(0);
        }
        let start = out.len();
        if self.chunked_out {
            out.extend_from_slice(&[b'0'; SIZE_LINE]);
        }
        let data_start = out.len();
        let consumed = match &mut self.framing {
            Framing::Length(left) => {
                let take = (input.len() as u64).min(*left) as usize;
                out.extend_from_slice(&input[..take]);
                *left -= take as u64;
                self.done = *left == 0;
                take
            }
            Framing::Close => {
                out.extend_from_slice(input);
                input.len()
            }
            Framing::Chunked(decoder) => {
                let (n, done) = decoder.feed(input, out).inspect_err(|_| out.truncate(start))?;
                self.done = done;
                n
            }
        };
        if self.chunked_out {
            let data = out.len() - data_start;
            if data == 0 {
                out.truncate(start);
            } else {
                write_size_line(&mut out[start..data_start], data);
                out.extend_from_slice(b"\r\n");
            }
            if self.done {
                out.extend_from_slice(b"0\r\n\r\n");
            }
        }
        Ok(consumed)
    }

    /// The sender closed. Returns whether that ended the body (a
    /// close-delimited one); a framed body that was not complete is truncated.
    pub fn end_of_input(&mut self, out: &mut Vec<u8>) -> bool {
        if self.done {
            return true;
        }
        if !matches!(self.framing, Framing::Close) {
            return false;
        }
        self.done = true;
        if self.chunked_out {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        true
    }
}

fn write_size_line(line: &mut [u8], size: usize) {
    debug_assert!(size <= 0xffff_ffff && line.len() == SIZE_LINE);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in line[..8].iter_mut().enumerate() {
        *b = HEX[(size >> (28 - 4 * i)) & 0xf];
    }
    line[8..].copy_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes; returns the output and the bytes consumed.
    fn run(mut relay: Relay, input: &[u8], step: usize) -> (Vec<u8>, usize, bool) {
        let mut out = Vec::new();
        let mut at = 0;
        let mut end = 0;
        while end < input.len() {
            end = (end + step).min(input.len());
            at += relay.pump(&input[at..end], &mut out).unwrap();
        }
        (out, at, relay.is_done())
    }

    fn decode(chunked: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let (n, done) = ChunkedDecoder::new(usize::MAX).feed(chunked, &mut out).unwrap();
        assert!(done && n == chunked.len(), "{:?}", String::from_utf8_lossy(chunked));
        out
    }

    #[test]
    fn length_stops_at_the_end_of_the_body() {
        for step in [1, 3, 100] {
            let (out, consumed, done) = run(Relay::new(Framing::Length(5), false), b"helloGET / HTTP/1.1", step);
            assert_eq!((out.as_slice(), consumed, done), (&b"hello"[..], 5, true));
        }
    }

    #[test]
    fn chunked_is_re_encoded_and_nothing_after_it_is_taken() {
        let input = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nPOST /next";
        for step in [1, 2, 7, 1000] {
            let (out, consumed, done) = run(Relay::new(Framing::Chunked(ChunkedDecoder::new(100)), true), input, step);
            assert!(done);
            assert_eq!(&input[consumed..], b"POST /next");
            assert_eq!(decode(&out), b"hello world");
            assert!(!out.windows(3).any(|w| w == b"ext"), "extensions and trailers are not forwarded");
        }
    }

    #[test]
    fn chunked_to_identity_and_close_to_chunked() {
        let (out, _, done) =
            run(Relay::new(Framing::Chunked(ChunkedDecoder::new(100)), false), b"3\r\nabc\r\n0\r\n\r\n", 2);
        assert_eq!((out.as_slice(), done), (&b"abc"[..], true));
        let mut relay = Relay::new(Framing::Close, true);
        let mut out = Vec::new();
        relay.pump(b"data: 1\n\n", &mut out).unwrap();
        assert!(relay.end_of_input(&mut out));
        assert_eq!(decode(&out), b"data: 1\n\n");
    }

    #[test]
    fn a_truncated_framed_body_is_not_ended_by_a_close() {
        let mut relay = Relay::new(Framing::Length(10), false);
        let mut out = Vec::new();
        relay.pump(b"abc", &mut out).unwrap();
        assert!(!relay.end_of_input(&mut out));
        assert!(!relay.is_done());
    }

    #[test]
    fn bad_chunked_framing_is_an_error_and_writes_nothing() {
        let mut relay = Relay::new(Framing::Chunked(ChunkedDecoder::new(100)), true);
        let mut out = b"before".to_vec();
        assert!(relay.pump(b"zz\r\n", &mut out).is_err());
        assert_eq!(out, b"before");
        let mut small = Relay::new(Framing::Chunked(ChunkedDecoder::new(4)), true);
        assert_eq!(small.pump(b"3\r\nabc\r\n3\r\n", &mut Vec::new()), Err(ChunkError::TooLarge(4)));
    }
}
