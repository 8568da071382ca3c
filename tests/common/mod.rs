//! Test harness: starts the real `nthpool` binary on `127.0.0.1:0` with a
//! configuration written to a temporary file, and speaks raw HTTP/1.1 to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const KEY: &str = "test-key-0001";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub struct TestServer {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// Removed after `Drop` has stopped the server (fields drop after it).
    pub dir: Scratch,
    pub config_path: PathBuf,
    pub stdout: BufReader<ChildStdout>,
    /// The start-up lines on standard output up to `nthpool listening on`.
    pub banner: String,
}

/// A scratch directory, removed with all it holds when dropped, a failing
/// test's unwinding included. Declare it before whatever process works in
/// it (locals drop in reverse order), or hand it to that process's
/// `TestServer` (`start_with`, which removes it once the server is stopped).
pub struct Scratch(PathBuf);

/// A fresh scratch directory under the system temp dir.
pub fn scratch_dir() -> Scratch {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("nthpool-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Empty in a `TestServer` whose directory `into_dir` handed back.
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A configuration with one pool `p` (key `KEY`) whose settings are `pool_extra`
/// (JSON members without braces, may be empty) and top-level members `top_extra`.
pub fn config(pool_extra: &str, top_extra: &str) -> String {
    let pool_sep = if pool_extra.is_empty() { "" } else { "," };
    let top_sep = if top_extra.is_empty() { "" } else { "," };
    format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null{top_sep}{top_extra},
        "pools":{{"p":{{"keys":["{KEY}"]{pool_sep}{pool_extra}}},"other":{{"keys":["other-key"]}}}}}}"#
    )
}

/// In `start_with`'s arguments: no `--listen`, the file's `listen` is bound.
pub const FILE_LISTEN: &str = "(the file's listen)";

