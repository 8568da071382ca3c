#!/usr/bin/env bash
# The standard load scenarios of nthpool, printed as one table.
#
#   scripts/bench.sh [--compare]
#
# Builds the release binaries, starts the server pinned to CPU 0 and drives it
# with nthpool-bench pinned to CPU 1, over 127.0.0.1 only:
#   (a) acquire -> release cycles, closed loop
#   (b) the same with two renews per cycle
#   (c) a contended pool: 8 slots, 64 connections queueing with waitMs
#   (d) scale: (a) again while the server holds 1,000,000 slots on another pool
#       and keeps as many waiting acquires queued as file descriptors allow,
#       plus the server's RSS per held slot
# then the governor micro-benchmark (no sockets).
#
# --compare also installs (apt-get) and starts nginx (one worker, `return 200`
# with a real grant body, access log off) and Redis 7 (a ZSET semaphore in Lua),
# both on CPU 0, and runs nthpool, nginx, Redis, nthpool again with the same load
# tool and connection count, then prints nthpool/nginx and nthpool/Redis ratios;
# then nthpool and nginx again with wrk (one thread, a Lua acquire -> release
# script that takes the slotId from each grant; nginx with that same script,
# with plain GETs, and in nthpool's answer shape: a slotId that differs on
# every grant and the five governor headers), so no ratio rests on one client.
# Each wrk run reports the server's and wrk's CPU µs per request and the
# server's sleeps (voluntary context switches) per request beside requests/s.
# nthpool runs with its access log on.
#
# Every run is bounded by BENCH_DURATION seconds (default 10); the whole script
# takes about a minute, two with --compare (plus the build and any apt-get).
# Environment: BENCH_DURATION, BENCH_CONNECTIONS (50), BENCH_FILL (1000000),
# BENCH_WAITERS (as many as fit, at most 100000), BENCH_ROUNDS (1: rounds of
# nthpool, nginx, redis before the last nthpool run), BENCH_PORT (27070; nginx
# listens 10 and 11 above it, Redis 9), CARGO_TARGET_DIR.
set -euo pipefail

COMPARE=0
for arg in "$@"; do
    case "$arg" in
        --compare) COMPARE=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bench.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${BENCH_DURATION:-10}
CONNS=${BENCH_CONNECTIONS:-50}
FILL=${BENCH_FILL:-1000000}
# --compare: rounds of nthpool, nginx, redis, then nthpool once more.
ROUNDS=${BENCH_ROUNDS:-1}
KEY=nthpool-bench-key
PORT=${BENCH_PORT:-27070}
NGINX_PORT=$((PORT + 10))
NGINX_SHAPED_PORT=$((PORT + 11))
REDIS_PORT=$((PORT + 9))
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$CARGO_TARGET_DIR/release

SCRIPT=bench.sh
WORK_PREFIX=nthpool-bench
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

# --- file descriptors --------------------------------------------------------
# Each waiting acquire is one TCP connection: one descriptor in the server (a
# single process) and one in the load tool. Raise the hard limit if this user
# may (CAP_SYS_RESOURCE), then the soft limit to the hard one.
WANT_FDS=210000
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$WANT_FDS" ]; then
    ulimit -Hn "$WANT_FDS" 2>/dev/null || true
fi
ulimit -Sn "$(ulimit -Hn)"
FD_LIMIT=$(ulimit -Hn)
[ "$FD_LIMIT" = unlimited ] && FD_LIMIT=1048576
# Kept free in the server for the measured connections, the listener, epoll,
# the signal pipe and the standard streams.
FD_RESERVE=500
WAITERS=${BENCH_WAITERS:-$((FD_LIMIT - FD_RESERVE < 100000 ? FD_LIMIT - FD_RESERVE : 100000))}
if [ -n "${BENCH_WAITERS:-}" ]; then
    WAITERS_NOTE="$WAITERS waiters (BENCH_WAITERS; file descriptor hard limit $FD_LIMIT)"
