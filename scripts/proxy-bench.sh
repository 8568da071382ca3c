#!/usr/bin/env bash
# Proxy mode against nginx `proxy_pass` (upstream keepalive) and HAProxy, in
# front of the same fast upstream, with the same client, interleaved in one run.
#
# The upstream is nginx answering `return 200` (one worker). In front of it,
# in turn: nthpool in proxy mode (one pool, concurrency 10000, not adaptive,
# access log off), nginx `proxy_pass` with `keepalive 64` to the upstream (one
# worker, access log off), HAProxy (one thread, `http-reuse always`). The
# client is wrk, one thread, N keep-alive connections, the same headers to
# every proxy. Pinning: the proxy on CPU 0; wrk and the upstream on CPU 1
# (the machine has two). Each round measures the upstream alone first, then
# each proxy: throughput with N connections, and latency with one connection
# (closed-loop latency at N connections is N / throughput, so it says little
# about what a proxy adds); the added latency of a proxy is its one-connection
# p50 minus the direct one-connection p50 of the same round.
#
# On a shared machine the wall-clock figures move with whatever else runs, so
# every N-connection run also reports what does not: the proxy's own CPU time
# per request (utime + stime from /proc/PID/stat over the run, divided by the
# requests wrk counted), and how busy each CPU was (/proc/stat) — CPU 0 minus
# the proxy's own share is work of other programs on the proxy's CPU, and CPU 1
# near 100 % means the client and the upstream, not the proxy, set the rate.
# The summary gives medians with their min–max spread over the rounds.
#
# Usage: scripts/proxy-bench.sh            (5 rounds, runs of 4 s, 50 connections)
# Environment: BENCH_ROUNDS, BENCH_DURATION (s), BENCH_CONNECTIONS, BENCH_PORT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${BENCH_ROUNDS:-5}
DURATION=${BENCH_DURATION:-4}
CONNS=${BENCH_CONNECTIONS:-50}
PORT=${BENCH_PORT:-28070}
UP_PORT=$((PORT + 1))
NGINX_PORT=$((PORT + 2))
HAPROXY_PORT=$((PORT + 3))
KEY=nthpool-proxy-bench-key
HOST=bench.proxy.local
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$CARGO_TARGET_DIR/release

SCRIPT=proxy-bench.sh
WORK_PREFIX=nthpool-proxy-bench
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

for tool in nginx haproxy wrk; do
    command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install -y $tool)"
done
for p in "$PORT" "$UP_PORT" "$NGINX_PORT" "$HAPROXY_PORT"; do
    check_free "$p"
done
case "$PINNING" in one*) die "needs two CPUs: the proxy on one, the client and the upstream on the other" ;; esac
ON_PROXY=("${ON_SERVER[@]}")

say "building the release binary (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)..."
cargo build --release --quiet -p nthpool || die "build failed"

BODY='{"id":"cmpl-1","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"ok"}}]}'
nginx_proxy_confs "$UP_PORT" "$NGINX_PORT" "$BODY"
cat >"$WORK/haproxy.cfg" <<HAPROXY
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend front
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend up
backend up
    server s1 127.0.0.1:$UP_PORT
HAPROXY
cat >"$WORK/nthpool.json" <<JSON
{ "listen": "127.0.0.1:$PORT", "adminListen": null, "accessLog": null,
  "pools": { "bench": { "keys": ["$KEY"], "concurrency": 10000, "adaptive": false,
    "queue": { "size": 10000, "timeoutMs": 30000 },
    "upstream": { "url": "http://127.0.0.1:$UP_PORT", "hosts": ["$HOST"], "idleConnections": 256 } } } }
JSON
"$BIN/nthpool" --check-config "$WORK/nthpool.json" >/dev/null || die "the nthpool configuration is refused"

"${ON_CLIENT[@]}" nginx -c "$WORK/upstream.conf" &
PIDS+=($!)
PID_direct=$!
wait_port "$UP_PORT" "$!" 50 || die "the upstream nginx did not start"
"${ON_PROXY[@]}" nginx -c "$WORK/front.conf" &
PIDS+=($!)
PID_nginx=$!
wait_port "$NGINX_PORT" "$!" 50 || die "nginx proxy_pass did not start"
"${ON_PROXY[@]}" haproxy -f "$WORK/haproxy.cfg" -db &
PIDS+=($!)
PID_haproxy=$!
wait_port "$HAPROXY_PORT" "$!" 50 || die "HAProxy did not start"
(cd "$WORK" && RUST_LOG=warn exec "${ON_PROXY[@]}" "$BIN/nthpool" --config "$WORK/nthpool.json" >/dev/null) &
PIDS+=($!)
PID_nthpool=$!
wait_port "$PORT" "$!" 50 || die "nthpool did not start"

