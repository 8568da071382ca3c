//! A connection's memory of the header blocks it has already judged.
//!
//! A keep-alive client sends the same header fields on every request of a
//! kind: a sidecar's acquire carries the same `Host`, key and
//! `Content-Length: 0` each time, its release the same fields with the same
//! body length. Only the request line changes (a release names its slot). So
//! each connection keeps the last three header blocks that passed every check,
//! byte for byte, with what `scan_fields` found in them; a block that starts
//! with one of those exact bytes needs neither httparse nor the field checks
//! again: the same bytes get the same verdict.
//!
//! What is remembered is the block after the request line up to and including
//! the empty line that ends the head, and the request line that came before
//! it. A client's next request line of a kind has the same length (slot ids
//! do), so the block is looked for right after a line of that length. When
//! the line is the very one remembered too (an acquire's is), the whole head
//! is one already judged, and what httparse read in the line is reused.
//! Otherwise the caller gets the remembered line to compare the head's with
//! (a release's differs only in its slot id), or has httparse parse the
//! request line alone. A block is kept per length of the line before it, so
//! a client whose releases carry no report, and so the acquire's very
//! fields, has both found. Three entries, because a client alternates
//! acquires and releases and now and then renews; the one used longest ago
//! is replaced. Nothing here allocates once every entry has held a block.
//!
//! A client may also send a field whose value changes on every request: a
//! W3C `traceparent`, a request id. When a new block is the length of a kept
//! one and differs from it only inside the values of fields the server does
//! not read (the caller names them), the entry learns those values' places
//! (`Free`): from then on a block that is the kept one outside them, and has
//! only visible characters (`%x21-7E`) inside them, is the kept one. Such a
//! value cannot move a line end, a field's start or end, or anything the
//! server reads, so the verdict is the same; the head's own bytes are what
//! its fields are read from.

/// Blocks longer than this are judged every time.
pub const MEMO_ROOM: usize = 1024;
/// The blocks a connection keeps: an acquire's, a release's and a renew's.
pub const ENTRIES: usize = 3;
/// The most heads parsed in full between two looks after misses.
const MAX_BACKOFF: u8 = 63;
/// The most field values of one block that may change (`Free`).
const MAX_FREE: usize = 4;

/// The places in a kept block of the field values that may change from
/// head to head: ascending, not overlapping, none empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Free {
    ranges: [(u16, u16); MAX_FREE],
    len: u8,
}

impl Free {
    fn ranges(&self) -> &[(u16, u16)] {
        &self.ranges[..usize::from(self.len)]
    }

    /// `input` starts with `block` but for visible characters in the free
    /// places. The input's visible values are first copied into `block`
    /// (nobody reads a free value's kept bytes: a head's fields are read
    /// from the head), so one comparison of the whole block decides; a value
    /// with other bytes is compared with the kept one as it is.
    fn matches(&self, input: &[u8], block: &mut [u8]) -> bool {
        if input.len() < block.len() {
            return false;
        }
        for &(start, end) in self.ranges() {
            let place = usize::from(start)..usize::from(end);
            if visible(&input[place.clone()]) {
                block[place.clone()].copy_from_slice(&input[place]);
            }
        }
        starts_with_block(input, block)
    }

    /// The free places of a block that is `kept` but for bytes in some of
    /// `may_vary` (the places of the values that may change, ascending, in
    /// a block of `kept`'s length): those, with the ones of `before` (the
    /// places already free in `kept`) that are still among them. None when
    /// a byte differs elsewhere, or more than `MAX_FREE` would be free.
    fn learn(kept: &[u8], block: &[u8], may_vary: impl Iterator<Item = (usize, usize)>, before: &Free) -> Option<Free> {
        debug_assert_eq!(kept.len(), block.len());
        let mut free = Free::default();
        let mut at = 0;
        for (start, end) in may_vary {
            if start >= end {
                continue;
            }
            if kept[at..start] != block[at..start] {
                return None;
            }
            let range = (u16::try_from(start).ok()?, u16::try_from(end).ok()?);
            if kept[start..end] != block[start..end] || before.ranges().contains(&range) {
                *free.ranges.get_mut(usize::from(free.len))? = range;
                free.len += 1;
            }
            at = end;
        }
        (kept[at..] == block[at..]).then_some(free)
    }
}

