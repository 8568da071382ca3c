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
//! Kept only for pools whose access is the key alone: IP allow-lists, signed
//! requests, JWTs and Cloudflare tokens are always checked. Any reload
//! starts a new configuration `generation`, which no kept verdict matches.

use std::net::IpAddr;

use crate::governor::PoolId;
use crate::http::request::HeadRecall;

/// One connection's kept verdicts, one per memo entry.
#[derive(Default)]
pub struct Verdicts {
    entries: [Option<Verdict>; 2],
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

    /// Keeps what the head `recall` names was found to be.
    pub fn keep(&mut self, recall: HeadRecall, generation: u64, pool: PoolId, client: IpAddr, acquire: bool) {
        if let Some(slot) = self.entries.get_mut(recall.entry as usize) {
            let whole = recall.same_line;
            *slot = Some(Verdict { version: recall.version, generation, pool, client, acquire, whole });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recall(entry: u8, version: u32) -> HeadRecall {
        HeadRecall { entry, version, same_line: true }
    }

    #[test]
    fn a_verdict_holds_for_its_entry_version_and_generation_only() {
        let client: IpAddr = [127, 0, 0, 1].into();
        let mut v = Verdicts::default();
        assert_eq!(v.get(recall(0, 1), 0), None);
        v.keep(recall(0, 1), 7, PoolId(3), client, true);
        let kept = v.get(recall(0, 1), 7).unwrap();
        assert_eq!((kept.pool, kept.client, kept.acquire, kept.whole), (PoolId(3), client, true, true));
        let like = HeadRecall { same_line: false, ..recall(0, 1) };
        v.keep(like, 7, PoolId(4), client, true);
        assert!(!v.get(recall(0, 1), 7).unwrap().whole, "kept for a head with another line");
        v.keep(recall(0, 1), 7, PoolId(3), client, true);
        assert_eq!(v.get(recall(0, 2), 7), None, "another version of the entry");
        assert_eq!(v.get(recall(1, 1), 7), None, "the other entry");
        assert_eq!(v.get(recall(0, 1), 8), None, "after a reload");
        v.keep(recall(1, 4), 7, PoolId(5), client, false);
        assert!(v.get(recall(0, 1), 7).is_some() && v.get(recall(1, 4), 7).is_some());
        // Out-of-range entries are never kept or found.
        v.keep(recall(9, 1), 7, PoolId(1), client, true);
        assert_eq!(v.get(recall(9, 1), 7), None);
    }
}
