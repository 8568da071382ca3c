//! A connection's head memo never changes a verdict: every head of a
//! sequence, parsed through one connection's `HeadMemo`, must get exactly what
//! a fresh parse gives it (head, fields, framing, error), whatever the heads
//! before it were.
//!
//! Input: the bytes of several heads, split at zero bytes; each piece is
//! parsed as the start of a connection's input (a head, maybe with bytes after
//! it), in order. The first two pieces are also repeated, so blocks seen once
//! are looked up again after other request lines.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nthpool::http::request::{header_storage, parse_head, parse_head_on, Head, HeadError, HeadMemo};

/// Everything a parse says (a head's fields included), owned, so two
/// parses can be compared; not where the head came from (`recall`).
fn digest(r: Result<Option<Head<'_>>, HeadError>) -> String {
    format!("{:?}", r.map(|h| h.map(|h| Head { recall: None, ..h })))
}

fuzz_target!(|input: &[u8]| {
    let mut pieces: Vec<&[u8]> = input.split(|&b| b == 0).filter(|p| !p.is_empty()).take(16).collect();
    let again: Vec<&[u8]> = pieces.iter().take(2).copied().collect();
    pieces.extend(again);
    let mut memo = HeadMemo::default();
    for piece in pieces {
        let mut storage = header_storage();
        let remembered = digest(parse_head_on(piece, &mut storage, &mut memo));
        let mut storage = header_storage();
        let fresh = digest(parse_head(piece, &mut storage));
        assert_eq!(remembered, fresh, "{:?}", String::from_utf8_lossy(piece));
    }
});
