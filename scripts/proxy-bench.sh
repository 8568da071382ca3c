#!/usr/bin/env bash
# Proxy mode against nginx `proxy_pass` (upstream keepalive) and HAProxy, in
# front of the same fast upstream, with the same clients, interleaved in one run.
#
# The upstream is nginx answering `return 200` (one worker). In front of it,
# in turn: nthpool in proxy mode (one pool, concurrency 10000, not adaptive,
# access log off), nginx `proxy_pass` with `keepalive 64` to the upstream (one
# worker, access log off), HAProxy (one thread, `http-reuse always`). The
# upstream alone ("direct") is measured the same way, so the latency a proxy
# adds is its figure minus the same round's direct one. Every round takes the
# four in a new order (rotated), so drift in the machine's load falls on all.
#
# Two CPUs (every proxy on CPU 0; the clients and the upstream on CPU 1):
#   - throughput: wrk, one thread, N keep-alive connections, the same headers to
#     every proxy; with the proxy's own CPU time per request (utime + stime
#     from /proc/PID/stat over the run, divided by the requests wrk counted)
#     and how busy each CPU was (/proc/stat): CPU 0 minus the proxy's own share
#     is work of other programs on the proxy's CPU, and CPU 1 near 100 % means
#     the client and the upstream, not the proxy, set the rate;
#   - latency with one connection (nthpool-bench -c 1, closed loop) and open
#     loop (nthpool-bench --rate R over C connections, latency from each
#     request's intended send time). Across two vCPUs every proxied request
#     takes four cross-CPU wake-ups (client -> proxy -> upstream -> proxy ->
#     client), which cost far more than any proxy's work and vary by tens of
#     microseconds from run to run: these figures cannot tell two proxies apart.
# One CPU (the client, the proxy and the upstream all on CPU 1; the proxies
# are moved there with taskset after the two-CPU rounds):
#   - latency with one connection, closed loop: no cross-CPU wake-up is left,
#     so the added latency is the proxy's own work per exchange plus the two
#     context switches into it and out, the figure that decides "no more added
#     p50 than nginx". Its mean comes from the request rate (one request in
#     flight: mean = 1 / rate), finer than the p50's whole microseconds.
# Then, when perf can read the syscall tracepoints, what does not move with
# the machine at all: system calls per proxied exchange, by name, over a fixed
# number of one-connection requests (perf stat -e 'syscalls:sys_enter_*').
#
# Usage: scripts/proxy-bench.sh            (5 rounds, throughput runs of 3 s, 50 connections)
# Environment: BENCH_ROUNDS, BENCH_DURATION (s), BENCH_CONNECTIONS, BENCH_PORT,
#   BENCH_RATE (open loop, requests/s; 4000), BENCH_OPEN_CONNECTIONS (16),
#   BENCH_SYSCALL_REQUESTS (20000), CARGO_TARGET_DIR.
set -euo pipefail

for arg in "$@"; do
    case "$arg" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "proxy-bench.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${BENCH_ROUNDS:-5}
DURATION=${BENCH_DURATION:-3}
CONNS=${BENCH_CONNECTIONS:-50}
RATE=${BENCH_RATE:-4000}
OPEN_CONNS=${BENCH_OPEN_CONNECTIONS:-16}
SYSCALL_REQUESTS=${BENCH_SYSCALL_REQUESTS:-20000}
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

for tool in nginx haproxy wrk python3; do
    command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install -y $tool)"
done
for p in "$PORT" "$UP_PORT" "$NGINX_PORT" "$HAPROXY_PORT"; do
    check_free "$p"
done
case "$PINNING" in one*) die "needs two CPUs: the proxy on one, the client and the upstream on the other" ;; esac
ON_PROXY=("${ON_SERVER[@]}")

say "building the release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)..."
cargo build --release --quiet -p nthpool -p nthpool-bench || die "build failed"

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
    "upstream": { "url": "http://127.0.0.1:$UP_PORT", "hosts": ["$HOST", "127.0.0.1"], "idleConnections": 256 } } } }
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

# nthpool-bench sends `Host: 127.0.0.1:PORT`, routed to the pool by its second host.

# CPU time of PID so far, in clock ticks (utime + stime).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Busy and total ticks of CPU 0 and CPU 1: "busy0 total0 busy1 total1".
cpus() { awk '/^cpu[01] /{t=0; for (i=2;i<=NF;i++) t+=$i; printf "%d %d ", t-$5-$6, t}' /proc/stat; }

# One wrk run on PORT with CONNECTIONS: prints "<requests/s> <non-2xx> <requests>".
run_wrk() {
    "${ON_CLIENT[@]}" wrk -t1 -c "$2" -d "${DURATION}s" \
        -H "Host: $HOST" -H "X-Nthpool-Key: $KEY" "http://127.0.0.1:$1/v1/chat/completions" >"$WORK/wrk.out" 2>&1 || true
    python3 - "$WORK/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rps = re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
n = re.search(r"(\d+) requests in", text).group(1)
print(rps, bad.group(1) if bad else 0, n)
PY
}

