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
# Usage: scripts/proxy-bench.sh            (3 rounds, runs of 10 s, 50 connections)
# Environment: BENCH_ROUNDS, BENCH_DURATION (s), BENCH_CONNECTIONS, BENCH_PORT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${BENCH_ROUNDS:-3}
DURATION=${BENCH_DURATION:-10}
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

mkdir -p "$WORK/nginx-tmp" "$WORK/up" "$WORK/front"
nginx_common() {
    cat <<NGINX
worker_processes 1;
daemon off;
master_process off;
error_log $1/error.log warn;
pid $1/nginx.pid;
events { worker_connections 4096; }
NGINX
}
BODY='{"id":"cmpl-1","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"ok"}}]}'
{
    nginx_common "$WORK/up"
    cat <<NGINX
http {
    access_log off;
    default_type application/json;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    client_body_temp_path $WORK/nginx-tmp/ub;
    proxy_temp_path $WORK/nginx-tmp/up;
    fastcgi_temp_path $WORK/nginx-tmp/uf;
    uwsgi_temp_path $WORK/nginx-tmp/uu;
    scgi_temp_path $WORK/nginx-tmp/us;
    server {
        listen 127.0.0.1:$UP_PORT;
        location / { return 200 '$BODY'; }
    }
}
NGINX
} >"$WORK/upstream.conf"
{
    nginx_common "$WORK/front"
    cat <<NGINX
http {
    access_log off;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    client_body_temp_path $WORK/nginx-tmp/fb;
    proxy_temp_path $WORK/nginx-tmp/fp;
    fastcgi_temp_path $WORK/nginx-tmp/ff;
    uwsgi_temp_path $WORK/nginx-tmp/fu;
    scgi_temp_path $WORK/nginx-tmp/fs;
    upstream up {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering on;
        }
    }
}
NGINX
} >"$WORK/front.conf"
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
wait_port "$UP_PORT" "$!" 50 || die "the upstream nginx did not start"
"${ON_PROXY[@]}" nginx -c "$WORK/front.conf" &
PIDS+=($!)
wait_port "$NGINX_PORT" "$!" 50 || die "nginx proxy_pass did not start"
"${ON_PROXY[@]}" haproxy -f "$WORK/haproxy.cfg" -db &
PIDS+=($!)
wait_port "$HAPROXY_PORT" "$!" 50 || die "HAProxy did not start"
(cd "$WORK" && RUST_LOG=warn exec "${ON_PROXY[@]}" "$BIN/nthpool" --config "$WORK/nthpool.json" >/dev/null) &
PIDS+=($!)
wait_port "$PORT" "$!" 50 || die "nthpool did not start"

# One wrk run on PORT with CONNECTIONS: prints "<requests/s> <p50 µs> <p99 µs> <non-2xx>".
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
print(rps, f"{p50:.0f}", f"{p99:.0f}", bad.group(1) if bad else 0)
PY
}

say "proxy benchmark: $ROUNDS rounds × (direct, nthpool, nginx, haproxy), ${DURATION}s each, wrk -t1 -c$CONNS, $PINNING;"
say "  the upstream (nginx return 200) shares CPU 1 with wrk; every proxy runs on CPU 0"
: >"$WORK/results"
for round in $(seq 1 "$ROUNDS"); do
    for target in direct:$UP_PORT nthpool:$PORT nginx:$NGINX_PORT haproxy:$HAPROXY_PORT; do
        name=${target%%:*}
        result=$(run_wrk "${target##*:}" "$CONNS")
        one=$(run_wrk "${target##*:}" 1)
        say "  round $round $(printf '%-8s' "$name") c$CONNS req/s p50µs p99µs non2xx: $result | c1: $one"
        echo "$round $name $result $one" >>"$WORK/results"
    done
done
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for rnd, name, rps, p50, p99, bad, rps1, p50_1, p99_1, bad1 in rows:
    by.setdefault(name, []).append((int(rnd), float(rps), float(p50), float(p99), int(bad) + int(bad1), float(p50_1)))
direct = {r[0]: r[5] for r in by["direct"]}
print("\nmedians over rounds (added p50 = one-connection p50 minus the same round's direct one-connection p50):")
print(f"  {'':8} {'req/s':>9} {'p50 µs':>8} {'p99 µs':>8} {'c1 p50 µs':>10} {'added p50 µs':>13} {'non-2xx':>8}")
for name in ["direct", "nthpool", "nginx", "haproxy"]:
    rs = by[name]
    rps = statistics.median(r[1] for r in rs)
    p50 = statistics.median(r[2] for r in rs)
    p99 = statistics.median(r[3] for r in rs)
    c1 = statistics.median(r[5] for r in rs)
    added = statistics.median(r[5] - direct[r[0]] for r in rs)
    bad = sum(r[4] for r in rs)
    print(f"  {name:8} {rps:9.0f} {p50:8.0f} {p99:8.0f} {c1:10.0f} {added if name != 'direct' else 0:13.0f} {bad:8}")
x = statistics.median(r[1] for r in by["nthpool"])
for other in ["nginx", "haproxy"]:
    o = statistics.median(r[1] for r in by[other])
    print(f"  req/s nthpool/{other}: {x / o:.3f}")
PY