/// The remembered blocks of one connection, each with what was found in it
/// (`T`, plain data: `request::FieldSpans`), the place of each of its fields
/// (`F`), and its request line with what was found in that (`L`:
/// `request::LineSpans`).
#[derive(Default)]
pub struct BlockMemo<T, L, F> {
    entries: [Entry<T, L, F>; ENTRIES],
    /// Counts recalls and remembers: an entry's `used` says when it was last.
    uses: u64,
    /// Heads to parse in full before looking here again, after a miss:
    /// a client whose fields change on every request (a trace id, say)
    /// then pays for one look in `MAX_BACKOFF` heads, not for one in each.
    skip: u8,
    /// The skip after the next miss: it doubles with each miss in a row.
    backoff: u8,
    /// Counts what `remember` wrote, so an entry's `version` names what it
    /// held then: a verdict kept about an entry holds while it is the same.
    versions: u32,
}

#[derive(Default)]
struct Entry<T, L, F> {
    /// A whole header block that passed every check; empty when unused.
    block: Vec<u8>,
    spans: T,
    /// Its fields, in order.
    fields: Vec<F>,
    /// The request line (CRLF included) that came before it when it was
    /// remembered, and what was read in it; a line over `MEMO_ROOM` is not
    /// kept (`line` empty). Text, so a head can borrow its method and target.
    line: String,
    line_spans: L,
    /// The length of the request line that came before the block last:
    /// where to look for the block in the next head.
    line_len: usize,
    /// Changes whenever the block or its line does (see `versions`).
    version: u32,
    /// When it was last recalled or remembered (`BlockMemo::uses`); the
    /// entry used longest ago is the one a new block replaces.
    used: u64,
    /// The places in `block` of the values that may change (see `Free`).
    free: Free,
}

/// A remembered block found in a head. What was found in the block and in
/// its line stay in the memo (`spans`, `line_spans`): they are large, and a
/// copy per head would cost more than the look-up.
#[derive(Debug, PartialEq, Eq)]
pub struct Recalled {
    /// The entry found, for `spans`, `line_spans`, `line_text` and `fields`.
    pub entry: usize,
    /// The entry's version: the same entry and version are the same block
    /// and the same remembered line.
    pub version: u32,
    /// Where the block starts: the length of the request line before it,
    /// ending in CRLF. The caller still has to check that the request line
    /// is exactly that long, unless `line` is given.
    pub line_len: usize,
    pub block_len: usize,
    /// What the head's request line has in common with the one remembered
    /// with the block.
    pub line: LineRecall,
}

/// The request line remembered with a block, as far as it tells about the
/// head's (which is exactly `Recalled::line_len` long, if anything here holds).
#[derive(Debug, PartialEq, Eq)]
pub enum LineRecall {
    /// Byte for byte the head's: what was read in it is `line_spans`.
    Same,
    /// Another line of the same length, whose text is `line_text` and in
    /// which `line_spans` was read: the caller may compare the two.
    Like,
    /// No line was kept (it was longer than `MEMO_ROOM`).
    Unknown,
}

impl<T: Copy, L: Copy, F> BlockMemo<T, L, F> {
    /// Whether any block is remembered (nothing to compare otherwise).
    pub fn is_empty(&self) -> bool {
        self.entries.iter().all(|e| e.block.is_empty())
    }

    /// Whether this head should be looked up (and, when it is new,
    /// remembered); false while backing off after misses.
    pub fn probe(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// The remembered block that `head` holds right after a request line of
    /// the length that came with it before (which counts as a use of it).
    pub fn recall(&mut self, head: &[u8]) -> Option<Recalled> {
        let found = self.entries.iter_mut().position(|e| {
            let n = e.line_len;
            n >= 2
                && head.get(n - 2..n) == Some(b"\r\n")
                // An entry with no free places (the usual client's) makes no call to `matches`.
                && match e.free.len {
                    0 => starts_with_block(&head[n..], &e.block),
                    _ => e.free.matches(&head[n..], &mut e.block),
                }
        });
        let Some(at) = found else {
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2 + 1).min(MAX_BACKOFF);
            return None;
        };
        self.backoff = 0;
        self.uses += 1;
        self.entries[at].used = self.uses;
        let e = &self.entries[at];
        let n = e.line_len;
        let line = match () {
            _ if e.line.len() != n => LineRecall::Unknown,
            _ if head[..n] == *e.line.as_bytes() => LineRecall::Same,
            _ => LineRecall::Like,
        };
        Some(Recalled { entry: at, version: e.version, line_len: n, block_len: e.block.len(), line })
    }