# One nthpool-bench run on PORT with its FLAGS: prints "<p50 µs> <p99 µs>
# <requests/s> <answers that were not 2xx, and errors>".
run_bench() {
    local port=$1
    shift
    "${ON_CLIENT[@]}" "$BIN/nthpool-bench" --addr "127.0.0.1:$port" --key "$KEY" --get /v1/chat/completions \
        --json "$@" >"$WORK/bench.out" 2>"$WORK/bench.err" || true
    python3 - "$WORK/bench.out" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    e = j["endpoints"]["get"]
    bad = sum(n for code, n in e["statuses"].items() if not code.startswith("2")) + sum(e["errors"].values())
    print(e["p50Us"], e["p99Us"], f'{j["requestsPerSec"]:.0f}', bad + j["connectErrors"])
except (OSError, ValueError, KeyError):
    print("0 0 0 1")
PY
}

port_of() {
    case $1 in
        direct) echo "$UP_PORT" ;;
        nthpool) echo "$PORT" ;;
        nginx) echo "$NGINX_PORT" ;;
        haproxy) echo "$HAPROXY_PORT" ;;
    esac
}
NAMES=(direct nthpool nginx haproxy)
# The names in round R's order: rotated by R, so no proxy always runs first.
order() {
    local i
    for i in 0 1 2 3; do
        echo "${NAMES[$((($1 + i) % 4))]}"
    done
}

# two NAME: the two-CPU runs of one proxy, one line of the results file:
# "two ROUND NAME <wrk> <ticks> <cpus before> <cpus after> <c1> <open>".
two() {
    local pid_var=PID_$1 port t0 c0 many t1 c1 one open
    port=$(port_of "$1")
    t0=$(ticks "${!pid_var}")
    c0=$(cpus)
    many=$(run_wrk "$port" "$CONNS")
    t1=$(ticks "${!pid_var}")
    c1=$(cpus)
    one=$(run_bench "$port" -c 1 -d 1 --warmup 0.2)
    open=$(run_bench "$port" -c "$OPEN_CONNS" --rate "$RATE" -d 2 --warmup 0.3)
    echo "two $round $1 $many $((t1 - t0)) $c0 $c1 $one $open"
}

# one NAME: the one-CPU run of one proxy: "one ROUND NAME <c1>".
one() {
    echo "one $round $1 $(run_bench "$(port_of "$1")" -c 1 -d 1.5 --warmup 0.3)"
}

say "proxy benchmark: $ROUNDS rounds × (direct, nthpool, nginx, haproxy), in turn, on two CPUs then on one;"
say "  two CPUs: every proxy on CPU 0, the clients and the upstream (nginx return 200) on CPU 1;"
say "  wrk -t1 -c$CONNS ${DURATION}s, nthpool-bench -c1 1 s, nthpool-bench --rate $RATE -c$OPEN_CONNS 2 s;"
say "  load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
# rounds RUN: every round of RUN (two or one), each proxy in the round's turn.
rounds() {
    for round in $(seq 1 "$ROUNDS"); do
        for name in $(order "$round"); do
            line=$("$1" "$name")
            echo "$line" >>"$WORK/results"
            say "  $line"
        done
    done
}

: >"$WORK/results"
rounds two
say "  one CPU: the proxies moved to CPU 1, with the client and the upstream; nthpool-bench -c1 1.5 s"
for pid in "$PID_nginx" "$PID_haproxy" "$PID_nthpool"; do
    taskset -a -p -c 1 "$pid" >/dev/null
done
rounds one

# System calls per exchange (one CPU, one connection, a fixed number of requests).
if perf stat -e 'syscalls:sys_enter_epoll_wait' true >/dev/null 2>&1; then
    for name in nthpool nginx haproxy; do
        pid_var=PID_$name
        perf stat -x, -e 'syscalls:sys_enter_*' -p "${!pid_var}" -o "$WORK/perf.out" &
        perf_pid=$!
        sleep 0.5
        say "  syscalls $name: $(run_bench "$(port_of "$name")" -c 1 -n "$SYSCALL_REQUESTS" -d 60)"
        sleep 0.2
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        awk -F, -v name="$name" '$1 ~ /^[0-9]+$/ && $1 > 0 { sub("syscalls:sys_enter_", "", $3); printf "syscalls %s %s %d\n", name, $3, $1 }' \
            "$WORK/perf.out" >>"$WORK/results"
    done
else
    say "  (perf cannot read the syscall tracepoints here: no system-call counts)"
fi

