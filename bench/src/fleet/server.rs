//! Starts the nthpool server for one scenario: a configuration file in a
//! temporary directory with the one pool `fleet`, a port the server picks
//! itself (it prints its address), stopped when the run ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::options::Pool;

pub const POOL: &str = "fleet";
pub const KEY: &str = "nb_fleet_simulator_key";
/// The `Host` proxy-mode workers send: the pool's `upstream.hosts`.
pub const PROXY_HOST: &str = "fleet.proxy";

pub struct Server {
    pub addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

/// The default binary: `nthpool` next to this one (both in `target/release`).
pub fn default_binary() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.with_file_name("nthpool")
}

/// The configuration; with `upstream`, the pool proxies to it under `PROXY_HOST`.
pub fn config(pool: &Pool, wait_ms: u64, upstream: Option<SocketAddr>) -> String {
    let access_log = match &pool.access_log {
        Some(p) => serde_json::Value::from(p.as_str()),
        None => serde_json::Value::Null,
    };
    let rpm = pool.rpm.map_or(serde_json::Value::Null, serde_json::Value::from);
    let mut config = serde_json::json!({
        "listen": "127.0.0.1:0",
        "adminListen": null,
        "accessLog": access_log,
        "pools": { POOL: {
            "keys": [KEY],
            "concurrency": pool.concurrency,
            "queue": { "size": pool.queue_size, "timeoutMs": wait_ms.max(1) },
            "rpm": rpm,
            "adaptive": pool.adaptive,
        }}
    });
    if let Some(addr) = upstream {
        config["pools"][POOL]["upstream"] = serde_json::json!({
            "url": format!("http://{addr}"),
            "hosts": [PROXY_HOST],
            "waitMs": wait_ms.max(1),
            "idleConnections": 128,
        });
    }
    config.to_string()
}

impl Server {
    pub fn start(binary: &PathBuf, pool: &Pool, wait_ms: u64, upstream: Option<SocketAddr>) -> Result<Server, String> {
        let dir = std::env::temp_dir().join(format!("nthpool-fleet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let file = dir.join("config.json");
        std::fs::write(&file, config(pool, wait_ms, upstream)).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {} (build it with cargo build --release): {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the start-up lines, then keeps draining standard output.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("nthpool listening on http://") {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).ok().and_then(|a| a.parse().ok());
        let mut server = Server { addr: "127.0.0.1:0".parse().unwrap(), child, dir };
        match addr {
            Some(a) => server.addr = a,
            None => return Err(format!("{} did not print its address within 10 s", binary.display())),
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
