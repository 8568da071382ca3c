//! The scripts under `scripts/` do what their `--help` says, checked without
//! running a benchmark: each runs from a copy of `scripts/` in a scratch
//! directory, with `cargo` and every outside tool they may start replaced by
//! stubs that only record that they were called.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{scratch_dir, Scratch};

/// The tools a script may start before its work begins; each stub appends its
/// name and arguments to `calls` and fails.
const STUBBED: [&str; 9] = ["cargo", "nginx", "haproxy", "valgrind", "apt-get", "wrk", "redis-server", "perf", "jq"];

/// A scratch copy of `scripts/` (so nothing of this checkout is built or run)
/// and a directory of stubs; returns the copy's root.
fn sandbox() -> Scratch {
    let root = scratch_dir();
    let scripts = root.join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, scripts.join(path.file_name().unwrap())).unwrap();
    }
    let stubs = root.join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    for tool in STUBBED {
        stub(&stubs.join(tool), tool, &root.join("calls"), 1);
    }
    root
}

/// An executable at `path` that records `name` and its arguments in `calls`
/// and exits with `code`.
fn stub(path: &Path, name: &str, calls: &Path, code: i32) {
    let text = format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\nexit {code}\n", calls.display());
    std::fs::write(path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    calls: String,
}

/// Runs `scripts/NAME args` in the sandbox with the stubs first on PATH,
/// `env` added, for at most 20 s (then it is killed, and `code` is None).
fn run(root: &Path, name: &str, args: &[&str], env: &[(&str, String)]) -> Run {
    let path = format!("{}:{}", root.join("stubs").display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts").join(name))
        .args(args)
        .current_dir(root)
        .env("PATH", path)
        .env_remove("CARGO_TARGET_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(root.join("stdout")).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(root.join("stderr")).unwrap()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap_or_default();
    let out = Run { code, stdout: read("stdout"), stderr: read("stderr"), calls: read("calls") };
    let _ = std::fs::remove_file(root.join("calls"));
    out
}

fn scripts() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sh") && n != "common.sh")
        .collect();
    names.sort();
    names
}

/// `--help` prints the script's header and exits 0, building and starting
/// nothing; an argument it does not know is refused the same way.
#[test]
fn every_script_answers_help_and_starts_nothing() {
    let root = sandbox();
    for name in scripts() {
        let r = run(&root, &name, &["--help"], &[]);
        assert_eq!(r.code, Some(0), "{name} --help: {}\n{}", r.stdout, r.stderr);
        assert!(r.calls.is_empty(), "{name} --help started {}", r.calls);
        assert!(r.stdout.lines().count() >= 3, "{name} --help prints its header: {:?}", r.stdout);
        assert!(!r.stdout.contains("set -euo"), "{name} --help: {}", r.stdout);
        let r = run(&root, &name, &["--no-such-flag"], &[]);
        assert!(matches!(r.code, Some(c) if c != 0), "{name} --no-such-flag: {:?}\n{}", r.code, r.stderr);
        assert!(r.calls.is_empty(), "{name} --no-such-flag started {}", r.calls);
        assert!(r.stderr.contains("unknown argument --no-such-flag"), "{name}: {}", r.stderr);
    }
}

/// With CARGO_TARGET_DIR set, cargo builds there, so that is where the
/// scripts must take the binaries from (not `target/release`, which may hold
/// a stale build or none).
#[test]
fn the_scripts_run_the_binaries_cargo_built_in_cargo_target_dir() {
    let root = sandbox();
    // cargo "builds" successfully; the binaries it would have made record
    // their call and fail at once.
    stub(&root.join("stubs/cargo"), "cargo", &root.join("calls"), 0);
    let target = root.join("elsewhere");
    std::fs::create_dir_all(target.join("release")).unwrap();
    for bin in ["nthpool", "nthpool-bench", "nthpool-fleet"] {
        stub(&target.join("release").join(bin), bin, &root.join("calls"), 1);
    }
    let port = common::free_port();
    let env = [("CARGO_TARGET_DIR", target.display().to_string()), ("SNAP_PORT", port.to_string())];

    let r = run(&root, "fleet.sh", &[], &env);
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.calls.lines().any(|l| l.starts_with("nthpool-fleet --name")), "fleet.sh ran no fleet: {}", r.calls);

    let r = run(&root, "snapshot-bench.sh", &[], &env);
    assert!(r.calls.lines().any(|l| l.starts_with("nthpool --config")), "snapshot-bench.sh ran no server: {}", r.calls);
    assert!(r.stderr.contains("the server did not start"), "{}", r.stderr);
}

/// `cluster.sh --restart` of an instance its directory does not hold says so
/// at once: it builds nothing (a release build takes minutes) and starts nothing.
#[test]
fn restarting_an_instance_that_is_not_there_builds_nothing() {
    let root = sandbox();
    let dir = root.join("no-cluster");
    let r = run(&root, "cluster.sh", &["--restart", "n5", "--dir", dir.to_str().unwrap()], &[]);
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.starts_with("cluster.sh: no instance n5 in "), "{}", r.stderr);
    assert!(r.calls.is_empty(), "--restart of no instance started {}", r.calls);
}

/// `cluster.sh --stop` stops only what the cluster started: a pid file whose
/// process died (an instance killed with -9) may name a pid the system gave
/// to another process since, which it neither signals nor waits for.
#[test]
fn stopping_a_cluster_leaves_a_process_that_took_a_dead_instances_pid_alone() {
    let root = sandbox();
    let dir = root.join("cluster");
    std::fs::create_dir_all(dir.join("n1")).unwrap();
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(dir.join("port"), "30330\n").unwrap();
    std::fs::write(dir.join("n1/pid"), format!("{}\n", other.id())).unwrap();
    std::fs::write(dir.join("haproxy.pid"), format!("{}\n", other.id())).unwrap();
    let r = run(&root, "cluster.sh", &["--stop", "--dir", dir.to_str().unwrap()], &[]);
    let alive = other.try_wait().unwrap().is_none();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(alive, "--stop ended a process the cluster did not start");
    assert!(!dir.join("n1/pid").exists() && !dir.join("haproxy.pid").exists(), "stale pid files removed");
}