    /// What was found in the block remembered in `entry` (from `recall`).
    pub fn spans(&self, entry: usize) -> &T {
        &self.entries[entry].spans
    }

    /// What was read in the request line remembered in `entry`.
    pub fn line_spans(&self, entry: usize) -> &L {
        &self.entries[entry].line_spans
    }

    /// The request line remembered in `entry` (from `recall`).
    pub fn line_text(&self, entry: usize) -> &str {
        &self.entries[entry].line
    }

    /// The fields of the block remembered in `entry` (from `recall`).
    pub fn fields(&self, entry: usize) -> &[F] {
        &self.entries[entry].fields
    }

    /// Remembers `block`, a whole header block that passed every check,
    /// what was found in it and its fields, and the request line before it
    /// with what was read in that. Blocks under a word or over `MEMO_ROOM`
    /// bytes are not kept; a block already kept after a line of this length
    /// takes the new line. A block
    /// that is a kept one but for some of the values at `may_vary` (the
    /// places, ascending, of the values of fields the server does not read)
    /// takes that one's entry, which learns that they change.
    pub fn remember(
        &mut self,
        line: &[u8],
        line_spans: L,
        block: &[u8],
        spans: T,
        fields: impl IntoIterator<Item = F>,
        may_vary: impl Iterator<Item = (usize, usize)> + Clone,
    ) {
        if block.len() < 8 || block.len() > MEMO_ROOM {
            return;
        }
        // A block is kept per length of the line before it: a client whose
        // acquires and releases send the same fields (no report) has both found.
        let (at, free) = match self.entries.iter().position(|e| e.line_len == line.len() && e.block == block) {
            Some(at) => (at, self.entries[at].free),
            None => self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.line_len == line.len() && e.block.len() == block.len())
                .find_map(|(at, e)| Some((at, Free::learn(&e.block, block, may_vary.clone(), &e.free)?)))
                .unwrap_or((self.least_recently_used(), Free::default())),
        };
        let e = &mut self.entries[at];
        e.free = free;
        if e.block != block {
            e.block.clear();
            e.block.extend_from_slice(block);
            e.spans = spans;
            e.fields.clear();
            e.fields.extend(fields);
        }
        e.line.clear();
        if line.len() <= MEMO_ROOM {
            // httparse read the method and target as text; the rest is ASCII.
            e.line.push_str(std::str::from_utf8(line).unwrap_or_default());
        }
        e.line_spans = line_spans;
        e.line_len = line.len();
        self.versions = self.versions.wrapping_add(1);
        e.version = self.versions;
        self.uses += 1;
        e.used = self.uses;
    }

    /// The entry a new block replaces: the one used longest ago (an unused
    /// one first).
    fn least_recently_used(&self) -> usize {
        (0..ENTRIES).min_by_key(|&at| self.entries[at].used).unwrap_or(0)
    }
}

/// Whether every byte is a visible character (`%x21-7E`, RFC 5234's
/// VCHAR), eight at a time.
fn visible(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES * 0x80;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        // A byte under 0x21 borrows into its high bit (where `w`'s is clear);
        // one over 0x7E carries into it, or has it set already.
        let under = w.wrapping_sub(ONES * 0x21) & !w & HIGH;
        let over = (w.wrapping_add(ONES) | w) & HIGH;
        if under | over != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|b| matches!(b, 0x21..=0x7e))
}

