//! The one door between the reactor and the application.
//!
//! The reactor hands in requests (`App::handle`, `App::reject` and the
//! other answers in `api/mod.rs`) with the turn's [`Now`]; it schedules its
//! own deadlines on the one timer wheel with a typed [`Wake`]; and after
//! advancing the time it drains what happened meanwhile as [`Event`]s — a
//! queued acquire's answer for a connection (written with
//! [`App::answer_notice`]) or one of its own timers. It never reaches the
//! governor, and the application never sees a socket.

use super::{ApiError, App, Queued};
use crate::accesslog;
use crate::config::Config;
use crate::governor::history::Attempts;
use crate::governor::lease::SlotId;
use crate::governor::{Denial, Grant, Leaving, Notice, PoolId};
use crate::http::response::Status;
use crate::state::Persistence;
use crate::time::{Epoch, Ms, Now};
use crate::wheel::TimerKey;

/// A reactor connection for its whole life: its slab index and a serial,
/// so a reused index is another connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId {
    pub index: u32,
    pub serial: u32,
}

impl ConnId {
    /// The governor's name for the caller that waits in a queue.
    pub(super) fn owner(self) -> u64 {
        (self.index as u64) | ((self.serial as u64) << 32)
    }

    fn from_owner(owner: u64) -> ConnId {
        ConnId { index: (owner & 0xffff_ffff) as u32, serial: (owner >> 32) as u32 }
    }
}

/// A deadline of the reactor's own, handed back as `Event::Wake`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Accepting paused (out of file descriptors): try again.
    Accept,
    /// The admin listener had more to accept than a turn takes: the rest.
    AdminAccept,
    /// A connection's deadline may have come; it re-checks and re-arms.
    Conn(ConnId),
    /// Time for the periodic snapshot (`snapshotIntervalMs`).
    Snapshot,
    /// Idle upstream connections may be past their `idleTimeoutMs`.
    UpstreamIdle,
    /// A warning left out by its once-a-while rule (a failed accept's, an
    /// upstream's) may have its interval ended with none like it written:
    /// the count of those left out is written.
    Warnings,
}

/// What the application's own entries on the wheel stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    Reactor(Wake),
    /// The access log's buffer is written out at the latest by now.
    FlushLog,
}

/// The governor's answer to a queued acquire, for `App::answer_notice`.
#[derive(Debug)]
pub enum Answer {
    Granted(Grant),
    TimedOut(Denial),
    /// A retry under the same `Idempotency-Key` took its place (`409`).
    Superseded,
}

/// What happened since the reactor last asked.
#[derive(Debug)]
pub enum Event {
    /// A queued acquire of this connection is answered.
    Answer(ConnId, Answer),
    Wake(Wake),
}

impl App {
    /// Takes the slot secret and the Unix time of monotonic 0, then restores
    /// the last stop's snapshot or, without a usable one, opens the
    /// re-adoption window (`state::start` decides which). The reactor keeps
    /// what it returns to write the next snapshot. No snapshot holds the
    /// spent HMAC nonces, so requests signed before this start are refused.
    pub fn start_state(
        &mut self,
        config: &Config,
        config_path: Option<&std::path::Path>,
        lock: crate::state::StateLock,
        epoch: Epoch,
    ) -> Result<Persistence, String> {
        for creds in &mut self.creds {
            creds.access.refuse_signed_before(epoch.wall(0));
        }
        let state = crate::state::start(config, config_path, lock, &mut self.gov, 0, epoch)?;
        self.fit_retired_pools();
        // The counters a snapshot brought back were counted before this
        // start: the charts begin from them, rather than showing them all as
        // the events of its first second.
        for ((_, pool), (history, _)) in self.gov.pools().zip(&mut self.history) {
            history.forget();
            history.begin(pool, self.turn.ms);
        }
        Ok(state)
    }

    /// The snapshot of a graceful stop, written before the process exits.
    pub fn write_stop_snapshot(&self, state: &mut Persistence, now: Ms) {
        state.write_stop(&self.gov, now);
    }

    /// How long the stop's snapshot of the slots held now, and of every
    /// pool's learned state, is expected to take, in ms.
    pub fn stop_snapshot_ms(&self, state: &Persistence) -> u64 {
        state.stop_snapshot_ms(self.gov.held_total(), self.gov.pools().count())
    }

    /// The periodic snapshot: copied here, written on a thread of its own.
    pub fn write_periodic_snapshot(&self, state: &mut Persistence, now: Ms) {
        state.write_periodic(&self.gov, now);
    }

