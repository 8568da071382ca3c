//! The only clock: monotonic milliseconds since start for every deadline,
//! and one wall-clock reading taken at start to show deadlines as Unix time.
//! Wall-clock steps never move a lease: only the monotonic clock decides.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::governor::Ms;

pub struct Clock {
    start: Instant,
    epoch_base_ms: u64,
}

impl Clock {
    pub fn start() -> Clock {
        let start = Instant::now();
        let epoch_base_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        Clock { start, epoch_base_ms }
    }

    pub fn now_ms(&self) -> Ms {
        self.ms_at(Instant::now())
    }

    /// The monotonic milliseconds of an instant already read.
    pub fn ms_at(&self, at: Instant) -> Ms {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    /// Unix epoch milliseconds at monotonic 0.
    pub fn epoch_base_ms(&self) -> u64 {
        self.epoch_base_ms
    }
}
