//! The `nthpool` binary: command line, start-up, and the one line that says
//! what went wrong when start-up fails.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use nthpool::config::Config;
use nthpool::server;

const HELP: &str = "\
nthpool — a concurrency governor for callers of rate-limited APIs

USAGE:
    nthpool [--config FILE] [--listen ADDR]
    nthpool --check-config FILE

With no --config, serves the embedded demo configuration: pool `demo` on
127.0.0.1:7070, with its key and a ready curl line printed at start-up.

OPTIONS:
    --config FILE         JSON configuration (see the README); re-read on SIGHUP
    --listen ADDR         listen address, overriding the configuration's `listen`
                          (port 0 picks a free port; the address is printed)
    --check-config FILE   validate FILE, print what is wrong, and exit
    -h, --help            this text
    -V, --version         the version

ENVIRONMENT:
    RUST_LOG              log filter for env_logger, e.g. RUST_LOG=debug (default, also when empty: info)

SIGNALS:
    SIGTERM, SIGINT, SIGQUIT   graceful stop: answer what was read, write the snapshot, exit 0
    SIGHUP                     reload the configuration file and reopen the access log
    SIGUSR1                    reopen the access log (log rotation)
";

struct Args {
    config: Option<PathBuf>,
    listen: Option<SocketAddr>,
    check: Option<PathBuf>,
}

fn given_twice(flag: &str) -> String {
    format!("{flag} is given twice; give it once")
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args { config: None, listen: None, check: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("nthpool {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--config" if args.config.is_some() => return Err(given_twice(&arg)),
            "--listen" if args.listen.is_some() => return Err(given_twice(&arg)),
            "--check-config" if args.check.is_some() => return Err(given_twice(&arg)),
            "--config" => args.config = Some(value("--config")?.into()),
            "--listen" => {
                let v = value("--listen")?;
                args.listen =
                    Some(v.parse().map_err(|_| format!("--listen: {v:?} is not an address like 127.0.0.1:7070"))?);
            }
            "--check-config" => args.check = Some(value("--check-config")?.into()),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    // Checked only once the whole command line is read: a second file or
    // a serving option beside it is an error, not silently left unchecked.
    if let Some(path) = &args.check {
        if args.config.is_some() || args.listen.is_some() {
            return Err("--check-config checks one file and takes no other option".into());
        }
        let config = Config::load(path).map_err(|e| e.to_string())?;
        check(&config, path)?;
        for caution in config.cautions() {
            eprintln!("nthpool: warning: {caution}");
        }
        println!("{}: configuration is valid", path.display());
        return Ok(None);
    }
    Ok(Some(args))
}

/// What `--check-config` checks beyond the file's own fields (access
/// policies' files, the files the server keeps), said as `FILE: …`.
fn check(config: &Config, path: &std::path::Path) -> Result<(), String> {
    nthpool::api::check(config)
        .and_then(|()| nthpool::state::check_files(config, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn main() -> ExitCode {
    // Through `stdio`, which writes standard error without blocking while the server runs.
    let mut logger = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    // Set but empty (`Environment=RUST_LOG=` in a unit, `RUST_LOG= nthpool`),
    // it is no filter: the default, where env_logger would keep errors only
    // and hide every warning (a refused state file, a failing access log).
    if std::env::var("RUST_LOG").is_ok_and(|filter| filter.trim().is_empty()) {
        logger.parse_filters("info");
    }
    logger.target(env_logger::Target::Pipe(Box::new(nthpool::stdio::LogWriter)));
    // A pipe target is not coloured by default: a terminal keeps its colours.
    let plain = ["RUST_LOG_STYLE", "NO_COLOR"].iter().any(|v| std::env::var_os(v).is_some());
    if !plain && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        logger.write_style(env_logger::WriteStyle::Always);
    }
    logger.init();
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nthpool: {e}");
            return ExitCode::from(2);
        }
    };
    // Before the configuration is read: a reload asked for meanwhile must not
    // end the process, nor a stop end it without its snapshot. Not for
    // `--check-config`, `--help` or `--version`, done above: they serve
    // nothing, and a stop signal or Ctrl-C ends them as it ends any command.
    let early = match server::EarlySignals::catch() {
        Ok(early) => early,
        Err(e) => {
            eprintln!("nthpool: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("nthpool: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::embedded(),
    };
    if let Some(listen) = args.listen {
        if let Err(e) = config.check_listen_override(listen) {
            eprintln!("nthpool: {e}");
            return ExitCode::from(2);
        }
    }
    // What `--check-config` refuses is refused here as it says it, naming
    // the file, before the start opens or binds anything.
    if let Some(path) = &args.config {
        if let Err(e) = check(&config, path) {
            eprintln!("nthpool: {e}");
            return ExitCode::from(2);
        }
    }
    let embedded = args.config.is_none();
    // With the access log on standard output, that stream holds JSON lines
    // only (a log shipper parses each): the banner goes to standard error.
    let banner_to_stderr = config.access_log.as_deref() == Some("-");
    // Standard error is non-blocking while the server runs, and blocking
    // again (when standard output is not the access log's) for the last line below.
    let stderr = nthpool::stdio::StderrLog::begin();
    let result = server::serve(&config, args.listen, args.config.clone(), early, |addr, admin, proxies| {
        // Said once the start can no longer fail: a failed one says only why.
        for caution in config.cautions() {
            log::warn!("{caution}");
        }
        // Not `println!`: standard output may be the access log's, written
        // without blocking, and a full pipe must not end the server.
        let mut banner = String::new();
        if let Some(admin) = admin {
            banner += &format!("nthpool admin on http://{admin}\n");
        }
        for (pool, proxy) in proxies {
            banner += &format!("nthpool proxy for pool `{pool}` on http://{proxy}\n");
        }
        banner += &format!("nthpool listening on http://{addr}\n");
        if embedded {
            let (name, pool) = config.pools.iter().next().expect("the demo pool");
            let key = &pool.keys[0];
            banner += &format!("demo pool `{name}`, key {key}\n");
            banner +=
                &format!("try: curl -sS -X POST http://{addr}/pools/{name}/lock/acquire -H 'X-Nthpool-Key: {key}'\n");
        }
        if banner_to_stderr {
            nthpool::stdio::write_stderr(banner.as_bytes());
        } else {
            nthpool::stdio::write_stdout(banner.as_bytes());
        }
    });
    drop(stderr);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nthpool: {e}");
            ExitCode::FAILURE
        }
    }
}
