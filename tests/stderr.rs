//! The server's own log on a standard error nobody reads: a full pipe
//! costs log lines (counted, and said once the reader is back), never an
//! answer or the stop. The server is started on pipes made here, so the
//! test decides when (and whether) they are read.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use mio::unix::pipe::{Receiver, Sender};

/// A pipe whose buffer is full: the next write to it blocks (or would).
fn full_pipe() -> (Sender, Receiver) {
    let (mut tx, rx) = mio::unix::pipe::new().unwrap();
    let chunk = [b'x'; 4096];
    loop {
        match tx.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the pipe: {e}"),
        }
    }
    // As a shell or a supervisor hands it over: in blocking mode.
    tx.set_nonblocking(false).unwrap();
    (tx, rx)
}

/// Killed however the test ends.
struct Server {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    _dir: Scratch,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server with `config_json`, its standard error on `stderr` and
/// its standard output on `stdout` (a pipe of the test's when `None`,
/// where the banner is read), at `RUST_LOG=level`.
fn start(config_json: &str, level: &str, stderr: OwnedFd, stdout: Option<OwnedFd>, banner: Option<Receiver>) -> Server {
    let dir = scratch_dir();
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_nthpool"));
    command
        .args(["--config", "config.json", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env("RUST_LOG", level)
        .stdin(Stdio::null())
        .stderr(Stdio::from(stderr));
    let piped = stdout.is_none();
    command.stdout(stdout.map_or(Stdio::piped(), Stdio::from));
    let mut child = command.spawn().expect("spawn nthpool");
    let (tx, rx) = mpsc::channel();
    let reader: Box<dyn Read + Send> = match (piped, banner) {
        (true, _) => Box::new(child.stdout.take().unwrap()),
        (false, Some(banner)) => {
            banner.set_nonblocking(false).unwrap();
            Box::new(std::fs::File::from(OwnedFd::from(banner)))
        }
        (false, None) => panic!("no banner to read"),
    };
    thread::spawn(move || {
        // Up to the banner's last line: the pipe is not read after it.
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let last = line.starts_with("nthpool listening on");
            if tx.send(line).is_err() || last {
                break;
            }
        }
    });
    let (mut addr, mut admin) = (None, None);
    while addr.is_none() || admin.is_none() {
        let line = rx.recv_timeout(PATIENCE).expect("the banner");
        if let Some(rest) = line.strip_prefix("nthpool admin on http://") {
            admin = Some(rest.parse().unwrap());
        }
        if let Some(rest) = line.strip_prefix("nthpool listening on http://") {
            addr = Some(rest.parse().unwrap());
        }
    }
    Server { child, addr: addr.unwrap(), admin: admin.unwrap(), _dir: dir }
}

impl Server {
    /// An acquire on a fresh connection, answered within a few seconds or `None`.
    fn acquire_status(&self) -> Option<u16> {
        let mut c = std::net::TcpStream::connect(self.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(&post("/pools/p/lock/acquire", KEY, "Connection: close\r\n", "")).unwrap();
        read_response(&mut c).map(|r| r.status)
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status();
        assert!(status.unwrap().success());
    }

    /// SIGTERM, then the exit status (within `PATIENCE`).
    fn stop(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        exit_within(&mut self.child, PATIENCE).unwrap_or_else(|| panic!("still running {PATIENCE:?} after SIGTERM"))
    }
}

/// Everything left in the pipe until its writers are all gone.
fn drain(rx: Receiver) -> String {
    rx.set_nonblocking(false).unwrap();
    let mut text = Vec::new();
    std::fs::File::from(OwnedFd::from(rx)).read_to_end(&mut text).unwrap();
    String::from_utf8_lossy(&text).into_owned()
}

/// Whether the open file description of `fd` (in this process) is in non-blocking mode.
fn non_blocking(fd: &impl AsRawFd) -> bool {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).expect("flags").trim();
    u32::from_str_radix(flags, 8).unwrap() & 0o4000 != 0
}

#[test]
fn a_standard_error_nobody_reads_holds_up_no_answer_and_no_stop() {
    let (tx, rx) = full_pipe();
    // Its start-up lines wait a while for room, then are dropped too.
    let mut s = start(&config("", ""), "info", OwnedFd::from(tx), None, None);
    assert_eq!(s.acquire_status(), Some(200));
    // Each is a warning the full pipe has no room for.
    for _ in 0..3 {
        s.signal("USR2");
        assert_eq!(s.acquire_status(), Some(200), "an answer waited for the log");
    }
    let metrics = admin_get(s.admin, "/metrics");
    let dropped = metrics
        .lines()
        .find_map(|l| l.strip_prefix("nthpool_log_lines_dropped_total "))
        .unwrap_or_else(|| panic!("no dropped log lines counted: {metrics}"));
    assert!(dropped.parse::<u64>().unwrap() >= 3, "{metrics}");
    // The reader comes back: the next line says what it missed.
    let reader = thread::spawn(move || drain(rx));
    s.signal("USR2");
    let status = s.stop();
    assert!(status.success(), "{status}");
    let text = reader.join().unwrap();
    // What the server wrote, after the test's filling.
    let text = text.trim_start_matches('x');
    assert!(text.contains("log lines were dropped: standard error was not being read"), "{text:?}");
    assert!(text.contains("shut down"), "the exit's lines reach a reader that reads: {text:?}");
}

#[test]
fn a_stalled_standard_error_does_not_hold_up_the_stop() {
    let (tx, rx) = full_pipe();
    let mut s = start(&config("", ""), "info", OwnedFd::from(tx), None, None);
    s.signal("USR2");
    assert_eq!(s.acquire_status(), Some(200));
    let status = s.stop();
    assert!(status.success(), "{status}");
    drop(rx);
}

/// `2>&1`, with the access log on standard output: one pipe, one open file
/// description. A reload that moves the access log off standard output
/// leaves it non-blocking for the server's own lines, and the exit sets it
/// back to blocking for whoever writes it next.
#[test]
fn one_pipe_for_both_streams_stays_non_blocking_until_the_exit() {
    let (tx, rx) = mio::unix::pipe::new().unwrap();
    tx.set_nonblocking(false).unwrap();
    let keep = tx.as_fd_dup();
    let both = OwnedFd::from(tx);
    let out = both.try_clone().unwrap();
    let logged = config("", "").replacen(r#""accessLog":null"#, r#""accessLog":"-""#, 1);
    let mut s = start(&logged, "warn", both, Some(out), Some(rx.as_receiver_dup()));
    let dir = s._dir.to_path_buf();
    std::fs::write(dir.join("config.json"), config("", "")).unwrap();
    s.signal("HUP");
    eventually("the reload applied", || {
        admin_get(s.admin, "/metrics").lines().any(|l| l == "nthpool_config_reloads_total 1")
    });
    // The banner's reader stops; the pipe is filled up behind the server,
    // through an open file description of the test's own.
    let own = std::fs::OpenOptions::new().write(true).open(format!("/proc/self/fd/{}", keep.as_raw_fd())).unwrap();
    let mut filler = Sender::from(OwnedFd::from(own));
    filler.set_nonblocking(true).unwrap();
    while filler.write(&[b'x'; 4096]).is_ok() {}
    s.signal("USR2");
    assert_eq!(s.acquire_status(), Some(200), "an answer waited for the log");
    let status = s.stop();
    assert!(status.success(), "{status}");
    assert!(!non_blocking(&keep), "the pipe was left non-blocking");
    drop(rx);
}

/// A standard error the server was handed non-blocking (a supervisor that
/// writes the same pipe without blocking) is left so at the exit: only the
/// mode the server set is set back.
#[test]
fn a_standard_error_handed_over_non_blocking_is_left_so() {
    let (tx, rx) = mio::unix::pipe::new().unwrap();
    tx.set_nonblocking(true).unwrap();
    let keep = tx.as_fd_dup();
    let mut s = start(&config("", ""), "info", OwnedFd::from(tx), None, None);
    assert_eq!(s.acquire_status(), Some(200));
    let status = s.stop();
    assert!(status.success(), "{status}");
    assert!(non_blocking(&keep), "the pipe the server was handed non-blocking was set to blocking");
    drop(rx);
}

/// Duplicates of pipe ends (the same open file description).
trait Dup {
    fn as_fd_dup(&self) -> OwnedFd;
}

impl Dup for Sender {
    fn as_fd_dup(&self) -> OwnedFd {
        std::os::fd::AsFd::as_fd(self).try_clone_to_owned().unwrap()
    }
}

trait ReceiverDup {
    fn as_receiver_dup(&self) -> Receiver;
}

impl ReceiverDup for Receiver {
    fn as_receiver_dup(&self) -> Receiver {
        Receiver::from(std::os::fd::AsFd::as_fd(self).try_clone_to_owned().unwrap())
    }
}

/// A standard output nobody reads (the banner's pipe, full) holds up
/// neither the start nor the stop: the banner waits a while for room, as a
/// start-up log line does, then is dropped.
#[test]
fn a_standard_output_nobody_reads_holds_up_neither_the_start_nor_the_stop() {
    let (tx, rx) = full_pipe();
    let keep = tx.as_fd_dup();
    let dir = scratch_dir();
    std::fs::write(dir.join("config.json"), config("", "")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .args(["--config", "config.json", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(tx)))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nthpool");
    let mut s =
        Server { child, addr: "127.0.0.1:1".parse().unwrap(), admin: "127.0.0.1:1".parse().unwrap(), _dir: dir };
    let log = BufReader::new(s.child.stderr.take().unwrap());
    let (found, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in log.lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = found.send(addr.trim().to_string());
            }
        }
    });
    s.addr = lines.recv_timeout(PATIENCE).expect("the start's log line").parse().unwrap();
    assert_eq!(s.acquire_status(), Some(200), "the start waited for standard output");
    let status = s.stop();
    assert!(status.success(), "{status}");
    assert!(!non_blocking(&keep), "standard output was left non-blocking");
    drop(rx);
}