elif [ "$WAITERS" -lt 100000 ]; then
    WAITERS_NOTE="$WAITERS waiters, not 100000: each waiter is one TCP connection, so one file descriptor in the
   server process and one in the load tool, and the hard limit is $FD_LIMIT per process (ulimit -Hn;
   raising it needs CAP_SYS_RESOURCE, which this user lacks). The load tool's side could be split over
   processes and its ports are spread over 127.0.0.2-9, but the server is one process and cannot hold
   more; $FD_RESERVE descriptors stay free for the measured connections. The governor micro-benchmark
   below queues 100000 waiters without sockets."
else
    WAITERS_NOTE="$WAITERS waiters (file descriptor hard limit $FD_LIMIT)"
fi

# --- build -------------------------------------------------------------------
say "building release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)..."
cargo build --release --quiet -p nthpool -p nthpool-bench || die "build failed"

# --- helpers for the table ---------------------------------------------------
cat >"$WORK/row.py" <<'PY'
"""Formats nthpool-bench --json results (and the servers' CPU time) as table rows."""
import json, statistics, sys

def cpu_seconds(path):
    """The servers' CPU seconds during the run and the run's wall milliseconds."""
    with open(path[: -len(".json")] + ".cpu") as f:
        ticks, per_s, wall_ms = map(int, f.read().split())
    return ticks / per_s, wall_ms

def cpu_per_request(path):
    try:
        with open(path) as f:
            requests = json.loads(f.read())["requests"]
        return cpu_seconds(path)[0] * 1e6 / requests if requests else 0.0
    except (OSError, ValueError, KeyError):
        return 0.0

def busy(path):
    """The server's and the load tool's shares of the run's wall time, in %."""
    seconds, wall_ms = cpu_seconds(path)
    with open(path[: -len(".json")] + ".time") as f:
        client = sum(float(x) for x in f.read().split()[:2])
    return 100 * seconds * 1000 / max(wall_ms, 1), 100 * client * 1000 / max(wall_ms, 1)

def cpu(path, requests):
    """The server's CPU µs per answered request, and the server's and the load
    tool's busy shares of the run."""
    try:
        seconds, _ = cpu_seconds(path)
        server, client = busy(path)
    except (OSError, ValueError):
        return f"{'-':>7} {'-':>5} {'-':>5}"
    per_req = seconds * 1e6 / requests if requests else 0.0
    # A server that had the CPU for less than half the run was held back by
    # something else: the load tool, or another process on its CPU.
    return f"{per_req:>7.1f} {server:>5.0f} {client:>5.0f}" + (" *" if server < 50 else "")

def row(label, path):
    try:
        with open(path) as f:
            r = json.loads(f.read())
    except (OSError, ValueError):
        return f"{label:<44} {'(run failed: see above)':>20}"
    eps = r.get("endpoints", {})
    first = eps.get("get") or eps.get("acquire") or {}
    rel = eps.get("release")
    non2xx = sum(n for e in eps.values() for code, n in e["statuses"].items() if not code.startswith("2"))
    errors = r["connectErrors"] + sum(n for e in eps.values() for n in e["errors"].values())
    cycles = f"{r['cyclesPerSec']:>10.0f}" if r["mode"] != "get" else f"{'-':>10}"
    rel99 = f"{rel['p99Us']:>8}" if rel else f"{'-':>8}"
    return (f"{label:<44} {r['connections']:>5} {r['requestsPerSec']:>11.0f} {cycles} "
            f"{first.get('p50Us', 0):>8} {first.get('p99Us', 0):>8} {rel99} {non2xx:>7} {errors:>6} "
            f"{cpu(path, r['requests'])}")

def header():
    return (f"{'scenario':<44} {'conns':>5} {'requests/s':>11} {'cycles/s':>10} "
            f"{'p50 µs':>8} {'p99 µs':>8} {'rel p99':>8} {'non-2xx':>7} {'errors':>6} {'CPU µs':>7} {'busy':>5} {'tool':>5}")

