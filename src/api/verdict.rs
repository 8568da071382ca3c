//! What a connection's remembered heads were found to be.
//!
//! A head whose header block the connection remembered carries
//! `Head::recall`: the memo's entry and its version. Same entry and version,
//! same block after the same remembered request line; under the same
//! configuration, the same block gets the same answer from the checks that
//! read only the head (the key, and the client's address from the peer and
//! `X-Forwarded-For`) for the same pool and kind of request. So each
//! connection keeps, per memo entry, the pool and client address its last
//! head there was authorized for, whether that head was an acquire, and
//! whether it was the entry's remembered head whole (request line included):
//! only then does a head repeated whole get the same route and pool without
//! being routed. (A head with another line of the same length, an acquire
//! on another pool say, recalls the same entry: its verdict is for its own
//! pool, which the remembered line need not name.)
//!
//! A renew or release names a new slot id every time, so its line is never
//! the remembered one whole. Its verdict keeps where its slot id lay in its
//! path, when the path was the remembered line's path everywhere else
//! (`SlotAt`): a later head whose path is the remembered one outside that
//! span, and holds one path segment inside it, is the same route on the same
//! pool with another slot id, and is not routed again either.
//!
//! Kept only for pools whose access is the key alone: IP allow-lists, signed
//! requests, JWTs and Cloudflare tokens are always checked. Any reload
//! starts a new configuration `generation`, which no kept verdict matches.

use std::net::IpAddr;

use super::Lock;
use crate::governor::PoolId;
use crate::http::request::HeadRecall;
use crate::http::{find_slash_or_query, same_bytes};

/// One connection's kept verdicts, one per memo entry.
#[derive(Default)]
pub struct Verdicts {
    entries: [Option<Verdict>; crate::http::memo::ENTRIES],
}

/// A head found to be for `pool` from `client`, authorized under the
/// configuration of `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    version: u32,
    generation: u64,
    pub pool: PoolId,
    pub client: IpAddr,
    /// The head was an acquire (authorized as one: a retired pool is not).
    pub acquire: bool,
    /// The head was the entry's remembered one whole (`HeadRecall::same_line`).
    pub whole: bool,
    /// The head was a renew or release whose path was the remembered one
    /// but for its slot id: where that lies.
    pub slot: Option<SlotAt>,
}

/// Where a renew's or release's slot id lies in a path that is otherwise
/// the remembered line's (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAt {
    start: u16,
    end: u16,
    release: bool,
}

impl SlotAt {
    /// Where the slot id `lock` names, a slice of `path`, lies in it, when
    /// `path` is `remembered` everywhere else.
    pub(super) fn find(lock: Lock, path: &[u8], remembered: &[u8]) -> Option<SlotAt> {
        let (slot, release) = match lock {
            Lock::Acquire => return None,
            Lock::Renew(slot) => (slot, false),
            Lock::Release(slot) => (slot, true),
        };
        let start = (slot.as_ptr() as usize).checked_sub(path.as_ptr() as usize)?;
        let end = start + slot.len();
        let at = SlotAt { start: u16::try_from(start).ok()?, end: u16::try_from(end).ok()?, release };
        (path.get(start..end).is_some_and(|s| s.as_ptr() == slot.as_ptr()) && at.lock(path, remembered) == Some(lock))
            .then_some(at)
    }

    /// What `path` asks for when it is `remembered` outside this span and
    /// the span is one path segment (no `/` or `?`): the route this was
    /// found in, naming the slot id in the span. (A route's slot id is never
    /// empty and a `/` follows it, so the segment ends where it did.)
    pub(super) fn lock<'p>(self, path: &'p [u8], remembered: &[u8]) -> Option<Lock<'p>> {
        let (start, end) = (self.start as usize, self.end as usize);
        if path.len() != remembered.len() || end > path.len() {
            return None;
        }
        let slot = &path[start..end];
        let same = same_bytes(&path[..start], &remembered[..start]) && same_bytes(&path[end..], &remembered[end..]);
        (same && find_slash_or_query(slot).is_none()).then_some(if self.release {
            Lock::Release(slot)
        } else {
            Lock::Renew(slot)
        })
    }
}

impl Verdicts {
    /// The verdict kept about the head `recall` names, if it still holds.
    pub fn get(&self, recall: HeadRecall, generation: u64) -> Option<Verdict> {
        self.entries
            .get(recall.entry as usize)
            .copied()
            .flatten()
            .filter(|v| v.version == recall.version && v.generation == generation)
    }

