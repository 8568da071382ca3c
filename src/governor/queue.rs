//! Per-pool FIFO wait queues, threaded through one slab of waiters.
//!
//! Each waiter carries `prev`/`next` indices, so enqueue, dequeue of the head
//! and removal of any waiter (its client went away, its deadline passed) are
//! all O(1). The queue never decides who is granted; `Governor` does.

use slab::Slab;

use super::id::PoolId;
use crate::time::Ms;
use crate::wheel::TimerKey;

const NIL: u32 = u32::MAX;

/// "No `Idempotency-Key`": the value of `Waiter::idem` and `Lease::idem` without one.
pub const NO_KEY: u32 = u32::MAX;

/// Identifies a queued acquire; only valid with its owner (see `Governor::cancel_waiter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaiterKey(pub(super) u32);

impl WaiterKey {
    /// Its place among the waiters now queued (taken again once it leaves):
    /// for a side table of what its caller keeps per waiter.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

pub struct Waiter {
    pub pool: PoolId,
    pub owner: u64,
    /// When its request was read (before it was queued, for one that waited
    /// in its connection's input): its queued time runs from here.
    pub enqueued_at: Ms,
    pub timer: TimerKey,
    /// Its `Idempotency-Key`'s entry in the pool's store, or `NO_KEY`.
    pub idem: u32,
    prev: u32,
    next: u32,
}

/// The ends of one pool's queue.
#[derive(Clone, Copy, Debug)]
pub struct Queue {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for Queue {
    fn default() -> Self {
        Queue { head: NIL, tail: NIL, len: 0 }
    }
}

impl Queue {
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn head(&self) -> Option<WaiterKey> {
        (self.head != NIL).then_some(WaiterKey(self.head))
    }
}

/// All waiters of all pools.
#[derive(Default)]
pub struct Waiters {
    slab: Slab<Waiter>,
}

impl Waiters {
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// The key the next `push_back` will return.
    pub fn vacant_key(&self) -> u32 {
        self.slab.vacant_key() as u32
    }

    pub fn get(&self, key: WaiterKey) -> Option<&Waiter> {
        self.slab.get(key.0 as usize)
    }

    pub fn get_mut(&mut self, key: WaiterKey) -> Option<&mut Waiter> {
        self.slab.get_mut(key.0 as usize)
    }

    /// Appends a waiter at the tail of `queue`.
    pub fn push_back(
        &mut self,
        queue: &mut Queue,
        pool: PoolId,
        owner: u64,
        enqueued_at: Ms,
        timer: TimerKey,
    ) -> WaiterKey {
        let idx =
            self.slab.insert(Waiter { pool, owner, enqueued_at, timer, idem: NO_KEY, prev: queue.tail, next: NIL })
                as u32;
        if queue.tail == NIL {
            queue.head = idx;
        } else {
            self.slab[queue.tail as usize].next = idx;
        }
        queue.tail = idx;
        queue.len += 1;
        WaiterKey(idx)
    }

    /// Unlinks a waiter from `queue` wherever it stands and returns it.
    pub fn remove(&mut self, queue: &mut Queue, key: WaiterKey) -> Waiter {
        let w = self.slab.remove(key.0 as usize);
        debug_assert!(queue.len > 0);
        if w.prev == NIL {
            debug_assert_eq!(queue.head, key.0);
            queue.head = w.next;
        } else {
            self.slab[w.prev as usize].next = w.next;
        }
        if w.next == NIL {
            debug_assert_eq!(queue.tail, key.0);
            queue.tail = w.prev;
        } else {
            self.slab[w.next as usize].prev = w.prev;
        }
        queue.len -= 1;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wheel::Wheel;

    fn order(waiters: &Waiters, q: &Queue) -> Vec<u64> {
        let mut out = Vec::new();
        let mut idx = q.head;
        while idx != NIL {
            let w = &waiters.slab[idx as usize];
            out.push(w.owner);
            idx = w.next;
        }
        out
    }

    #[test]
    fn fifo_with_removal_anywhere() {
        let mut wheel = Wheel::<()>::new();
        let mut ws = Waiters::default();
        let mut q = Queue::default();
        let keys: Vec<_> = (0..5).map(|i| ws.push_back(&mut q, PoolId(0), i, 0, wheel.insert(0, ()))).collect();
        assert_eq!(order(&ws, &q), vec![0, 1, 2, 3, 4]);
        ws.remove(&mut q, keys[2]);
        assert_eq!(order(&ws, &q), vec![0, 1, 3, 4]);
        ws.remove(&mut q, keys[0]);
        ws.remove(&mut q, keys[4]);
        assert_eq!(order(&ws, &q), vec![1, 3]);
        assert_eq!(q.len(), 2);
        let k = ws.push_back(&mut q, PoolId(0), 9, 0, wheel.insert(0, ()));
        assert_eq!(order(&ws, &q), vec![1, 3, 9]);
        ws.remove(&mut q, keys[1]);
        ws.remove(&mut q, keys[3]);
        ws.remove(&mut q, k);
        assert!(q.is_empty());
        assert_eq!(q.head(), None);
        assert_eq!(ws.len(), 0);
    }
}