    /// A reload applied `config`: the next snapshot follows it, and the pools
    /// it `added` (this process never had them) whose leases a process
    /// before this one may have left alive open their re-adoption windows
    /// (`Persistence::reconfigured`). True when the periodic snapshot's
    /// timer must be armed again.
    pub fn reconfigure_state(
        &mut self,
        state: &mut Persistence,
        config: &Config,
        config_path: &std::path::Path,
        added: &[String],
        now: Now,
    ) -> bool {
        state.reconfigured(&mut self.gov, config, config_path, added, now)
    }

    /// The pool named `name`, if configured.
    pub fn pool_id(&self, name: &str) -> Option<PoolId> {
        self.gov.pool_id(name)
    }

    /// The name of pool `pid`.
    pub fn pool_name(&self, pid: PoolId) -> &str {
        &self.gov.pool(pid).name
    }

    /// Whether any pool's re-adoption window is open at `now`.
    pub fn recovering(&self, now: Ms) -> bool {
        self.gov.recovering(now)
    }

    /// Starts a reactor turn at `now`: the dashboard's history is sampled
    /// once per second of it.
    pub fn begin_turn(&mut self, now: Now) {
        if now.epoch != self.turn.epoch {
            // The wall clock was stepped: ids, snapshots and the start of
            // each nonce store follow it (the first turn's has no epoch before it).
            if self.turn.epoch != Epoch::default() {
                for creds in &mut self.creds {
                    creds.access.follow_epoch(self.turn.epoch, now.epoch);
                }
            }
            self.gov.set_epoch(now.epoch);
        }
        self.turn = now;
        if self.history_second == Some(now.ms / 1000) {
            return;
        }
        self.history_second = Some(now.ms / 1000);
        let pools = self.gov.pools().zip(self.history.iter_mut().zip(&mut self.creds));
        for ((_, pool), ((h, attempts), creds)) in pools {
            if !pool.drained_away() {
                h.sample(pool, now.ms);
                continue;
            }
            // Nobody is shown it any more: give its memory back.
            h.forget();
            *attempts = Attempts::default();
            if !creds.shed {
                // Nor has it leases to guard: its nonces and upstream go too.
                // Its keys stay, to tell a release of one of its ids `404`.
                creds.access.shed(now.wall());
                creds.upstream = None;
                creds.shed = true;
            }
        }
        self.gov.shed_drained();
    }

    /// Fires every deadline due by `now`: reclaims, queue deadlines,
    /// wake-ups, the reactor's own timers. What they decide comes out of
    /// `next_event`.
    pub fn advance(&mut self, now: Ms) {
        self.gov.advance(now);
    }

    /// When `advance` next has work to do.
    pub fn next_deadline(&self) -> Option<Ms> {
        self.gov.next_deadline()
    }

    /// Schedules a deadline of the reactor's; it comes back as `Event::Wake`.
    pub fn schedule(&mut self, at: Ms, wake: Wake) -> TimerKey {
        self.gov.schedule(at, Timer::Reactor(wake))
    }

    pub fn cancel_timer(&mut self, key: TimerKey) {
        self.gov.cancel_timer(key);
    }

    /// The next thing the reactor must act on; the application's own timers
    /// (the access log's flush) are handled on the way.
    pub fn next_event(&mut self) -> Option<Event> {
        loop {
            match self.gov.pop_notice()? {
                Notice::Granted { owner, grant } => {
                    return Some(Event::Answer(ConnId::from_owner(owner), Answer::Granted(grant)))
                }
                Notice::TimedOut { owner, denial } => {
                    return Some(Event::Answer(ConnId::from_owner(owner), Answer::TimedOut(denial)))
                }
                Notice::Superseded { owner } => {
                    return Some(Event::Answer(ConnId::from_owner(owner), Answer::Superseded))
                }
                Notice::Timer(Timer::Reactor(wake)) => return Some(Event::Wake(wake)),
                Notice::Timer(Timer::FlushLog) => {
                    self.log_timer_armed = false;
                    self.log.flush();
                }
            }
        }
    }

    /// Writes the answer of a queued acquire to its connection's output; a
    /// grant's slot comes back, to be released if the answer is never sent.
    pub fn answer_notice(
        &mut self,
        out: &mut Vec<u8>,
        answer: Answer,
        queued: &Queued,
        now: Now,
        close: bool,
    ) -> Option<SlotId> {
        match answer {
            Answer::Granted(grant) => {
                self.answer_grant(out, &grant, &queued.attempt, now, close);
                Some(grant.slot)
            }
            Answer::TimedOut(denial) => {
                self.answer_denial(out, &denial, Status::GatewayTimeout, &queued.attempt, now, close);
                None
            }
            Answer::Superseded => {
                self.answer_superseded(out, &queued.attempt, now, close);
                None
            }
        }
    }

    /// An answer whose connection is gone: a granted slot goes back at once.
    pub fn answer_undeliverable(&mut self, answer: Answer, now: Ms) {
        if let Answer::Granted(grant) = answer {
            self.release_undelivered(&grant.slot, now);
        }
    }

