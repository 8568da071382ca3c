//! Pools sharded across instances (SPEC §14): HAProxy hashes each pool to one
//! instance and keeps it there (a stick table) until that instance leaves
//! rotation; then the pool moves to another, which must not grant the full
//! limit at once: the slots the old instance granted may still be held.
//!
//! HAProxy marks the first request of a pool whose instance went down with
//! `X-Nthpool-Moved`; the instance it reaches opens that pool's re-adoption
//! window for one term. Holders renew within their term, so every live slot
//! is re-adopted (counted) here before the window lets a new grant through.
//! A pool whose stick entry expired (idle for longer than a term) moves with
//! nothing alive and needs no window.

use super::{Governor, Ms, PoolId};

impl<T: Copy> Governor<T> {
    /// `pid`'s traffic arrives here from an instance taken out of rotation:
    /// opens its re-adoption window for one term from `now`, or keeps a
    /// longer one (a restart's) open. Once: every holder of the failed
    /// instance renews within a term of the first request the proxy moved,
    /// so the requests it marks moved after that one (all of them, until
    /// this instance answers one and the proxy records where the pool
    /// lives) extend nothing.
    pub fn moved_here(&mut self, pid: PoolId, now: Ms) {
        let pool = &mut self.pools[pid.0 as usize];
        if pool.moved_until.is_some_and(|until| until > now) {
            return;
        }
        let until = now + pool.settings.term_ms;
        pool.moved_until = Some(until);
        self.keep_recovering(pid, until);
    }
}

#[cfg(test)]
mod tests {
    use crate::governor::tests::{crashed_pair, denied, granted, granted_owners, id, queued};
    use crate::governor::{DenyReason, RenewError};

    const POOL: &str = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;

    #[test]
    fn a_pool_moved_to_a_running_instance_readopts_its_holders_before_granting() {
        let (mut old, mut new, p) = crashed_pair(POOL, 1_000_000);
        // `old` serves the pool; `new` has run all along (no restart window)
        // and the pool's traffic moves to it at 5000, when `old` fails.
        let a = granted(old.acquire(p, 0, 1, 4_000));
        let b = granted(old.acquire(p, 0, 2, 4_500));
        assert_eq!(new.renew(p, &id(&a), 4_990), Err(RenewError::NotFound), "not without the move");
        new.moved_here(p, 5_000);
        assert_eq!(new.renew(p, &id(&a), 5_000), Ok(6_000));
        let d = denied(new.acquire(p, 0, 3, 5_010));
        assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Recovering, 990));
        queued(new.acquire(p, 10_000, 4, 5_020));
        assert!(new.release(p, &id(&b), None, 5_100));
        assert_eq!(new.renew(p, &id(&a), 5_500), Ok(6_500));
        assert_eq!(new.pool(p).stats.readopted, 2);
        // At the window's end the waiter takes the slot `b` freed; `a` holds the other.
        assert!(granted_owners(&mut new).is_empty(), "nothing granted in the window");
        new.advance(6_000);
        assert!(!new.pool(p).recovering(6_000));
        assert_eq!(granted_owners(&mut new), [4], "the waiter, at the window's end");
        assert_eq!(new.pool(p).held, 2);
        assert_eq!(denied(new.acquire(p, 0, 5, 6_001)).reason, DenyReason::Concurrency);
    }

    #[test]
    fn requests_marked_moved_after_the_first_extend_nothing() {
        let (_, mut new, p) = crashed_pair(POOL, 1_000_000);
        new.moved_here(p, 5_000);
        for at in [5_100, 5_500, 5_999] {
            new.moved_here(p, at);
        }
        assert!(new.pool(p).recovering(5_999) && !new.pool(p).recovering(6_000), "one term from the first");
        new.advance(6_000);
        granted(new.acquire(p, 0, 1, 6_000));
        // A move after that window (the pool failed over again) opens another.
        new.moved_here(p, 9_000);
        assert!(new.pool(p).recovering(9_999) && !new.pool(p).recovering(10_000));
    }

    #[test]
    fn a_move_during_a_restart_window_extends_it_to_a_term_after_the_move() {
        let (mut old, mut new, p) = crashed_pair(POOL, 1_000_000);
        new.open_recovery_window(0);
        new.moved_here(p, 800);
        assert!(new.pool(p).recovering(1_799) && !new.pool(p).recovering(1_800));
        let a = granted(old.acquire(p, 0, 1, 0));
        assert!(new.renew(p, &id(&a), 1_700).is_ok(), "re-adopted after the restart window alone closed");
        new.advance(1_800);
        assert_eq!(new.pool(p).held, 1);
        granted(new.acquire(p, 0, 2, 1_800));
        assert_eq!(denied(new.acquire(p, 0, 3, 1_801)).reason, DenyReason::Concurrency);
    }
}