def rps(path):
    try:
        with open(path) as f:
            return json.loads(f.read())["requestsPerSec"]
    except (OSError, ValueError, KeyError):
        return 0.0

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "header":
        print(header())
    elif cmd == "row":
        print(row(sys.argv[2], sys.argv[3]))
    elif cmd == "rps":
        print(f"{rps(sys.argv[2]):.1f}")
    elif cmd == "cpu":
        print(f"{cpu_per_request(sys.argv[2]):.3f}")
    elif cmd == "starved":
        try:
            print("yes" if max(busy(sys.argv[2])) < 50 else "no")
        except (OSError, ValueError):
            print("no")
    elif cmd == "compare":
        # nthpool runs -- nginx runs -- redis runs
        args = " ".join(sys.argv[2:]).split(" -- ")
        xs, ngs, rds = (a.split() for a in args)
        med = lambda f, paths: statistics.median(f(p) for p in paths)
        ratio = lambda a, b: f"{a / b:.3f}" if b else "?"
        x, ng, rd = med(rps, xs), med(rps, ngs), med(rps, rds)
        print(f"  requests/s, median over runs: nthpool {x:.0f} ({len(xs)} runs), nginx {ng:.0f} ({len(ngs)}),"
              f" redis {rd:.0f} ({len(rds)})")
        print(f"  requests/s ratio nthpool/nginx: {ratio(x, ng)}; run by run: "
              + " ".join(ratio(rps(p), ng) for p in xs))
        print(f"  requests/s ratio nthpool/redis: {ratio(x, rd)}; run by run: "
              + " ".join(ratio(rps(p), rd) for p in xs))
        cx, cng, crd = med(cpu_per_request, xs), med(cpu_per_request, ngs), med(cpu_per_request, rds)
        print(f"  server CPU µs per request, medians: nthpool {cx:.1f}, nginx {cng:.1f}, redis {crd:.1f};"
              f" ratio nthpool/nginx {ratio(cx, cng)}, nthpool/redis {ratio(cx, crd)} (below 1: nthpool spends less)")
    elif cmd == "field":
        with open(sys.argv[2]) as f:
            v = json.loads(f.read()).get(sys.argv[3])
        print(f"{v:.{int(sys.argv[4])}f}" if isinstance(v, float) and len(sys.argv) > 4 else v)
PY
row() { python3 "$WORK/row.py" row "$@"; }
field() { python3 "$WORK/row.py" field "$@" 2>/dev/null || echo "?"; }
rps() { python3 "$WORK/row.py" rps "$1"; }