# CPU time of PID so far, in clock ticks (utime + stime).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Busy and total ticks of CPU 0 and CPU 1: "busy0 total0 busy1 total1".
cpus() { awk '/^cpu[01] /{t=0; for (i=2;i<=NF;i++) t+=$i; printf "%d %d ", t-$5-$6, t}' /proc/stat; }

# One wrk run on PORT with CONNECTIONS: prints "<requests/s> <p50 µs> <p99 µs>
# <non-2xx> <requests>".
run_wrk() {
    "${ON_CLIENT[@]}" wrk -t1 -c "$2" -d "${DURATION}s" --latency \
        -H "Host: $HOST" -H "X-Nthpool-Key: $KEY" "http://127.0.0.1:$1/v1/chat/completions" >"$WORK/wrk.out" 2>&1 || true
    python3 - "$WORK/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def us(v):
    n, unit = re.match(r"([\d.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
rps = re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)
p50 = us(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1))
p99 = us(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
n = re.search(r"(\d+) requests in", text).group(1)
print(rps, f"{p50:.0f}", f"{p99:.0f}", bad.group(1) if bad else 0, n)
PY
}

# measure NAME PORT PID: the N-connection run with its CPU figures, then the
# one-connection run; one line of the results file.
measure() {
    local t0 c0 t1 c1 many one
    t0=$(ticks "$3")
    c0=$(cpus)
    many=$(run_wrk "$2" "$CONNS")
    t1=$(ticks "$3")
    c1=$(cpus)
    one=$(run_wrk "$2" 1)
    echo "$round $1 $many $one $((t1 - t0)) $c0 $c1"
}

say "proxy benchmark: $ROUNDS rounds × (direct, nthpool, nginx, haproxy), ${DURATION}s each, wrk -t1 -c$CONNS, $PINNING;"
say "  the upstream (nginx return 200) shares CPU 1 with wrk; every proxy runs on CPU 0; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
    for name in direct nthpool nginx haproxy; do
        case $name in
            direct) port=$UP_PORT ;;
            nthpool) port=$PORT ;;
            nginx) port=$NGINX_PORT ;;
            haproxy) port=$HAPROXY_PORT ;;
        esac
        pid_var=PID_$name
        line=$(measure "$name" "$port" "${!pid_var}")
        echo "$line" >>"$WORK/results"
        say "  $line"
    done
done
python3 - "$WORK/results" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
hz = int(sys.argv[2])
by = {}
for l in open(sys.argv[1]):
    f = l.split()
    rnd, name = int(f[0]), f[1]
    rps, p50, p99, bad, n = float(f[2]), float(f[3]), float(f[4]), int(f[5]), int(f[6])
    rps1, p50_1, bad1 = float(f[7]), float(f[8]), int(f[10])
    ticks = int(f[12])
    b0, t0, b1, t1, b0e, t0e, b1e, t1e = map(int, f[13:21])
    cpu0 = (b0e - b0) / max(t0e - t0, 1)
    cpu1 = (b1e - b1) / max(t1e - t1, 1)
    # The measured process's share of one CPU; the direct run's is the upstream's, on CPU 1.
    own = ticks / hz / max(n / rps, 1e-9) if name != "direct" else 0
    by.setdefault(name, []).append(dict(
        rnd=rnd, rps=rps, p50=p50, p99=p99, bad=bad + bad1, p50_1=p50_1,
        cpu_us=ticks / hz * 1e6 / max(n, 1), other0=max(cpu0 - own, 0) * 100, cpu1=cpu1 * 100))
direct = {r["rnd"]: r["p50_1"] for r in by["direct"]}
def spread(xs, fmt="{:.0f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"
print(f"\nmedians over {len(by['direct'])} rounds (min–max); added p50 = one-connection p50 minus the same round's direct one")
print(f"  {'':8} {'req/s':>21} {'added p50 µs':>16} {'CPU µs/request':>18} {'others on CPU 0 %':>18} {'CPU 1 busy %':>14} {'non-2xx':>7}")
for name in ["direct", "nthpool", "nginx", "haproxy"]:
    rs = by[name]
    added = spread([r["p50_1"] - direct[r["rnd"]] for r in rs]) if name != "direct" else "-"
    print(f"  {name:8} {spread([r['rps'] for r in rs]):>21} {added:>16} {spread([r['cpu_us'] for r in rs], '{:.1f}'):>18}"
          f" {spread([r['other0'] for r in rs]):>18} {spread([r['cpu1'] for r in rs]):>14} {sum(r['bad'] for r in rs):>7}")
for other in ["nginx", "haproxy"]:
    x = [r["rps"] for r in by["nthpool"]]
    o = [r["rps"] for r in by[other]]
    per_round = [a / b for a, b in zip(x, o)]
    cx = statistics.median(r["cpu_us"] for r in by["nthpool"])
    co = statistics.median(r["cpu_us"] for r in by[other])
    print(f"  nthpool/{other}: req/s {spread(per_round, '{:.2f}')} round by round; CPU per request {cx / co:.2f}")
PY
