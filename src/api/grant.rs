//! The `200` answer to an acquire, from as much prepared text as possible.
//!
//! A grant's body is `{"slotId":"<56 characters>"` followed by its two
//! deadlines and its pool's `termMs` and `renewIntervalMs`. Every grant of a
//! pool in the same reactor turn has the same deadlines, so that tail is
//! formatted once and copied for the others; a later turn's deadlines differ
//! from the last ones in their last digits only (by the milliseconds between
//! the two grants), and only those digits are written again, so a client
//! that sends one request a millisecond or slower pays for a few digits, not
//! for four numbers. Of the head, only the
//! remaining-slots number changes from one grant to the next while nobody
//! queues: the governor lines after it, `Content-Type`, `Content-Length` and
//! the connection line are kept as one text, rebuilt when one of their
//! values changes. The answer is written straight into the connection's
//! buffer, with no body assembled on the side.

use super::REMAINING_SLOTS;
use crate::governor::lease::SLOT_ID_CHARS;
use crate::governor::{Grant, Signals};
use crate::http::response::{json_head_end, json_u64, ok_start, push_u64, OK_START_LEN};
use crate::time::Now;

const BODY_START: &[u8] = b"{\"slotId\":\"";

/// The prepared text of grant answers.
#[derive(Default)]
pub struct GrantTail {
    /// Unix lease deadline, Unix request deadline, termMs, renewIntervalMs.
    values: Option<[u64; 4]>,
    text: Vec<u8>,
    /// Where the two deadlines' digits end in `text`.
    deadline_ends: [usize; 2],
    /// What `head` was built from: the signals (remaining slots zeroed), the
    /// queued time, the body length and whether the connection closes.
    head_values: Option<(Signals, u64, usize, bool)>,
    /// The head after the remaining-slots number, empty line included,
    /// and the body's opening.
    head: Vec<u8>,
}

impl GrantTail {
    /// The tail for these values, formatted only when they changed since the last grant.
    fn text(&mut self, values: [u64; 4]) -> &[u8] {
        let kept = self.values.is_some_and(|old| {
            old == values
                || old[2..] == values[2..] && self.rewrite(0, old[0], values[0]) && self.rewrite(1, old[1], values[1])
        });
        if !kept {
            self.build(values);
        }
        self.values = Some(values);
        &self.text
    }

    /// Formats the tail afresh.
    fn build(&mut self, values: [u64; 4]) {
        let [lease, request, term, renew] = values;
        let t = &mut self.text;
        t.clear();
        t.push(b'"');
        for (i, (name, value)) in [
            (&b"leaseDeadline"[..], lease),
            (b"requestDeadline", request),
            (b"termMs", term),
            (b"renewIntervalMs", renew),
        ]
        .into_iter()
        .enumerate()
        {
            t.push(b',');
            json_u64(t, name, value);
            if let Some(end) = self.deadline_ends.get_mut(i) {
                *end = t.len();
            }
        }
        t.push(b'}');
    }

    /// Writes deadline `i`, in the text as `old`, as `new`: the digits from
    /// the last up to the first that the two share with all before it.
    /// False, with the text half written, when the two have not the same
    /// number of digits.
    fn rewrite(&mut self, i: usize, mut old: u64, mut new: u64) -> bool {
        let mut at = self.deadline_ends[i];
        while old != new {
            at -= 1;
            self.text[at] = b'0' + (new % 10) as u8;
            (old, new) = (old / 10, new / 10);
            if (old == 0) != (new == 0) {
                return false;
            }
        }
        true
    }

