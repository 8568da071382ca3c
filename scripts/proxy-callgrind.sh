#!/usr/bin/env bash
# User-space instructions per proxied request: nthpool in proxy mode and nginx
# `proxy_pass` (upstream keepalive), each run under `valgrind --tool=callgrind`
# in front of the same upstream (nginx `return 200`, not under valgrind),
# driven by one sequential keep-alive client for N1 and then N2 requests;
# (Ir2 - Ir1) / (N2 - N1) cancels start-up and shutdown.
#
# Usage: scripts/proxy-callgrind.sh        Environment: CG_N1, CG_N2, CG_PORT, CARGO_TARGET_DIR.
set -euo pipefail

for arg in "$@"; do
    case "$arg" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "proxy-callgrind.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N1=${CG_N1:-2000}
N2=${CG_N2:-12000}
PORT=${CG_PORT:-29070}
UP_PORT=$((PORT + 1))
NGINX_PORT=$((PORT + 2))
KEY=nthpool-proxy-cg-key
HOST=bench.proxy.local
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$CARGO_TARGET_DIR/release

SCRIPT=proxy-callgrind.sh
WORK_PREFIX=nthpool-proxy-cg
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

for tool in nginx valgrind python3; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
for p in "$PORT" "$UP_PORT" "$NGINX_PORT"; do
    check_free "$p"
done
cargo build --release --quiet -p nthpool || die "build failed"
nginx_proxy_confs "$UP_PORT" "$NGINX_PORT" '{"id":"cmpl-1","object":"chat.completion"}'
cat >"$WORK/nthpool.json" <<JSON
{ "listen": "127.0.0.1:$PORT", "adminListen": null, "accessLog": null,
  "pools": { "bench": { "keys": ["$KEY"], "concurrency": 10000, "adaptive": false,
    "upstream": { "url": "http://127.0.0.1:$UP_PORT", "hosts": ["$HOST"] } } } }
JSON
cat >"$WORK/client.py" <<'PY'
"""N sequential GETs on one keep-alive connection; checks every answer is a 200."""
import socket, sys
port, n, host, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port))
req = f"GET /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {key}\r\n\r\n".encode()
buf = b""
for _ in range(n):
    s.sendall(req)
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0])
    while len(buf) < length:
        buf += s.recv(65536)
    buf = buf[length:]
PY

nginx -c "$WORK/upstream.conf" &
PIDS+=($!)
wait_port "$UP_PORT" "$!" 50 || die "the upstream did not start"

# measure NAME PORT N CMD...: the Ir total of CMD serving N requests.
measure() {
    local name=$1 port=$2 n=$3
    shift 3
    valgrind --tool=callgrind --callgrind-out-file="$WORK/$name-$n.out" "$@" >/dev/null 2>"$WORK/$name-$n.err" &
    local pid=$!
    wait_port "$port" "$pid" 600 || die "$name did not start under valgrind"
    python3 "$WORK/client.py" "$port" "$n" "$HOST" "$KEY"
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    grep -E '^(summary|totals):' "$WORK/$name-$n.out" | head -n 1 | awk '{print $2}'
}

say "instructions per proxied request (callgrind, user space), one keep-alive client, N = $N1 and $N2"
for name in nthpool nginx; do
    if [ "$name" = nthpool ]; then
        # Each start a first start: no slot secret, state file or lock left, so no
        # re-adoption window.
        rm -f "$WORK/nthpool.secret" "$WORK/nthpool.state" "$WORK/nthpool.state.refused" "$WORK/nthpool.state.lock"
        a=$(measure nthpool "$PORT" "$N1" "$BIN/nthpool" --config "$WORK/nthpool.json")
        rm -f "$WORK/nthpool.secret" "$WORK/nthpool.state" "$WORK/nthpool.state.refused" "$WORK/nthpool.state.lock"
        b=$(measure nthpool "$PORT" "$N2" "$BIN/nthpool" --config "$WORK/nthpool.json")
    else
        a=$(measure nginx "$NGINX_PORT" "$N1" nginx -c "$WORK/front.conf")
        b=$(measure nginx "$NGINX_PORT" "$N2" nginx -c "$WORK/front.conf")
    fi
    say "  $(printf '%-8s' "$name") Ir($N1) = $a, Ir($N2) = $b, per request: $(((b - a) / (N2 - N1)))"
done