    /// Releases a grant whose answer was written but never sent.
    pub fn release_undelivered(&mut self, slot: &SlotId, now: Ms) {
        self.gov.release_undelivered(slot, now);
    }

    /// Takes a half-closed client's acquire out of the queue and answers it
    /// `504`. A proxied request is not answered: its exchange ends as the
    /// client's leaving and logs it. False when it no longer waits: the
    /// governor answered it already and that answer is on its way as an
    /// `Event::Answer`.
    pub fn withdraw(&mut self, out: &mut Vec<u8>, queued: &Queued, conn: ConnId, now: Now, close: bool) -> bool {
        let Some(denial) = self.gov.withdraw_waiter(queued.key, conn.owner(), now.ms, Leaving::ClientGone) else {
            return false;
        };
        if queued.proxied {
            self.observe_queued_end(&queued.attempt, now.wall(), super::CLIENT_GONE_STATUS, "client_gone", false);
        } else {
            self.answer_withdrawn(out, &denial, &queued.attempt, now, close);
        }
        true
    }

    /// A queued acquire whose client pipelined more behind it than its
    /// connection buffers: a close it sent after that waits behind input the
    /// server has no room to read, so whether anyone still waits cannot be
    /// known. It leaves the queue, and is answered `400` (the connection
    /// closes, what was pipelined unanswered), naming the buffer's size in
    /// bytes, `buffered`. `false` when it no longer waits.
    pub fn refuse_deep_waiter(
        &mut self,
        out: &mut Vec<u8>,
        queued: &Queued,
        conn: ConnId,
        now: Now,
        buffered: usize,
    ) -> bool {
        if self.gov.withdraw_waiter(queued.key, conn.owner(), now.ms, Leaving::Answered).is_none() {
            return false;
        }
        let error = ApiError::PipelinedPastBuffer(buffered as u64);
        self.answer_queued_error(out, &queued.attempt, now, error, true);
        true
    }

    /// A queued acquire granted before its client's close (or half-close)
    /// was read, in the same turn: the slot goes back at once, never handed
    /// to a client that stopped sending, and the client (which may still
    /// read) is answered as a waiter that left, `504`.
    pub fn withdraw_granted(&mut self, out: &mut Vec<u8>, grant: &Grant, queued: &Queued, now: Now, close: bool) {
        self.gov.release_undelivered(&grant.slot, now.ms);
        let denial = self.gov.left_queue(queued.attempt.pool, grant.queued_ms, now.ms);
        self.answer_withdrawn(out, &denial, &queued.attempt, now, close);
    }

    /// Work done once a turn's sockets are served: the access log is written
    /// when its buffer is full, and within `FLUSH_INTERVAL_MS` of any line
    /// still buffered (a pipe or standard output that took only part of it
    /// gets the rest then, traffic or none).
    pub fn end_turn(&mut self, now: Ms) {
        if self.log.buffered() >= accesslog::WRITE_THRESHOLD {
            self.log.flush();
        }
        if self.log.buffered() > 0 && !self.log_timer_armed {
            self.log_timer_armed = true;
            self.gov.schedule(now + accesslog::FLUSH_INTERVAL_MS, Timer::FlushLog);
        }
    }

    /// Writes out the access log (at shutdown), waiting until `until` at most
    /// for a slow reader of standard output or a pipe.
    pub fn flush_log(&mut self, until: std::time::Instant) {
        self.log.close(until);
    }

