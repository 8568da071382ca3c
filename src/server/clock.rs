//! The only clock: monotonic milliseconds since start for every deadline,
//! and one wall-clock reading taken at start to show deadlines as Unix time.
//! Wall-clock steps never move a lease: only the monotonic clock decides.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::time::{Epoch, EpochMs, Ms, Now};

pub struct Clock {
    start: Instant,
    epoch: Epoch,
}

impl Clock {
    pub fn start() -> Clock {
        let start = Instant::now();
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        Clock { start, epoch: Epoch::at(EpochMs(unix_ms)) }
    }

    pub fn now_ms(&self) -> Ms {
        self.ms_at(Instant::now())
    }

    /// The monotonic milliseconds of an instant already read.
    pub fn ms_at(&self, at: Instant) -> Ms {
        crate::time::millis(at.saturating_duration_since(self.start))
    }

    /// The reading of an instant already read, with the wall time it maps to.
    pub fn at(&self, at: Instant) -> Now {
        Now { ms: self.ms_at(at), epoch: self.epoch }
    }

    /// The Unix time of monotonic 0.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}