impl TestServer {
    /// Starts a server with `config_json`; panics with its stderr if it fails.
    pub fn start(config_json: &str) -> TestServer {
        let dir = scratch_dir();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config_json).unwrap();
        Self::start_with(dir, config_path, &[])
    }

    /// Like `start`, with the server's standard error (its log, at
    /// `RUST_LOG=log_level`) written to `stderr.log` in its directory; see `log`.
    pub fn start_logged(config_json: &str, log_level: &str) -> TestServer {
        let dir = scratch_dir();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config_json).unwrap();
        let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
        Self::spawn(dir, config_path, &[], Stdio::from(log), log_level)
    }

    /// `start_with`, the server's log written as by `start_logged` (anew).
    pub fn start_with_logged(dir: Scratch, config_path: PathBuf, log_level: &str) -> TestServer {
        Self::start_with_args_logged(dir, config_path, &[], log_level)
    }

    /// `start_with_logged` with `start_with`'s `extra_args`.
    pub fn start_with_args_logged(
        dir: Scratch,
        config_path: PathBuf,
        extra_args: &[&str],
        log_level: &str,
    ) -> TestServer {
        let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
        Self::spawn(dir, config_path, extra_args, Stdio::from(log), log_level)
    }

    /// `start_logged`, the server started with at most `nofile` open
    /// descriptors (soft and hard: util-linux's `prlimit`).
    pub fn start_with_fd_limit(config_json: &str, nofile: u64) -> TestServer {
        let dir = scratch_dir();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config_json).unwrap();
        let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
        let mut command = Command::new("prlimit");
        command.arg(format!("--nofile={nofile}:{nofile}")).arg(env!("CARGO_BIN_EXE_nthpool"));
        Self::spawn_command(command, dir, config_path, &[], Stdio::from(log), "info")
    }

    /// `start_logged`, the server's main thread given a stack of at most
    /// `kib` KiB (`RLIMIT_STACK`, through `prlimit`), so a test can show
    /// that what the server does on it does not grow with a count (waiters,
    /// connections) without making thousands of them.
    pub fn start_with_stack_limit(config_json: &str, kib: u64) -> TestServer {
        let dir = scratch_dir();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config_json).unwrap();
        let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
        let bytes = kib * 1024;
        let mut command = Command::new("prlimit");
        command.arg(format!("--stack={bytes}:{bytes}")).arg(env!("CARGO_BIN_EXE_nthpool"));
        Self::spawn_command(command, dir, config_path, &[], Stdio::from(log), "info")
    }

    /// What the server logged so far (servers started with `start_logged`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// Starts a server in `dir`, which it then owns: it is removed when the
    /// server is dropped, or handed back by `into_dir`.
    pub fn start_with(dir: Scratch, config_path: PathBuf, extra_args: &[&str]) -> TestServer {
        let level = std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "warn".into());
        Self::spawn(dir, config_path, extra_args, Stdio::inherit(), &level)
    }

    /// Stops the server if it still runs (`SIGKILL`) and hands its
    /// directory back to the test, say for a server started in it again.
    pub fn into_dir(mut self) -> Scratch {
        self.stop();
        // An empty path in its place: dropping `self` removes nothing.
        std::mem::replace(&mut self.dir, Scratch(PathBuf::new()))
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn spawn(dir: Scratch, config_path: PathBuf, extra_args: &[&str], stderr: Stdio, log_level: &str) -> TestServer {
        let command = Command::new(env!("CARGO_BIN_EXE_nthpool"));
        Self::spawn_command(command, dir, config_path, extra_args, stderr, log_level)
    }

    fn spawn_command(
        mut command: Command,
        dir: Scratch,
        config_path: PathBuf,
        extra_args: &[&str],
        stderr: Stdio,
        log_level: &str,
    ) -> TestServer {
        command.arg("--config").arg(&config_path);
        // A fresh loopback port, unless the test names the listener (or
        // leaves it to the file: `FILE_LISTEN`).
        if !extra_args.contains(&"--listen") && !extra_args.contains(&FILE_LISTEN) {
            command.arg("--listen").arg("127.0.0.1:0");
        }
        let extra_args: Vec<&str> = extra_args.iter().copied().filter(|&a| a != FILE_LISTEN).collect();
        let mut child = command
            .args(extra_args)
            .current_dir(&dir)
            .env("RUST_LOG", log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn nthpool");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addr = None;
        let mut admin = None;
        let mut line = String::new();
        let mut banner = String::new();
        while addr.is_none() {
            banner += &line;
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let status = child.wait().unwrap();
                panic!("nthpool exited before listening: {status}");
            }
            if let Some(rest) = line.trim().strip_prefix("nthpool admin on http://") {
                admin = Some(rest.parse().unwrap());
            }
            if let Some(rest) = line.trim().strip_prefix("nthpool listening on http://") {
                addr = Some(rest.parse().unwrap());
            }
        }
        banner += &line;
        TestServer { child, addr: addr.unwrap(), admin, dir, config_path, stdout, banner }
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// A connection to the admin listener, like `connect`'s.
    pub fn connect_admin(&self) -> TcpStream {
        let s = TcpStream::connect(self.admin.expect("the test configuration has an admin listener")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// A `GET` of `path` on the admin listener, on a connection of its own.
    pub fn get_admin(&self, path: &str) -> Response {
        let mut c = self.connect_admin();
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        read_response(&mut c).expect("an answer")
    }

    /// The value of one sample in `/metrics`: `series` is the name with its
    /// labels exactly as exposed (`nthpool_slots_held{pool="p"}`), so a name
    /// that starts another series' name never matches it.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let r = self.get_admin("/metrics");
        assert_eq!(r.status, 200, "{r:?}");
        let text = String::from_utf8(r.body).unwrap();
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Writes `config_json` over the configuration, sends SIGHUP and waits
    /// until the reload is applied.
    pub fn reload(&self, config_json: &str) {
        let applied = || self.metric("nthpool_config_reloads_total").expect("the reloads counter");
        let before = applied();
        std::fs::write(&self.config_path, config_json).unwrap();
        self.signal("HUP");
        eventually("the reload applied", || applied() > before);
    }

    /// One request on a fresh connection.
    pub fn request(&self, raw: &[u8]) -> Response {
        let mut s = self.connect();
        s.write_all(raw).unwrap();
        read_response(&mut s).expect("a response")
    }

    pub fn acquire(&self, extra_headers: &str, body: &str) -> Response {
        self.request(&post("/pools/p/lock/acquire", KEY, extra_headers, body))
    }

    pub fn renew(&self, slot: &str) -> Response {
        self.request(&post(&format!("/pools/p/lock/{slot}/renew"), KEY, "", ""))
    }

    pub fn release(&self, slot: &str, body: &str) -> Response {
        self.request(&post(&format!("/pools/p/lock/{slot}/release"), KEY, "", body))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status().unwrap().success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Runs `send` while the server is stopped (`SIGSTOP`), then lets it go
    /// on: what `send` writes, and the time it lets pass, reach the server
    /// in one event-loop turn.
    pub fn while_stopped(&self, send: impl FnOnce()) {
        self.signal("STOP");
        wait_stopped(self.pid());
        send();
        // Slack for the last bytes to reach the server's socket.
        std::thread::sleep(Duration::from_millis(100));
        self.signal("CONT");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A POST with a key (empty `key` = no key header) and optional body.
pub fn post(path: &str, key: &str, extra_headers: &str, body: &str) -> Vec<u8> {
    let key_header = if key.is_empty() { String::new() } else { format!("X-Nthpool-Key: {key}\r\n") };
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{key_header}{extra_headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn header_u64(&self, name: &str) -> u64 {
        self.header(name).unwrap_or_else(|| panic!("missing header {name} in {self:?}")).parse().unwrap()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn error_code(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_string()
    }

    pub fn slot(&self) -> String {
        assert_eq!(self.status, 200, "expected a grant: {self:?}");
        self.json()["slotId"].as_str().unwrap().to_string()
    }
}

/// What a test upstream reads of a request: the head, up to and with its
/// empty line, or what came before the connection ended or failed.
fn read_request_head(s: &mut impl Read) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read_some(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    head
}

/// An address nothing listens on, so a connect to it is refused at once:
/// a privileged port no test binds. (A port bound and freed again could be
/// taken by another test's server before it is used.)
pub fn refused_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1))
}

/// A free loopback port for a listener the server binds itself (a pool's
/// own listener, an admin listener), taken below Linux's ephemeral range
/// (32768 and up): a port the kernel hands out for port 0 may be handed to
/// another test's outgoing connection before the server binds it. Each
/// call takes the next port of this process's run, starting at one its id
/// picks, so tests in parallel never try the same one.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    const FIRST: usize = 20_000;
    const PORTS: usize = 12_000;
    let start = std::process::id() as usize * 97;
    loop {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % PORTS) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A test upstream on `127.0.0.1:0` that writes `answer` on every
/// connection as soon as the request head is in, without reading the body;
/// with `drain`, it then reads whatever comes until the peer closes.
pub fn answer_at_head(answer: &'static [u8], drain: bool) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            read_request_head(&mut stream);
            let _ = stream.write_all(answer);
            while drain && stream.read_some(&mut [0u8; 4096]).unwrap_or(0) > 0 {}
        }
    });
    addr
}

/// Writes `POST /upload` for `host`, with a body of `total` bytes, as an SDK
/// sends a request (the head and the body in one go), from a thread of its
/// own, so the caller reads the answer meanwhile; the handle gives the
/// write's result (an answer that comes first may end it early).
pub fn upload_in_background(s: &TcpStream, host: &str, total: usize) -> std::thread::JoinHandle<std::io::Result<()>> {
    let mut request =
        format!("POST /upload HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: {total}\r\n\r\n")
            .into_bytes();
    request.resize(request.len() + total, b'z');
    let mut writer = s.try_clone().unwrap();
    writer.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::spawn(move || writer.write_all(&request))
}

/// One `read` that is tried again when it fails with `EINTR`. Linux fails a
/// blocking socket read that has a timeout with `EINTR` when this process is
/// stopped and continued, even with no signal handler; a test must not take
/// that for the server's answer or its close.
pub trait ReadSome {
    fn read_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
}

impl<R: Read + ?Sized> ReadSome for R {
    fn read_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// Reads one response (head + Content-Length body). `None` on EOF before a head.
pub fn read_response(s: &mut impl Read) -> Option<Response> {
    try_read_response(s).unwrap_or_else(|e| panic!("read failed: {e}"))
}

/// `read_response`, with a failed read (a timeout, a close within the body)
/// returned rather than a panic; a reset before a head is `Ok(None)`.
pub fn try_read_response(s: &mut impl Read) -> std::io::Result<Option<Response>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read_some(&mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) => head.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8(head).unwrap();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(Some(Response { status, headers, body }))
}

/// True when the server closed the connection (EOF or reset) within the read timeout.
pub fn is_closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read_some(&mut buf), Ok(0) | Err(_))
}

