//! Per-second counters shared by the mock upstream and the workers, and the
//! measures computed from them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// No effective limit seen in this second.
pub const NONE: u64 = u64::MAX;

#[derive(Default)]
pub struct Bucket {
    // Counted by the upstream.
    pub calls: AtomicU64,
    pub ok: AtomicU64,
    pub refused_concurrency: AtomicU64,
    pub refused_rate: AtomicU64,
    pub inflight_sum: AtomicU64,
    pub inflight_samples: AtomicU64,
    pub inflight_max: AtomicU64,
    // Counted by the workers.
    pub seen_calls: AtomicU64,
    pub seen_429: AtomicU64,
    pub jobs: AtomicU64,
    pub acquire_denied: AtomicU64,
    pub acquire_errors: AtomicU64,
    pub effective_limit: AtomicU64,
}

/// The worker-side fields, in the order a child process sends them.
pub const WORKER_FIELDS: usize = 6;

impl Bucket {
    fn worker_fields(&self) -> [&AtomicU64; WORKER_FIELDS] {
        [
            &self.seen_calls,
            &self.seen_429,
            &self.jobs,
            &self.acquire_denied,
            &self.acquire_errors,
            &self.effective_limit,
        ]
    }
}

pub struct Timeline {
    pub buckets: Vec<Bucket>,
}

impl Timeline {
    /// One bucket per second of `secs`; later events land in the last one.
    pub fn new(secs: usize) -> Timeline {
        let buckets: Vec<Bucket> = (0..secs.max(1)).map(|_| Bucket::default()).collect();
        for b in &buckets {
            b.effective_limit.store(NONE, Relaxed);
        }
        Timeline { buckets }
    }

    pub fn at(&self, secs: f64) -> &Bucket {
        let i = (secs.max(0.0) as usize).min(self.buckets.len() - 1);
        &self.buckets[i]
    }

    /// The worker-side counters as rows of numbers (for a child process's report).
    pub fn worker_rows(&self) -> Vec<[u64; WORKER_FIELDS]> {
        self.buckets.iter().map(|b| b.worker_fields().map(|f| f.load(Relaxed))).collect()
    }

    /// Adds a child's worker-side rows; the effective limit is taken, not added.
    pub fn add_worker_rows(&self, rows: &[[u64; WORKER_FIELDS]]) {
        for (b, row) in self.buckets.iter().zip(rows) {
            for (i, (f, v)) in b.worker_fields().into_iter().zip(row).enumerate() {
                if i == WORKER_FIELDS - 1 {
                    if *v != NONE {
                        f.store(*v, Relaxed);
                    }
                } else {
                    f.fetch_add(*v, Relaxed);
                }
            }
        }
    }

    /// Sum of one field over buckets `[from, to)`.
    pub fn sum(&self, from: usize, to: usize, f: impl Fn(&Bucket) -> &AtomicU64) -> u64 {
        self.buckets[from.min(self.buckets.len())..to.min(self.buckets.len())].iter().map(|b| f(b).load(Relaxed)).sum()
    }

    pub fn refused(&self, i: usize) -> u64 {
        let b = &self.buckets[i];
        b.refused_concurrency.load(Relaxed) + b.refused_rate.load(Relaxed)
    }

    /// Seconds after `from` until the 429 share over every sliding `window`
    /// seconds up to `until` stays under 1 %; `None` if it never does.
    /// Windows without upstream calls count as clean.
    pub fn settle(&self, from: usize, until: usize, window: usize) -> Option<usize> {
        let until = until.min(self.buckets.len());
        let dirty = |k: usize| {
            let end = (k + window).min(until);
            let calls = self.sum(k, end, |b| &b.calls);
            let refused: u64 = (k..end).map(|i| self.refused(i)).sum();
            refused * 100 >= calls.max(1) && refused > 0
        };
        let last = until.saturating_sub(window);
        let last_dirty = (from..=last.max(from)).rev().find(|&k| dirty(k));
        match last_dirty {
            None => Some(0),
            Some(k) if k + 1 > last => None,
            Some(k) => Some(k + 1 - from),
        }
    }
}

/// The `q`-quantile (0..1) of sorted values, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(calls_refused: &[(u64, u64)]) -> Timeline {
        let t = Timeline::new(calls_refused.len());
        for (b, (c, r)) in t.buckets.iter().zip(calls_refused) {
            b.calls.store(*c, Relaxed);
            b.refused_rate.store(*r, Relaxed);
        }
        t
    }

    #[test]
    fn settle_is_the_first_second_after_the_last_dirty_window() {
        let t = timeline(&[(100, 20), (100, 5), (100, 0), (100, 0), (100, 0), (100, 0)]);
        // Windows of 2 s: [0,2) and [1,3) are dirty, [2,4) on are clean.
        assert_eq!(t.settle(0, 6, 2), Some(2));
        assert_eq!(t.settle(2, 6, 2), Some(0));
        let t = timeline(&[(100, 0), (100, 0), (100, 0), (100, 9)]);
        assert_eq!(t.settle(0, 4, 2), None);
        let t = timeline(&[(1000, 9), (1000, 0)]);
        assert_eq!(t.settle(0, 2, 1), Some(0));
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