# A fail-fast acquire on a pool: "status header-value" for one governor header.
probe() {
    python3 - "$PORT" "$1" "$2" "$KEY" <<'PY'
import http.client, sys
port, pool, header, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("POST", f"/pools/{pool}/lock/acquire", headers={"X-Nthpool-Key": key, "Content-Length": "0"})
r = c.getresponse()
r.read()
print(r.status, r.getheader(header))
PY
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# CPU time, in clock ticks, of the given processes and their children (an
# nginx master and its worker): rates on a busy machine vary with what else
# runs, a server's own CPU time per request much less.
cpu_ticks() {
    local total=0 pid p stat fields
    for pid in "$@"; do
        for p in "$pid" $(cat "/proc/$pid/task/"*/children 2>/dev/null); do
            stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
            # Fields after the command name, which may itself hold spaces.
            read -r -a fields <<<"${stat##*) }"
            total=$((total + fields[11] + fields[12]))
        done
    done
    echo "$total"
}
CLK_TCK=$(getconf CLK_TCK)

# Voluntary context switches (sleeps) of the given processes and their children.
sleeps() {
    local total=0 pid p n
    for pid in "$@"; do
        for p in "$pid" $(cat "/proc/$pid/task/"*/children 2>/dev/null); do
            n=$(awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$p/status" 2>/dev/null) || continue
            total=$((total + ${n:-0}))
        done
    done
    echo "$total"
}

# Runs measured again because another process took the CPUs; at most
# RETRIES_LEFT in all, so a machine that is never quiet still ends in time.
RETRIES_LEFT=3

# One bounded run of the load tool against the servers with pids $2 (see
# once), measured again if both the server and the load tool got less than
# half a CPU: then neither was the limit, something else on the machine was.
run() {
    local name=$1
    once "$@"
    while [ "$RETRIES_LEFT" -gt 0 ] && [ "$(python3 "$WORK/row.py" starved "$WORK/$name.json")" = yes ]; do
        RETRIES_LEFT=$((RETRIES_LEFT - 1))
        say "  ($name: server and load tool both had under half a CPU, so another process was running; again)"
        once "$@"
    done
}

# One bounded run of the load tool against the servers with pids $2: its JSON
# goes to $WORK/$1.json, the servers' CPU time and the wall time to $WORK/$1.cpu.
once() {
    local name=$1 pids=$2 c0 t0
    shift 2
    # shellcheck disable=SC2086 # a list of pids
    c0=$(cpu_ticks $pids)
    t0=$(date +%s%N)
    # The load tool's own CPU seconds (user, system) go to $WORK/$name.time.
    local TIMEFORMAT='%3U %3S' status=0
    { time "${ON_CLIENT[@]}" "$BIN/nthpool-bench" --json -d "$DURATION" "$@" >"$WORK/$name.json" 2>"$WORK/$name.err"; } \
        2>"$WORK/$name.time" || status=$?
    if [ "$status" != 0 ]; then
        say "  ($name: the load tool failed: $(tail -n 3 "$WORK/$name.err" | tr '\n' ' '))"
    fi
    # shellcheck disable=SC2086
    echo "$(($(cpu_ticks $pids) - c0)) $CLK_TCK $((($(date +%s%N) - t0) / 1000000))" >"$WORK/$name.cpu"
}

# A run against the nthpool server.
load() {
    local name=$1
    shift
    run "$name" "$SERVER" --addr "127.0.0.1:$PORT" --key "$KEY" "$@"
}

# --- the server --------------------------------------------------------------
cat >"$WORK/nthpool.json" <<JSON
{
  "listen": "127.0.0.1:$PORT",
  "adminListen": null,
  "accessLog": "$WORK/access.log",
  "maxConnections": 1000000,
  "pools": {
    "bench": { "keys": ["$KEY"], "concurrency": 1000000, "adaptive": false },
    "contended": { "keys": ["$KEY"], "concurrency": 8, "queue": { "size": 100000 } },
    "full": { "keys": ["$KEY"], "concurrency": 1000000, "adaptive": false, "termMs": 3600000, "renewIntervalMs": 1000000,
              "requestTimeoutMs": 3600000 },
    "waiters": { "keys": ["$KEY"], "concurrency": 1, "queue": { "size": 200000, "timeoutMs": 3600000 },
                 "termMs": 3600000, "renewIntervalMs": 1000000, "requestTimeoutMs": 3600000 }
  }
}
JSON
check_free "$PORT"
env RUST_LOG=warn "${ON_SERVER[@]}" "$BIN/nthpool" --config "$WORK/nthpool.json" >"$WORK/nthpool.log" 2>&1 &
SERVER=$!
PIDS+=("$SERVER")
wait_port "$PORT" "$SERVER" 100 || die "nthpool did not start: $(cat "$WORK/nthpool.log")"

say ""
say "====== nthpool bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?') ======"
say "  $(nproc) CPUs, $(uname -sr); $PINNING"
say "  each run: closed loop, ${DURATION} s, 127.0.0.1 only; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
if awk "BEGIN { exit !($LOAD1 > 0.5) }"; then
    say "  WARNING: other processes are using the CPUs (1-minute load $LOAD1): expect noisy numbers"
fi

say ""
say "running (a) cycles, (b) renews, (c) contended..."
load a --pool bench -c "$CONNS"
load b --pool bench -c "$CONNS" --renews 2
load c --pool contended -c 64 --wait-ms 5000

# --- (d) scale ---------------------------------------------------------------
say "running (d): filling $FILL slots on pool full..."
RSS_EMPTY=$(rss_kb "$SERVER")
"${ON_CLIENT[@]}" "$BIN/nthpool-bench" --addr "127.0.0.1:$PORT" --key "$KEY" --json --pool full --fill "$FILL" -c 64 -d 60 >"$WORK/fill.json" 2>"$WORK/fill.err" ||
    say "  (the fill did not complete: $(cat "$WORK/fill.err"))"
RSS_FULL=$(rss_kb "$SERVER")
say "  queueing $WAITERS waiting acquires on pool waiters..."
QUEUE_HOLD=$((DURATION + 90))
"${ON_CLIENT[@]}" "$BIN/nthpool-bench" --addr "127.0.0.1:$PORT" --key "$KEY" --json --pool waiters --queue "$WAITERS" -d "$QUEUE_HOLD" \
    >"$WORK/queue.json" 2>"$WORK/queue.err" &
QUEUE=$!
PIDS+=("$QUEUE")
for _ in $(seq 1 1200); do
    grep -q '^queue:' "$WORK/queue.err" 2>/dev/null && break
    kill -0 "$QUEUE" 2>/dev/null || break
    sleep 0.05
done
grep -q '^queue:' "$WORK/queue.err" || say "  (not every waiting acquire was sent: $(cat "$WORK/queue.err"))"
# Give the server a moment to read the last requests it was sent.
sleep 1
read -r FULL_STATUS FULL_REMAINING <<<"$(probe full x-nthpool-remaining-slots)"
read -r WAIT_STATUS QUEUE_DEPTH <<<"$(probe waiters x-nthpool-queue-depth)"
RSS_QUEUED=$(rss_kb "$SERVER")
say "running (d) cycles at scale..."
load d --pool bench -c "$CONNS"
kill "$QUEUE" 2>/dev/null || true
wait "$QUEUE" 2>/dev/null || true

# --- the table ---------------------------------------------------------------
say ""
python3 "$WORK/row.py" header
row "(a) acquire -> release" "$WORK/a.json"
row "(b) acquire -> 2 renews -> release" "$WORK/b.json"
row "(c) contended: 8 slots, 64 conns, waitMs 5000" "$WORK/c.json"
# The fill as it was asked for (BENCH_FILL), 1M by default.
HELD=$FILL
if [ "$FILL" = 1000000 ]; then HELD=1M; fi
row "(d) = (a) with $HELD held + ${QUEUE_DEPTH} queued" "$WORK/d.json"
say "  p50/p99: latency of acquire (or GET); rel p99: of release; errors: connect, timeout, reset;"
say "  CPU µs: the server's CPU time (user + system, /proc/PID/stat) per answered request; busy: its share"
say "  of the run's wall time in % (* under 50: held back); tool: the load tool's share (near 100: it is the limit)"
RPS_A=$(rps "$WORK/a.json")
RPS_D=$(rps "$WORK/d.json")
CPU_A=$(python3 "$WORK/row.py" cpu "$WORK/a.json")
CPU_D=$(python3 "$WORK/row.py" cpu "$WORK/d.json")
say "  (d)/(a): requests/s $(awk "BEGIN { if ($RPS_A > 0) printf \"%.3f\", $RPS_D / $RPS_A; else print \"?\" }")," \
    "server CPU µs per request $(awk "BEGIN { if ($CPU_A > 0) printf \"%.3f\", $CPU_D / $CPU_A; else print \"?\" }")" \
    "(the second depends far less on what else the machine runs)"
say ""
say "scale state during (d):"
say "  fill: $(field "$WORK/fill.json" granted) of $FILL slots granted on pool full in $(field "$WORK/fill.json" builtInS 2) s" \
    "($(field "$WORK/fill.json" acquiresPerSec 0) acquires/s, 64 connections, 16 pipelined each)"
say "  probe acquire on full: HTTP $FULL_STATUS, x-nthpool-remaining-slots $FULL_REMAINING"
say "  probe acquire on waiters: HTTP $WAIT_STATUS, x-nthpool-queue-depth $QUEUE_DEPTH (1 connection holds the slot)"
say "  $WAITERS_NOTE"
if [ -n "$RSS_EMPTY" ] && [ -n "$RSS_FULL" ]; then
    say "  server RSS (VmRSS): $RSS_EMPTY kB idle, $RSS_FULL kB with $FILL held, $RSS_QUEUED kB with the waiters too"
    say "  RSS per held slot: $(awk "BEGIN { printf \"%.1f\", ($RSS_FULL - $RSS_EMPTY) * 1024 / $FILL }") bytes;" \
        "per queued waiter with its connection: $(awk "BEGIN { if ($WAITERS > 0) printf \"%.0f\", ($RSS_QUEUED - $RSS_FULL) * 1024 / $WAITERS }") bytes"
fi

# --- comparison --------------------------------------------------------------
if [ "$COMPARE" = 1 ]; then
    say ""
    say "running the comparison (nthpool, nginx, redis, nthpool)..."
    NEED=()
    command -v nginx >/dev/null || NEED+=(nginx)
    command -v redis-server >/dev/null || NEED+=(redis-server)
    if [ "${#NEED[@]}" -gt 0 ]; then
        say "  installing ${NEED[*]} with apt-get..."
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${NEED[@]}" >/dev/null ||
            die "apt-get install ${NEED[*]} failed"
    fi
    NGINX=$(command -v nginx)
    REDIS=$(command -v redis-server)

    # A fresh nthpool, so its two runs start from the state (a) started from.
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    # Without its slot secret, state file and lock the new server is a first start:
    # no re-adoption window (a state file, or the lock's lease terms, beside a new secret would open one).
    rm -f "$WORK/nthpool.secret" "$WORK/nthpool.state" "$WORK/nthpool.state.refused" "$WORK/nthpool.state.lock"
    env RUST_LOG=warn "${ON_SERVER[@]}" "$BIN/nthpool" --config "$WORK/nthpool.json" >"$WORK/nthpool.log" 2>&1 &
    SERVER=$!
    PIDS+=("$SERVER")
    wait_port "$PORT" "$SERVER" 100 || die "nthpool did not start again: $(cat "$WORK/nthpool.log")"

    # nginx answers with a real grant body, byte for byte (`return 200`).
    mkdir -p "$WORK/www" "$WORK/nginx-tmp"
    chmod 755 "$WORK" "$WORK/www"
    python3 - "$PORT" "$KEY" "$WORK/www/grant.json" <<'PY'
import http.client, sys
port, key, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("POST", "/pools/bench/lock/acquire", headers={"X-Nthpool-Key": key, "Content-Length": "0"})
body = c.getresponse().read()
open(out, "wb").write(body)
PY
    cat >"$WORK/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
NGINX
    nginx_http_block "$NGINX_PORT" "$NGINX_SHAPED_PORT" >>"$WORK/nginx.conf"
    check_free "$NGINX_PORT"
    check_free "$NGINX_SHAPED_PORT"
    "${ON_SERVER[@]}" "$NGINX" -e "$WORK/nginx-error.log" -p "$WORK" -c "$WORK/nginx.conf" &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    wait_port "$NGINX_PORT" "$NGINX_PID" 100 || die "nginx did not start: $(cat "$WORK/nginx-error.log")"

    # The semaphore: holders in a sorted set scored by acquire time; expired
    # holders (older than the 30 s term) go first, then a new holder gets in
    # if fewer than the limit hold it. Release is ZREM of the holder id.
    cat >"$WORK/semaphore.lua" <<'LUA'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 30000)
if redis.call('ZCARD', KEYS[1]) < 1000000 then
  local id = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[1], now, id)
  return id