    /// Keeps what the head `recall` names was found to be: `lock` on `pool`
    /// from `client`, its path being `path`.
    pub(super) fn keep(
        &mut self,
        recall: HeadRecall,
        generation: u64,
        pool: PoolId,
        client: IpAddr,
        lock: Lock,
        path: &[u8],
    ) {
        if let Some(kept) = self.entries.get_mut(recall.entry as usize) {
            let (whole, acquire) = (recall.same_line, lock == Lock::Acquire);
            let slot = recall.path.and_then(|remembered| SlotAt::find(lock, path, remembered));
            *kept = Some(Verdict { version: recall.version, generation, pool, client, acquire, whole, slot });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::route::{route, Route};

    fn recall(entry: u8, version: u32) -> HeadRecall<'static> {
        HeadRecall { entry, version, same_line: true, path: None }
    }

    const ACQUIRE: &[u8] = b"/pools/p/lock/acquire";

    #[test]
    fn a_verdict_holds_for_its_entry_version_and_generation_only() {
        let client: IpAddr = [127, 0, 0, 1].into();
        let mut v = Verdicts::default();
        assert_eq!(v.get(recall(0, 1), 0), None);
        v.keep(recall(0, 1), 7, PoolId(3), client, Lock::Acquire, ACQUIRE);
        let kept = v.get(recall(0, 1), 7).unwrap();
        assert_eq!((kept.pool, kept.client, kept.acquire, kept.whole), (PoolId(3), client, true, true));
        let like = HeadRecall { same_line: false, ..recall(0, 1) };
        v.keep(like, 7, PoolId(4), client, Lock::Acquire, ACQUIRE);
        assert!(!v.get(recall(0, 1), 7).unwrap().whole, "kept for a head with another line");
        v.keep(recall(0, 1), 7, PoolId(3), client, Lock::Acquire, ACQUIRE);
        assert_eq!(v.get(recall(0, 2), 7), None, "another version of the entry");
        assert_eq!(v.get(recall(1, 1), 7), None, "the other entry");
        assert_eq!(v.get(recall(0, 1), 8), None, "after a reload");
        v.keep(recall(1, 4), 7, PoolId(5), client, Lock::Renew(b"x"), b"/pools/p/lock/x/renew");
        assert!(v.get(recall(0, 1), 7).is_some() && v.get(recall(1, 4), 7).is_some());
        // Out-of-range entries are never kept or found.
        v.keep(recall(9, 1), 7, PoolId(1), client, Lock::Acquire, ACQUIRE);
        assert_eq!(v.get(recall(9, 1), 7), None);
    }

    /// The lock `route` finds in `path`.
    fn routed(path: &[u8]) -> Option<Lock<'_>> {
        route(path).map(Lock::of)
    }

    #[test]
    fn a_slot_span_is_kept_only_for_a_path_that_is_the_remembered_one_elsewhere() {
        let client: IpAddr = [127, 0, 0, 1].into();
        let remembered = b"/pools/p/lock/AAAA/release?x";
        let at = |path: &'static [u8]| {
            let mut v = Verdicts::default();
            let recall = HeadRecall { same_line: false, path: Some(remembered), ..recall(0, 1) };
            v.keep(recall, 1, PoolId(0), client, routed(path).unwrap(), path);
            v.get(recall, 1).unwrap().slot
        };
        let span = Some(SlotAt { start: 14, end: 18, release: true });
        assert_eq!(at(b"/pools/p/lock/BBBB/release?x"), span);
        assert_eq!(at(b"/pools/p/lock/AAAA/release?x"), span);
        assert_eq!(at(b"/pools/q/lock/BBBB/release?x"), None, "another pool");
        assert_eq!(at(b"/pools/p/lock/BBBB/release?y"), None, "another query");
        assert_eq!(at(b"/pools/p/lock/BBB/release?xy"), None, "another span");
        assert_eq!(at(b"/pools/p/lock/BBBB/renew?xyz"), None, "another route");
        assert_eq!(at(b"/pools/p/lock/acquire?xyzwvu"), None, "an acquire");
    }

    #[test]
    fn a_path_taken_by_a_slot_span_routes_the_same() {
        // Every path one or two bytes away from the remembered one, in every
        // place, with bytes that end segments, start queries or are plain:
        // whatever the span takes, the router reads the same way.
        let remembered = b"/pools/pool/lock/AbCdEfGhIjKlMnOp/renew?q";
        let lock = routed(remembered).unwrap();
        let at = SlotAt::find(lock, remembered, remembered).expect("the remembered path itself");
        let (mut taken, mut checked) = (0, 0);
        let bytes = [b'/', b'?', b'#', b'x', b'A', b'-', b'%', b' ', 0x80];
        for i in 0..remembered.len() {
            for j in i..remembered.len() {
                for (&a, &b) in bytes.iter().flat_map(|a| bytes.iter().map(move |b| (a, b))) {
                    let mut path = remembered.to_vec();
                    path[i] = a;
                    path[j] = b;
                    checked += 1;
                    if let Some(found) = at.lock(&path, remembered) {
                        taken += 1;
                        assert_eq!(Some(found), routed(&path), "{}", String::from_utf8_lossy(&path));
                        assert!(matches!(route(&path), Some(Route::Renew { pool: b"pool", .. })));
                    }
                }
            }
        }
        assert!(taken > checked / 20, "{taken} of {checked}");
        assert_eq!(at.lock(&remembered[1..], &remembered[1..]), None, "a path of another length");
    }
}