/// `input` starts with `block` (of at least eight bytes). The last word is
/// compared first: it holds the end of the block, where two blocks of one
/// client differ most often (`Content-Length`); then the whole block, by
/// `memcmp` (32 bytes a step).
fn starts_with_block(input: &[u8], block: &[u8]) -> bool {
    let n = block.len();
    if n < 8 || input.len() < n {
        return false;
    }
    let word = |s: &[u8]| u64::from_le_bytes(s[n - 8..n].try_into().expect("8 bytes"));
    word(input) == word(block) && input[..n] == *block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_found_only_as_an_exact_prefix() {
        let block: &[u8] = b"Host: h\r\nX-Nthpool-Key: k\r\nContent-Length: 0\r\n\r\n";
        for n in 8..block.len() {
            assert!(starts_with_block(block, &block[..n]));
        }
        let mut longer = block.to_vec();
        longer.extend_from_slice(b"POST /next HTTP/1.1\r\n");
        assert!(starts_with_block(&longer, block));
        assert!(!starts_with_block(&block[..block.len() - 1], block), "input shorter than the block");
        for at in 0..block.len() {
            let mut other = block.to_vec();
            other[at] ^= 0x20;
            assert!(!starts_with_block(&other, block), "differs at {at}");
        }
    }

    const LINE: &[u8] = b"POST /x HTTP/1.1\r\n";

    /// `line` then `block`, as a head to recall from.
    fn head(line: &[u8], block: &[u8]) -> Vec<u8> {
        [line, block].concat()
    }

    type Memo = BlockMemo<u8, u8, u8>;

    /// No value may vary.
    const NONE: std::iter::Empty<(usize, usize)> = std::iter::empty();

    /// Where `block` is found after `LINE`: the line's length, the block's.
    fn found(memo: &mut Memo, block: &[u8]) -> Option<(usize, usize)> {
        memo.recall(&head(LINE, block)).map(|r| (r.line_len, r.block_len))
    }

    #[test]
    fn three_blocks_are_kept_and_the_one_used_longest_ago_is_replaced() {
        let (a, b, c) = (&b"Host: a\r\n\r\n"[..], &b"Host: bb\r\n\r\n"[..], &b"Host: ccc\r\n\r\n"[..]);
        let d = &b"Host: dddd\r\n\r\n"[..];
        let n = LINE.len();
        let mut memo = Memo::default();
        assert!(memo.is_empty());
        assert_eq!(found(&mut memo, a), None);
        memo.remember(LINE, 0, a, 1, [1], NONE);
        memo.remember(LINE, 0, b, 2, [2], NONE);
        memo.remember(LINE, 0, c, 3, [3], NONE);
        assert_eq!(found(&mut memo, a), Some((n, a.len())));
        assert_eq!(found(&mut memo, c), Some((n, c.len())));
        // `b` was used longest ago: `d` takes its place.
        memo.remember(LINE, 0, d, 4, [4], NONE);
        assert_eq!(found(&mut memo, b), None);
        for kept in [a, c, d] {
            assert_eq!(found(&mut memo, kept), Some((n, kept.len())));
        }
        // A block kept already after a line of that length takes the new
        // line and evicts nothing.
        let other = b"POST /y HTTP/1.1\r\n";
        memo.remember(other, 0, c, 3, [3], NONE);
        assert_eq!(memo.recall(&head(LINE, c)).map(|r| r.line), Some(LineRecall::Like));
        for kept in [a, d] {
            assert_eq!(found(&mut memo, kept), Some((n, kept.len())));
        }
        // After a line of another length, the block is kept again, in the
        // entry used longest ago (`c`'s now): a client whose acquires and
        // releases send the same fields has both found.
        let longer = b"POST /xy HTTP/1.1\r\n";
        memo.remember(longer, 0, a, 1, [1], NONE);
        assert_eq!(found(&mut memo, a), Some((n, a.len())), "still after the old line length");
        let r = memo.recall(&head(b"POST /yx HTTP/1.1\r\n", a)).map(|r| (r.line_len, *memo.spans(r.entry)));
        assert_eq!(r, Some((n + 1, 1)));
        assert_eq!(found(&mut memo, c), None, "the entry used longest ago was replaced");
        assert_eq!(found(&mut memo, d), Some((n, d.len())));
        // Only after a CRLF.
        let mut memo = Memo::default();
        memo.remember(&LINE[1..], 0, c, 3, [3], NONE);
        assert!(memo.recall(&head(LINE, c)).is_none());
        let mut memo = Memo::default();
        memo.remember(LINE, 0, a, 1, [1], NONE);
        memo.remember(LINE, 0, b, 2, [2], NONE);
        let d = &b"Host: eeeee\r\n\r\n"[..];
        // A miss backs off: 0, 1, 3, 7, ... heads are not looked up, up to
        // `MAX_BACKOFF`; a hit looks at every head again.
        let mut skipped = Vec::new();
        for _ in 0..10 {
            assert!(memo.probe());
            assert!(found(&mut memo, d).is_none());
            let mut n = 0;
            while !memo.probe() {
                n += 1;
            }
            skipped.push(n);
        }
        assert_eq!(skipped, [0, 1, 3, 7, 15, 31, 63, 63, 63, 63]);
        assert!(found(&mut memo, b).is_some());
        assert!(memo.probe());
        assert!(found(&mut memo, c).is_none());
        assert!(memo.probe(), "the first miss after a hit does not skip");
        // Too short or too long to keep.
        let mut memo = Memo::default();
        memo.remember(LINE, 0, b"\r\n", 1, [1], NONE);
        memo.remember(LINE, 0, &vec![b'a'; MEMO_ROOM + 1], 1, [1], NONE);
        assert!(memo.is_empty());
    }

    #[test]
    fn the_request_line_is_reused_only_when_it_is_the_same() {
        let block = &b"Host: a\r\nContent-Length: 0\r\n\r\n"[..];
        let mut memo = Memo::default();
        memo.remember(LINE, 7, block, 1, [1], NONE);
        let r = memo.recall(&head(LINE, block)).unwrap();
        let line = LineRecall::Same;
        assert_eq!(r, Recalled { entry: 0, version: 1, line_len: LINE.len(), block_len: block.len(), line });
        assert_eq!((*memo.spans(0), *memo.line_spans(0)), (1, 7));
        assert_eq!(memo.line_text(0).as_bytes(), LINE);
        assert_eq!(memo.fields(0), [1]);
        // Another line of the same length: the block is found, and the
        // remembered line is offered for comparison.
        let r = memo.recall(&head(b"POST /y HTTP/1.1\r\n", block)).unwrap();
        assert_eq!((*memo.spans(r.entry), r.line), (1, LineRecall::Like));
        // A line too long to keep is never taken for the same.
        let long = format!("POST /{} HTTP/1.1\r\n", "x".repeat(MEMO_ROOM)).into_bytes();
        memo.remember(&long, 7, block, 1, [1], NONE);
        let r = memo.recall(&head(&long, block)).unwrap();
        assert_eq!((r.line_len, r.line), (long.len(), LineRecall::Unknown));
    }

    #[test]
    fn visible_characters_are_told_eight_at_a_time_as_one_at_a_time() {
        for len in 0..20 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = byte;
                    assert_eq!(visible(&bytes), (0x21..=0x7e).contains(&byte), "{byte:#x} at {at} of {len}");
                }
            }
        }
        assert!(visible(b"!~!~!~!~!~!~!~!~!"));
    }

    /// The place of `value` in `block`, as the caller names a value that may vary.
    fn place(block: &[u8], value: &[u8]) -> (usize, usize) {
        let start = block.windows(value.len()).position(|w| w == value).unwrap();
        (start, start + value.len())
    }

    #[test]
    fn a_value_that_changes_is_learned_and_matched_by_visible_characters_only() {
        let block = |trace: &str, key: &str| format!("Host: h\r\nTraceparent: {trace}\r\nX-Key: {key}\r\n\r\n");
        let (a, b) = (block("00-aaaa-01", "k1"), block("00-bbbb-01", "k1"));
        // Only the trace's value may vary; the key's is read.
        let trace = |b: &str| [place(b.as_bytes(), b"00-")].map(|(s, _)| (s, s + 10));
        let mut memo = Memo::default();
        memo.remember(LINE, 0, a.as_bytes(), 1, [1], trace(&a).into_iter());
        memo.remember(LINE, 0, b"Host: other\r\n\r\n", 2, [2], NONE);
        let version = memo.recall(&head(LINE, a.as_bytes())).unwrap().version;
        assert_eq!(found(&mut memo, b.as_bytes()), None, "not learned yet");
        // `b` differs from `a` only in the trace: `a`'s entry learns it.
        memo.remember(LINE, 0, b.as_bytes(), 1, [1], trace(&b).into_iter());
        let r = memo.recall(&head(LINE, b.as_bytes())).unwrap();
        assert_eq!(r.entry, 0, "the other entry is kept");
        assert_ne!(r.version, version);
        assert!(found(&mut memo, b"Host: other\r\n\r\n").is_some());
        for (other, is_found) in [
            (block("00-cccc-01", "k1"), true),
            (block("~!\"#$%&'()", "k1"), true),
            (block("00-cc c-01", "k1"), false),
            (block("00-cc\tc-01", "k1"), false),
            (block("00-cc\x7fc-01", "k1"), false),
            (block("00-cc\x00c-01", "k1"), false),
            (block("00-cc\rc-01", "k1"), false),
            (block("00-cc\nc-01", "k1"), false),
            (block("00-cc\u{e9}-01", "k1"), false),
            (block("00-cccc-01", "k2"), false),
            (block("00-cccc-01", "k1").replace("Host: h", "Host: i"), false),
        ] {
            assert_eq!(found(&mut memo, other.as_bytes()).is_some(), is_found, "{other:?}");
        }
        // A block that differs outside the places that may vary is not learned.
        let c = block("00-aaaa-01", "k9");
        memo.remember(LINE, 0, c.as_bytes(), 3, [3], trace(&c).into_iter());
        assert_eq!(found(&mut memo, block("00-dddd-01", "k9").as_bytes()), None);
        assert!(found(&mut memo, block("00-dddd-01", "k1").as_bytes()).is_some(), "the learned entry stays");
        // Nor one whose values that differ are more than `MAX_FREE`.
        let many = |v: &str| format!("A: {v}\r\nB: {v}\r\nC: {v}\r\nD: {v}\r\nE: {v}\r\n\r\n");
        let places = |b: &str| {
            let b = b.as_bytes().to_vec();
            (0..b.len()).filter(|&i| b[i] == b':').map(move |i| (i + 2, i + 4)).collect::<Vec<_>>().into_iter()
        };
        let mut memo = Memo::default();
        memo.remember(LINE, 0, many("xx").as_bytes(), 1, [1], places(&many("xx")));
        memo.remember(LINE, 0, many("yy").as_bytes(), 1, [1], places(&many("yy")));
        assert_eq!(found(&mut memo, many("zz").as_bytes()), None);
        let four = many("yy").replacen("yy", "xx", 1);
        memo.remember(LINE, 0, four.as_bytes(), 1, [1], places(&four));
        assert!(found(&mut memo, many("zz").replacen("zz", "xx", 1).as_bytes()).is_some(), "four may vary");
        let five = many("zz").replacen("zz", "ww", 1);
        assert!(found(&mut memo, five.as_bytes()).is_none(), "a value not learned is the kept one's");
        // A place learned before stays free when another one is learned.
        let two = |t: &str, r: &str| format!("T: {t}\r\nR: {r}\r\n\r\n");
        let mut memo = Memo::default();
        for (t, r) in [("11", "11"), ("22", "11"), ("22", "22")] {
            memo.remember(LINE, 0, two(t, r).as_bytes(), 1, [1], places(&two(t, r)));
        }
        assert!(found(&mut memo, two("33", "33").as_bytes()).is_some());
    }

    #[test]
    fn an_entry_changes_version_whenever_its_block_or_its_line_does() {
        let (a, b) = (&b"Host: a\r\n\r\n"[..], &b"Host: bb\r\n\r\n"[..]);
        let mut memo = Memo::default();
        memo.remember(LINE, 0, a, 1, [1], NONE);
        let first = memo.recall(&head(LINE, a)).unwrap();
        assert_eq!(memo.recall(&head(LINE, a)).unwrap().version, first.version, "recalling changes nothing");
        // The same block with another line of the same length.
        memo.remember(b"POST /y HTTP/1.1\r\n", 0, a, 1, [1], NONE);
        let second = memo.recall(&head(b"POST /y HTTP/1.1\r\n", a)).unwrap();
        assert_eq!(second.entry, first.entry);
        assert_ne!(second.version, first.version);
        // Other blocks in the other entries, then in this one.
        memo.remember(LINE, 0, b, 2, [2], NONE);
        memo.remember(LINE, 0, &b"Host: ccc\r\n\r\n"[..], 3, [3], NONE);
        memo.remember(LINE, 0, &b"Host: dddd\r\n\r\n"[..], 4, [4], NONE);
        let versions: Vec<u32> = memo.entries.iter().map(|e| e.version).collect();
        assert!(!versions.contains(&second.version), "{versions:?}");
    }
}