/// Waits until the process is stopped (state `T` in `/proc/PID/stat`).
pub fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("");
        if state == "T" || state == "t" {
            return;
        }
        assert!(Instant::now() < deadline, "the server did not stop: {stat}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How long `run` lets the binary take before calling it a hang.
const RUN_PATIENCE: Duration = Duration::from_secs(15);

/// The outcome of running the binary to completion.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary to completion in `dir`, with the default log filter an
/// operator would have. A binary that keeps running is a failure, not a hang.
pub fn run(dir: &Path, args: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nthpool");
    let Some(status) = exit_within(&mut child, RUN_PATIENCE) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("nthpool {args:?} was still running after {RUN_PATIENCE:?}");
    };
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    Run { status, stdout, stderr }
}

/// Long enough for anything "eventually" on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Polls `done` until it holds; fails the test after `PATIENCE`.
/// `child`'s exit status once it has exited, waiting up to `within`;
/// `None` when it is still running then.
pub fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The whole answer, head and body, to a GET on `addr` (the admin listener).
pub fn admin_get(addr: SocketAddr, path: &str) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text
}

/// The README's reference client (`examples/nthpool_client.py`) driven by
/// `harness`, a Python script given the examples directory, the server's
/// base URL and the pool key, which prints `acquired` once it holds a slot:
/// the child once it has, and the rest of its output, line by line.
pub fn reference_client_holding(harness: &str, base_url: &str, key: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new("python3")
        .args(["-c", harness, concat!(env!("CARGO_MANIFEST_DIR"), "/examples"), base_url, key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "acquired");
    (child, out)
}