    /// Counts a connection refused over `maxConnections` (answered `503`).
    pub fn count_refused_connection(&mut self) {
        self.rejections.count(None, Status::ServiceUnavailable);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepped_wall_clock_reaches_the_ids_and_the_snapshot() {
        use crate::governor::{Admission, Entropy};
        use crate::time::EpochMs;
        let config =
            Config::parse(br#"{"accessLog":null,"pools":{"p":{"keys":["k"],"termMs":1000,"renewIntervalMs":300}}}"#)
                .unwrap();
        let mut app = App::new(&config, Entropy::seeded(3)).unwrap();
        let (e0, e1) = (Epoch::at(EpochMs(1_700_000_000_000)), Epoch::at(EpochMs(1_700_000_600_000)));
        app.start_state(&config, None, crate::state::StateLock::take(&config, None).unwrap(), e0).unwrap();
        let p = app.pool_id("p").unwrap();
        let unix_lease = |a: Admission| match a {
            Admission::Granted(g) => g.slot.fields().lease_deadline_unix,
            other => panic!("expected a grant, got {other:?}"),
        };
        app.begin_turn(Now { ms: 10, epoch: e0 });
        assert_eq!(unix_lease(app.gov.acquire(p, 0, 1, 10)), 1_700_000_001_010);
        // The clock reads ten minutes later from here on: no deadline moves,
        // but what is shown and handed on in Unix time follows the wall clock.
        app.begin_turn(Now { ms: 1_000, epoch: e1 });
        assert_eq!(unix_lease(app.gov.acquire(p, 0, 2, 1_000)), 1_700_000_602_000);
        let snap = app.gov.export(1_000);
        let mut deadlines: Vec<u64> = snap.leases.iter().map(|l| l.lease_deadline).collect();
        deadlines.sort_unstable();
        assert_eq!(deadlines, [1_700_000_601_010, 1_700_000_602_000]);
    }

    #[test]
    fn a_clock_set_right_after_a_start_ahead_refuses_only_what_was_signed_before_the_start() {
        use crate::access::denied::Denied;
        use crate::access::AccessError;
        use crate::governor::Entropy;
        use crate::http::request::{header_storage, parse_head};
        use crate::time::EpochMs;
        const PATH: &str = "/pools/p/lock/acquire";
        let config = Config::parse(
            br#"{"accessLog":null,"pools":{"p":{"keys":["k"],"access":{"hmac":{"secret":"s","toleranceMs":300000}}}}}"#,
        )
        .unwrap();
        let mut app = App::new(&config, Entropy::seeded(3)).unwrap();
        // The process starts with the wall clock an hour ahead; NTP sets it
        // right a second later.
        let right = 1_700_000_000_000;
        let (ahead, set_right) = (Epoch::at(EpochMs(right + 3_600_000)), Epoch::at(EpochMs(right)));
        app.start_state(&config, None, crate::state::StateLock::take(&config, None).unwrap(), ahead).unwrap();
        app.begin_turn(Now { ms: 10, epoch: ahead });
        let now = Now { ms: 1_000, epoch: set_right };
        app.begin_turn(now);
        let p = app.pool_id("p").unwrap();
        let check = |app: &mut App, signed_at: u64, nonce: &str| {
            let timestamp = signed_at.to_string();
            let mac = crate::access::hmac::sign(b"s", "POST", PATH, timestamp.as_bytes(), nonce.as_bytes(), b"");
            let raw = format!(
                "POST {PATH} HTTP/1.1\r\nHost: h\r\nX-Nthpool-Timestamp: {timestamp}\r\nX-Nthpool-Nonce: {nonce}\r\n\
                 X-Nthpool-Signature: v1={}\r\n\r\n",
                std::str::from_utf8(&mac).unwrap()
            );
            let mut storage = header_storage();
            let head = parse_head(raw.as_bytes(), &mut storage).unwrap().unwrap();
            app.creds[p.0 as usize].access.check_signed(&head, b"", now.wall())
        };
        assert_eq!(check(&mut app, now.wall().0, "after"), Ok(()), "signed a second after the start");
        assert_eq!(
            check(&mut app, right - 1, "before"),
            Err(AccessError::Denied(Denied::SIGNED_BEFORE_START)),
            "signed before the start"
        );
    }

    #[test]
    fn a_removed_pool_gives_its_history_back_once_drained() {
        use crate::governor::{Admission, Entropy};
        use crate::time::EpochMs;
        let both = br#"{"accessLog":null,"pools":{"p":{"keys":["k"]},"q":{"keys":["k"]}}}"#;
        let config = Config::parse(both).unwrap();
        let mut app = App::new(&config, Entropy::seeded(3)).unwrap();
        let epoch = Epoch::at(EpochMs(1_700_000_000_000));
        app.start_state(&config, None, crate::state::StateLock::take(&config, None).unwrap(), epoch).unwrap();
        let (p, q) = (app.pool_id("p").unwrap(), app.pool_id("q").unwrap());
        let Admission::Granted(held) = app.gov.acquire(q, 0, 1, 0) else { panic!("q grants") };
        for second in 0..3 {
            app.begin_turn(Now { ms: second * 1000, epoch });
        }
        let only_q = Config::parse(br#"{"accessLog":null,"pools":{"r":{"keys":["k"]}}}"#).unwrap();
        app.reconfigure(&only_q, Now { ms: 3000, epoch }).unwrap();
        app.begin_turn(Now { ms: 3000, epoch });
        let samples = |app: &App, pid: PoolId| app.history[pid.0 as usize].0.iter().count();
        assert_eq!((samples(&app, p), samples(&app, q)), (0, 3), "q still holds a slot: it is still shown");
        assert!(app.gov.release_id(q, &held.slot, None, 3500));
        app.begin_turn(Now { ms: 4000, epoch });
        assert_eq!(samples(&app, q), 0);
    }

    #[test]
    fn a_connection_is_the_same_owner_both_ways() {
        for id in [ConnId { index: 0, serial: 0 }, ConnId { index: 7, serial: u32::MAX }] {
            assert_eq!(ConnId::from_owner(id.owner()), id);
        }
    }
}
