//! The identifier of a configured pool, shared by the pool table, the wait
//! queues and the lease table without their importing each other.

/// A pool's index in the governor's pool table; stable for the process's life
/// (a pool dropped by a reload is retired, not removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u32);