end
return false
LUA
    check_free "$REDIS_PORT"
    "${ON_SERVER[@]}" "$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$WORK" --logfile "$WORK/redis.log" &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    wait_port "$REDIS_PORT" "$REDIS_PID" 100 || die "redis did not start: $(cat "$WORK/redis.log")"
    SHA=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$WORK/semaphore.lua")")
    [ "${#SHA}" = 40 ] || die "SCRIPT LOAD failed: $SHA"

    NGINX_ADDR=127.0.0.1:$NGINX_PORT
    REDIS_ADDR=127.0.0.1:$REDIS_PORT
    XS=() NGS=() RDS=()
    for round in $(seq 1 "$ROUNDS"); do
        load "x$round" --pool bench -c "$CONNS"
        run "ng$round" "$NGINX_PID" --addr "$NGINX_ADDR" --get /grant.json -c "$CONNS"
        run "rd$round" "$REDIS_PID" --addr "$REDIS_ADDR" --redis "$SHA" --pool sem -c "$CONNS"
        XS+=("$WORK/x$round.json") NGS+=("$WORK/ng$round.json") RDS+=("$WORK/rd$round.json")
    done
    load "x$((ROUNDS + 1))" --pool bench -c "$CONNS"
    XS+=("$WORK/x$((ROUNDS + 1)).json")

    say ""
    say "comparison, interleaved, same load tool and $CONNS connections; each server on CPU 0"
    say "  grant body served by nginx: $(wc -c <"$WORK/www/grant.json") bytes; $("$NGINX" -v 2>&1 | sed 's/.*: //')," \
        "one worker; $("$REDIS" --version | cut -d' ' -f1-3)"
    python3 "$WORK/row.py" header
    for round in $(seq 1 "$ROUNDS"); do
        row "nthpool: acquire -> release" "$WORK/x$round.json"
        row "nginx: GET /grant.json (return 200)" "$WORK/ng$round.json"
        row "redis: EVALSHA acquire -> ZREM release" "$WORK/rd$round.json"
    done
    row "nthpool again" "$WORK/x$((ROUNDS + 1)).json"
    python3 "$WORK/row.py" compare "${XS[@]}" -- "${NGS[@]}" -- "${RDS[@]}"

    # The same comparison with an independent client, so that no ratio rests
    # on one load tool: wrk, one thread on CPU 1, acquire -> release cycles
    # from a Lua script that takes each slotId from the grant body.
    if ! command -v wrk >/dev/null; then
        say "  installing wrk with apt-get..."
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null ||
            die "apt-get install wrk failed"
    fi
    CYCLE=$ROOT/scripts/wrk-cycle.lua
    # One wrk run: prints "requests/s, server CPU µs per request, wrk CPU µs
    # per request, server sleeps per request". wrk is one thread on one CPU;
    # when its own CPU per request exceeds the server's, the run measures the
    # client, and the server CPU per request is the figure that compares the
    # servers.
    wrk_run() {
        local pids=$1 c0 s0 status=0
        shift
        # shellcheck disable=SC2086 # a list of pids
        c0=$(cpu_ticks $pids) s0=$(sleeps $pids)
        local TIMEFORMAT='%3U %3S'
        { time "${ON_CLIENT[@]}" wrk -t1 -c "$CONNS" -d "${DURATION}s" "$@" >"$WORK/wrk.out" 2>&1; } \
            2>"$WORK/wrk.time" || status=$?
        [ "$status" = 0 ] || say "  wrk $* failed: $(tail -n 2 "$WORK/wrk.out" | tr '\n' ' ')" >&2
        if grep -q '^  Non-2xx' "$WORK/wrk.out"; then
            say "  wrk $*: $(grep '^  Non-2xx' "$WORK/wrk.out" | sed 's/^ *//')" >&2
        fi
        # shellcheck disable=SC2086
        python3 -c '
import re, sys
out, ticks, hz, tool = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3]), open(sys.argv[4]).read().split()
sleeps = int(sys.argv[5])
n = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
rps = float(re.search(r"^Requests/sec:\s*([\d.]+)", out, re.M).group(1))
print(f"{rps:.0f},{ticks / hz * 1e6 / n:.2f},{(float(tool[0]) + float(tool[1])) * 1e6 / n:.2f},{sleeps / n:.4f}")
' "$WORK/wrk.out" "$(($(cpu_ticks $pids) - c0))" "$CLK_TCK" "$WORK/wrk.time" "$(($(sleeps $pids) - s0))"
    }
    WX=() WNL=() WNG=() WNS=()
    for round in $(seq 1 "$ROUNDS"); do
        WX+=("$(wrk_run "$SERVER" -s "$CYCLE" "http://127.0.0.1:$PORT" -- "$KEY")")
        WNL+=("$(wrk_run "$NGINX_PID" -s "$CYCLE" "http://$NGINX_ADDR" -- "$KEY")")
        WNG+=("$(wrk_run "$NGINX_PID" "http://$NGINX_ADDR/grant.json")")
        WNS+=("$(wrk_run "$NGINX_PID" -s "$CYCLE" "http://127.0.0.1:$NGINX_SHAPED_PORT" -- "$KEY")")
    done
    WX+=("$(wrk_run "$SERVER" -s "$CYCLE" "http://127.0.0.1:$PORT" -- "$KEY")")
    say ""
    say "comparison with wrk ($(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)), one thread, $CONNS connections, interleaved"
    python3 - "${WX[*]}" "${WNL[*]}" "${WNG[*]}" "${WNS[*]}" <<'PY'
import statistics, sys
runs = [[tuple(map(float, r.split(","))) for r in arg.split()] for arg in sys.argv[1:5]]
names = ["nthpool, Lua acquire -> release", "nginx, the same Lua script", "nginx, GET /grant.json, no Lua",
         "nginx in nthpool's answer shape"]
print(f"  {'server and client':<34} {'req/s':>9} {'server CPU µs/req':>18} {'wrk CPU µs/req':>15}"
      f" {'sleeps/req':>10}   (medians; runs req/s/server/wrk)")
med = []
for name, rs in zip(names, runs):
    m = [statistics.median(r[i] for r in rs) for i in range(4)]
    med.append(m)
    print(f"  {name:<34} {m[0]:>9.0f} {m[1]:>18.2f} {m[2]:>15.2f} {m[3]:>10.4f}   "
          + "; ".join(f"{r[0]:.0f}/{r[1]:.2f}/{r[2]:.2f}" for r in rs))
x, nl, ng, ns = med
print(f"  wrk requests/s nthpool/nginx: {x[0] / nl[0]:.3f} (same script), {x[0] / ng[0]:.3f} (plain GET)")
print(f"  server CPU per request nthpool/nginx: {x[1] / nl[1]:.3f} (same script), {x[1] / ng[1]:.3f} (plain GET)")
print(f"  wrk CPU per request nthpool/nginx: {x[2] / nl[2]:.3f} (same script), {x[2] / ng[2]:.3f} (plain GET)")
print(f"  against nginx in nthpool's answer shape: requests/s {x[0] / ns[0]:.3f}, wrk CPU per request {x[2] / ns[2]:.3f}")
PY
fi

# --- the governor alone --------------------------------------------------------
say ""
"${ON_CLIENT[@]}" "$BIN/nthpool-governor-bench" || say "(the governor micro-benchmark failed)"