python3 - "$WORK/results" "$(getconf CLK_TCK)" "$SYSCALL_REQUESTS" <<'PY'
import statistics, sys
hz, n_sys = int(sys.argv[2]), int(sys.argv[3])
two, one, calls = {}, {}, {}
for l in open(sys.argv[1]):
    f = l.split()
    if f[0] == "two":
        rnd, name = int(f[1]), f[2]
        rps, bad, n, ticks = float(f[3]), int(f[4]), int(f[5]), int(f[6])
        b0, t0, b1, t1, b0e, t0e, b1e, t1e = map(int, f[7:15])
        p50_1, rps_1, bad_1 = float(f[15]), float(f[17]), int(f[18])
        p50_o, p99_o, bad_o = float(f[19]), float(f[20]), int(f[22])
        cpu0 = (b0e - b0) / max(t0e - t0, 1)
        cpu1 = (b1e - b1) / max(t1e - t1, 1)
        # The measured process's share of one CPU; the direct run's is the upstream's, on CPU 1.
        own = ticks / hz / max(n / rps, 1e-9) if name != "direct" else 0
        two.setdefault(name, {})[rnd] = dict(
            rps=rps, bad=bad + bad_1 + bad_o, p50_1=p50_1, p50_o=p50_o, p99_o=p99_o,
            cpu_us=ticks / hz * 1e6 / max(n, 1), other0=max(cpu0 - own, 0) * 100, cpu1=cpu1 * 100)
    elif f[0] == "one":
        rnd, name = int(f[1]), f[2]
        one.setdefault(name, {})[rnd] = dict(p50=float(f[3]), mean=1e6 / max(float(f[5]), 1), bad=int(f[6]))
    elif f[0] == "syscalls":
        calls.setdefault(f[1], {})[f[2]] = int(f[3])

def spread(xs, fmt="{:.0f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"
def added(runs, key, name):
    return [r[key] - runs["direct"][k][key] for k, r in runs[name].items()]
proxies = ["nthpool", "nginx", "haproxy"]
rounds = len(two["direct"])

print(f"\nTwo CPUs: medians over {rounds} rounds (min–max); added = the proxy's figure minus the same round's direct one")
print(f"  {'':8} {'req/s':>21} {'CPU µs/request':>18} {'others on CPU 0 %':>18} {'CPU 1 busy %':>13}"
      f" {'added p50 µs c=1':>17} {'added p50 µs open':>18} {'p99 µs open':>16} {'non-2xx':>7}")
for name in ["direct"] + proxies:
    rs = list(two[name].values())
    a1 = spread(added(two, "p50_1", name)) if name != "direct" else "-"
    ao = spread(added(two, "p50_o", name)) if name != "direct" else "-"
    print(f"  {name:8} {spread([r['rps'] for r in rs]):>21} {spread([r['cpu_us'] for r in rs], '{:.1f}'):>18}"
          f" {spread([r['other0'] for r in rs]):>18} {spread([r['cpu1'] for r in rs]):>13}"
          f" {a1:>17} {ao:>18} {spread([r['p99_o'] for r in rs]):>16} {sum(r['bad'] for r in rs):>7}")
for other in ["nginx", "haproxy"]:
    per_round = [two["nthpool"][k]["rps"] / two[other][k]["rps"] for k in two["nthpool"]]
    cx = statistics.median(r["cpu_us"] for r in two["nthpool"].values())
    co = statistics.median(r["cpu_us"] for r in two[other].values())
    d1 = [two["nthpool"][k]["p50_1"] - two[other][k]["p50_1"] for k in two["nthpool"]]
    do = [two["nthpool"][k]["p50_o"] - two[other][k]["p50_o"] for k in two["nthpool"]]
    print(f"  nthpool/{other}: req/s {spread(per_round, '{:.2f}')} round by round; CPU per request {cx / co:.2f};"
          f" p50 nthpool minus {other}, same round: c=1 {spread(d1)} µs, open {spread(do)} µs")

print(f"\nOne CPU (client, proxy and upstream on CPU 1), one connection: medians over {rounds} rounds (min–max)")
print(f"  {'':8} {'p50 µs':>14} {'added p50 µs':>14} {'mean µs':>20} {'added mean µs':>20} {'non-2xx':>7}")
for name in ["direct"] + proxies:
    rs = list(one[name].values())
    ap = spread(added(one, "p50", name)) if name != "direct" else "-"
    am = spread(added(one, "mean", name), "{:.1f}") if name != "direct" else "-"
    print(f"  {name:8} {spread([r['p50'] for r in rs]):>14} {ap:>14} {spread([r['mean'] for r in rs], '{:.1f}'):>20}"
          f" {am:>20} {sum(r['bad'] for r in rs):>7}")
for other in ["nginx", "haproxy"]:
    dp = [one["nthpool"][k]["p50"] - one[other][k]["p50"] for k in one["nthpool"]]
    dm = [one["nthpool"][k]["mean"] - one[other][k]["mean"] for k in one["nthpool"]]
    at_or_under = sum(d <= 0 for d in dp)
    print(f"  nthpool minus {other}, same round: p50 {spread(dp)} µs ({at_or_under} of {len(dp)} rounds ≤ 0),"
          f" mean {spread(dm, '{:+.1f}')} µs")

if calls:
    print(f"\nSystem calls per exchange (perf stat, {n_sys} one-connection requests, one CPU)")
    for name in proxies:
        c = calls.get(name, {})
        per = {k: v / n_sys for k, v in c.items() if v / n_sys >= 0.01}
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"  {name:8} {sum(per.values()):5.2f}: {parts}")
PY