    /// Writes the whole `200` answer, governor headers included.
    pub fn write(&mut self, out: &mut Vec<u8>, grant: &Grant, now: Now, close: bool) {
        self.text([
            now.wall_at(grant.lease_deadline).0,
            now.wall_at(grant.request_deadline).0,
            grant.term_ms,
            grant.renew_interval_ms,
        ]);
        let body_len = BODY_START.len() + SLOT_ID_CHARS + self.text.len();
        let key = (Signals { remaining_slots: 0, ..grant.signals }, grant.queued_ms, body_len, close);
        if self.head_values != Some(key) {
            self.head.clear();
            super::governor_headers_after_remaining(&mut self.head, &grant.signals, grant.queued_ms);
            json_head_end(&mut self.head, body_len as u64, close);
            self.head.extend_from_slice(BODY_START);
            self.head_values = Some(key);
        }
        // Five copies: the constant start, the number, the cached head, the
        // slot id, the cached body tail.
        let mut start = [0u8; OK_START_LEN + REMAINING_SLOTS.len()];
        start[..OK_START_LEN].copy_from_slice(&ok_start());
        start[OK_START_LEN..].copy_from_slice(REMAINING_SLOTS);
        out.reserve(512);
        out.extend_from_slice(&start);
        push_u64(out, grant.signals.remaining_slots as u64);
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&grant.text);
        out.extend_from_slice(&self.text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governor::lease::{SlotId, SLOT_ID_BYTES};
    use crate::governor::Signals;
    use crate::time::{Epoch, EpochMs};

    fn grant(lease_deadline: u64) -> Grant {
        Grant {
            slot: SlotId([7; SLOT_ID_BYTES]),
            text: SlotId([7; SLOT_ID_BYTES]).encode(),
            lease_deadline,
            request_deadline: 600_000,
            term_ms: 30_000,
            renew_interval_ms: 10_000,
            queued_ms: 0,
            signals: Signals { remaining_slots: 3, effective_limit: 4, limit: 4, queue_depth: 0, rpm_remaining: None },
        }
    }

    fn body(out: &[u8]) -> serde_json::Value {
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = std::str::from_utf8(&out[..at]).unwrap();
        let len: usize = head.split("Content-Length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
        assert_eq!(len, out.len() - at, "Content-Length matches the body");
        serde_json::from_slice(&out[at..]).unwrap()
    }

    #[test]
    fn a_tail_rewritten_in_place_reads_as_one_formatted_afresh() {
        let mut tail = GrantTail::default();
        let mut fresh = GrantTail::default();
        let base = 1_799_999_999_990u64;
        // Steps of one millisecond and more, carries through every digit,
        // a deadline gaining and losing a digit, a term that changes.
        let steps: &[(u64, u64, u64)] = &[
            (base, 30_000, 30_000),
            (base + 1, 30_000, 30_000),
            (base + 9, 30_000, 30_000),
            (base + 10, 30_000, 30_000),
            (base + 10, 30_000, 30_000),
            (base + 123_456, 30_000, 30_000),
            (9_999_999_999_998, 1, 30_000),
            (9_999_999_999_999, 1, 30_000),
            (9_999_999_999_999, 2, 30_000),
            (10_000_000_000_000, 0, 30_000),
            (9_999_999_999_999, 0, 30_000),
            (5, 7, 30_000),
            (5, 7, 500),
            (base, 30_000, 30_000),
            (base - 1, 30_000, 30_000),
        ];
        for &(lease, request, term) in steps {
            let values = [lease, request, term, 10_000];
            fresh.values = None;
            let want = fresh.text(values).to_vec();
            assert_eq!(tail.text(values), &want[..], "{values:?}");
            let v: serde_json::Value =
                serde_json::from_slice(&[b"{\"slotId\":\"x".as_slice(), &want].concat()).unwrap();
            assert_eq!((v["leaseDeadline"].as_u64(), v["requestDeadline"].as_u64()), (Some(lease), Some(request)));
        }
    }

    #[test]
    fn a_reused_tail_follows_changed_values() {
        let mut tail = GrantTail::default();
        let base = 1_800_000_000_000;
        // Deadline, remaining slots, queue depth, close: each change must show.
        for (lease, remaining, depth, close) in [
            (30_000, 3, 0, false),
            (30_000, 2, 0, false),
            (31_000, 2, 0, false),
            (31_000, 2, 5, false),
            (31_000, 1_000_000, 5, true),
            (30_000, 3, 0, false),
        ] {
            let mut out = Vec::new();
            let mut g = grant(lease);
            g.signals.remaining_slots = remaining;
            g.signals.queue_depth = depth;
            tail.write(&mut out, &g, Now { ms: 0, epoch: Epoch::at(EpochMs(base)) }, close);
            let v = body(&out);
            assert_eq!(v["slotId"].as_str().unwrap().as_bytes(), g.slot.encode());
            assert_eq!(v["leaseDeadline"], base + lease);
            assert_eq!(v["requestDeadline"], base + 600_000);
            assert_eq!(v["termMs"], 30_000);
            assert_eq!(v["renewIntervalMs"], 10_000);
            let head = std::str::from_utf8(&out[..out.windows(4).position(|w| w == b"\r\n\r\n").unwrap()]).unwrap();
            assert!(head.starts_with("HTTP/1.1 200 OK\r\nDate: "), "{head}");
            assert!(head.contains(&format!("\r\nx-nthpool-remaining-slots: {remaining}\r\n")), "{head}");
            assert!(head.contains(&format!("\r\nx-nthpool-queue-depth: {depth}\r\n")), "{head}");
            assert!(head.contains("\r\nx-nthpool-effective-limit: 4\r\nx-nthpool-queued-ms: 0\r\n"), "{head}");
            assert_eq!(head.ends_with("\r\nConnection: close"), close, "{head}");
        }
    }
}
