#!/usr/bin/env bash
# User-space instructions per request, counted by valgrind's callgrind.
#
#   scripts/callgrind.sh
#
# Instruction counts do not depend on what else the machine is doing, so
# unlike requests per second they can be compared across runs and machines.
# The release server runs under `valgrind --tool=callgrind` with one pool
# `bench` (concurrency 1,000,000); nthpool-bench drives acquire -> release
# cycles with its access log on, over 1 and over 50 keep-alive connections to
# 127.0.0.1, first for N1 requests, then for N2.
# The counters are zeroed before the first run and dumped after each, so
#     (Ir2 - Ir1) / (requests2 - requests1)
# is the cost of one more request, with start-up, connection set-up and
# tear-down cancelled out. Variants:
#   - nthpool, empty
#   - nthpool, empty, varying header (CG_VARY=1): the same cycles with
#     `nthpool-bench --vary-header`, whose every request carries an
#     `X-Request-Id` of its own (a counter, as a trace id would change), so no
#     header block repeats byte for byte (the server's per-connection memo
#     learns where the value lies); then, on another fresh server, releases
#     without a report (`--no-report`), whose header block is the acquire's;
#     each measured like the empty runs, over 1 and 50 connections; then one
#     connection paced at 500 requests/s (`--rate 500`, a request every 2 ms,
#     as a sidecar's calls come), 1000 then 3000 requests: what the loop does
#     between requests (its wake-ups, the clock, the once-a-second work)
#     counts with them
#   - nthpool, empty, with wrk as the client (installed with apt-get if
#     missing): `wrk -t1 -s scripts/wrk-cycle.lua`, the Lua acquire -> release
#     cycles of scripts/bench.sh, over 1 and 50 connections, a 3 s run then a
#     9 s one, so no figure rests on the project's own load tool
#   - nthpool with 1,000,000 slots held on another pool, filled with
#     `nthpool-bench --fill` before the measured runs (instrumentation is off
#     during the fill, so it is not counted at all; the subtraction removes
#     what is left of it)
#   - nginx answering `return 200` with a real grant body, access log off
#     (installed with apt-get if missing and run as root): `valgrind --tool=callgrind --trace-children=yes nginx -g
#     'daemon off; master_process off;'`
# Kernel work (epoll, socket reads and writes) is not counted: callgrind sees
# user space only. Takes about two minutes (CG_VARY=1: two minutes more).
# Environment: CG_N1 (20000), CG_N2 (120000), CG_FILL (1000000), CG_PORT (27170),
# CG_NGINX_PORT (27180), CG_QUICK (1: the empty-pool runs only, no fill, no
# nginx; with CG_VARY=1 the varying-header runs too), CG_VARY (0; 1: also the
# varying-header and no-report runs, after the empty ones), CG_KEEP (a directory: the
# callgrind out files are copied there, for callgrind_annotate), CG_SERVER (the
# path of another nthpool binary to measure, for an A/B: an older build, say;
# the load tool is still the one built here), CARGO_TARGET_DIR.
set -euo pipefail

case "${1:-}" in
    "") ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "callgrind.sh: unknown argument $1 (try --help)" >&2
        exit 2
        ;;
esac

cd "$(dirname "$0")/.."
ROOT=$(pwd)
N1=${CG_N1:-20000}
N2=${CG_N2:-120000}
FILL=${CG_FILL:-1000000}
VARY=${CG_VARY:-0}
case "$VARY" in
    0 | 1) ;;
    *)
        echo "callgrind.sh: CG_VARY must be 0 or 1, not $VARY" >&2
        exit 2
        ;;
esac
# The two client shapes: one sequential keep-alive client, and 50 connections.
SHAPES=(1 50)
KEY=nthpool-bench-key
PORT=${CG_PORT:-27170}
NGINX_PORT=${CG_NGINX_PORT:-27180}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$CARGO_TARGET_DIR/release
# The server measured: the one built here, or another build for an A/B.
SERVER_BIN=${CG_SERVER:-$BIN/nthpool}

command -v valgrind >/dev/null || {
    echo "callgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
}

SCRIPT=callgrind.sh
WORK_PREFIX=nthpool-callgrind
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

say "building release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)..."
cargo build --release --quiet -p nthpool -p nthpool-bench || die "build failed"

cat >"$WORK/nthpool.json" <<JSON
{
  "listen": "127.0.0.1:$PORT",
  "adminListen": null,
  "accessLog": "$WORK/access.log",
  "maxConnections": 100000,
  "pools": {
    "bench": { "keys": ["$KEY"], "concurrency": 1000000, "adaptive": false },
    "full": { "keys": ["$KEY"], "concurrency": 1000000, "adaptive": false, "termMs": 3600000, "renewIntervalMs": 1000000,
              "requestTimeoutMs": 3600000 }
  }
}
JSON

# The newest dump file of a callgrind run whose files start with $1.
newest_dump() {
    find "$(dirname "$1")" -maxdepth 1 -name "$(basename "$1").*" -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-
}
# The instruction total of a dump file (its `summary:` line).
dump_ir() { awk '/^summary:/ { print $2 }' "$1"; }
requests_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$1"; }

# Measures one server already running under callgrind (pid $2, out files $3)
# over two runs of a client: `$4 NAME RUN ARGS...` (RUN 1, then 2) runs the
# client and prints how many requests it made; prints "Ir1 req1 Ir2 req2".
measure_with() {
    local name=$1 pid=$2 out=$3 client=$4 i ir=() req=()
    shift 4
    callgrind_control -i on "$pid" >/dev/null 2>&1
    callgrind_control -z "$pid" >/dev/null 2>&1
    for i in 1 2; do
        req+=("$("$client" "$name" "$i" "$@")") || exit 1
        # Let the server finish closing this run's connections inside the
        # same counting period, so both periods hold one set-up and tear-down.
        sleep 1
        callgrind_control -d "$name-$i" "$pid" >/dev/null 2>&1
        sleep 0.2
        ir+=("$(dump_ir "$(newest_dump "$out")")")
    done
    echo "${ir[0]} ${req[0]} ${ir[1]} ${req[1]}"
}

# The load tool's run $2 ($N1 requests, then $N2), with the arguments that follow.
load_tool_run() {
    local name=$1 i=$2 n=$N1
    shift 2
    [ "$i" = 2 ] && n=$N2
    "${ON_CLIENT[@]}" "$BIN/nthpool-bench" --json -n "$n" -d 600 "$@" \
        >"$WORK/$name-$i.json" 2>"$WORK/$name-$i.err" || die "$name run $i failed: $(cat "$WORK/$name-$i.err")"
    requests_of "$WORK/$name-$i.json"
}

# wrk's run $2 with scripts/wrk-cycle.lua over $3 connections: 3 s, then 9 s.
wrk_run() {
    local name=$1 i=$2 c=$3 d=3
    [ "$i" = 2 ] && d=9
    "${ON_CLIENT[@]}" wrk -t1 -c "$c" -d "${d}s" -s "$ROOT/scripts/wrk-cycle.lua" "http://127.0.0.1:$PORT" \
        -- "$KEY" >"$WORK/$name-$i.txt" 2>&1 || die "$name run $i failed: $(tail -n 2 "$WORK/$name-$i.txt")"
    ! grep -q 'Non-2xx' "$WORK/$name-$i.txt" || die "$name run $i: $(grep 'Non-2xx' "$WORK/$name-$i.txt")"
    awk '/requests in/ { print $1 }' "$WORK/$name-$i.txt"
}

measure() { measure_with "$1" "$2" "$3" load_tool_run "${@:4}"; }

start_nthpool() {
    local name=$1
    check_free "$PORT"
    # Without its slot secret, state file and lock each server is a first start: no
    # re-adoption window (a state file, or the lock's lease terms, beside a new secret would open one).
    rm -f "$WORK/nthpool.secret" "$WORK/nthpool.state" "$WORK/nthpool.state.refused" "$WORK/nthpool.state.lock"
    # Instrumentation starts off: nothing before `callgrind_control -i on` is
    # counted, and an uninstrumented fill runs several times faster.
    env RUST_LOG=warn "${ON_SERVER[@]}" valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$WORK/$name.out" "$SERVER_BIN" --config "$WORK/nthpool.json" \
        >"$WORK/$name.log" 2>&1 &
    SERVER=$!
    PIDS+=("$SERVER")
    wait_port "$PORT" "$SERVER" 600 || die "nthpool under valgrind did not start: $(tail "$WORK/$name.log")"
}

stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

RESULTS=()
record() {
    local label=$1 ir1 req1 ir2 req2
    read -r ir1 req1 ir2 req2 <<<"$2"
    [ -n "$req2" ] || die "$label: no measurement (see the messages above)"
    RESULTS+=("$(python3 -c '
import sys
label, ir1, req1, ir2, req2 = sys.argv[1], *map(int, sys.argv[2:])
per = (ir2 - ir1) / (req2 - req1)
print(f"{label:<52} {req1:>9} {ir1:>13} {req2:>9} {ir2:>13} {per:>12.0f}")
' "$label" "$ir1" "$req1" "$ir2" "$req2")")
}

# The 12 functions of dump file $1 with the most own instructions (callgrind_annotate),
# for whoever wants to look further.
top_functions() {
    callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null |
        awk '/file:function/ { getline; listing = 1; next } listing && NF { print; if (++n == 12) exit }' |
        sed 's|[^ ]*/registry/src/[^/]*/||; s| \[.*\]$||' || true
}

say "nthpool, empty, access log on: $N1 then $N2 requests under callgrind, ${SHAPES[*]} connections..."
start_nthpool empty
for c in "${SHAPES[@]}"; do
    record "nthpool acquire/release, empty, c=$c" "$(measure "empty$c" "$SERVER" "$WORK/empty.out" \
        --addr "127.0.0.1:$PORT" --key "$KEY" --pool bench -c "$c")"
done
# A real grant body, for nginx to serve as a file of the same size.
python3 - "$PORT" "$KEY" "$WORK/grant.json" <<'PY' || true
import http.client, sys
port, key, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request("POST", "/pools/bench/lock/acquire", headers={"X-Nthpool-Key": key, "Content-Length": "0"})
open(out, "wb").write(c.getresponse().read())
PY
# The hot functions of the second run.
TOP=$(top_functions "$(newest_dump "$WORK/empty.out")")
stop "$SERVER"
keep() { [ -z "${CG_KEEP:-}" ] || { mkdir -p "$CG_KEEP" && cp "$WORK"/"$1".out.* "$CG_KEEP"/; }; }
keep empty

# One client variant on a fresh server ($1 names its files, $2 its rows),
# both shapes, with the load-tool arguments that follow.
variant() {
    local name=$1 label=$2 c
    shift 2
    start_nthpool "$name"
    for c in "${SHAPES[@]}"; do
        record "nthpool acquire/release, empty, $label, c=$c" "$(measure "$name$c" "$SERVER" \
            "$WORK/$name.out" --addr "127.0.0.1:$PORT" --key "$KEY" --pool bench -c "$c" "$@")"
    done
}

if [ "$VARY" = 1 ]; then
    say "nthpool, empty, X-Request-Id new on every request: $N1 then $N2 requests, ${SHAPES[*]} connections..."
    variant vary "varying header" --vary-header
    TOP_VARY=$(top_functions "$(newest_dump "$WORK/vary.out")")
    stop "$SERVER"
    keep vary
    say "nthpool, empty, releases without a report: $N1 then $N2 requests, ${SHAPES[*]} connections..."
    variant bare "no report" --no-report
    stop "$SERVER"
    keep bare
    say "nthpool, empty, one connection paced at 500 requests/s: 1000 then 3000 requests..."
    start_nthpool paced
    record "nthpool acquire/release, empty, paced 2 ms, c=1" "$(N1=1000 N2=3000 measure paced1 "$SERVER" \
        "$WORK/paced.out" --addr "127.0.0.1:$PORT" --key "$KEY" --pool bench -c 1 --rate 500)"
    stop "$SERVER"
    keep paced
fi

if [ "${CG_QUICK:-0}" != 1 ] && ! command -v wrk >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing wrk (apt-get)..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null 2>&1 || true
fi
if [ "${CG_QUICK:-0}" != 1 ] && command -v wrk >/dev/null; then
    say "nthpool, empty, wrk and its Lua acquire -> release script: 3 s then 9 s, ${SHAPES[*]} connections..."
    start_nthpool wrk
    for c in "${SHAPES[@]}"; do
        record "nthpool acquire/release, empty, wrk client, c=$c" "$(measure_with "wrk$c" "$SERVER" "$WORK/wrk.out" wrk_run "$c")"
    done
    stop "$SERVER"
    keep wrk
fi

if [ "${CG_QUICK:-0}" != 1 ]; then
    say "nthpool with $FILL slots held: filling (not counted), then $N1 and $N2 requests..."
    start_nthpool full
    "${ON_CLIENT[@]}" "$BIN/nthpool-bench" --addr "127.0.0.1:$PORT" --key "$KEY" --pool full --fill "$FILL" -c 64 \
        -d 240 >"$WORK/fill.txt" 2>&1 || die "fill failed: $(cat "$WORK/fill.txt")"
    FILLED=$(sed -n 's/^ *\([0-9]*\) granted in \([0-9.]*\) s.*/\1 slots in \2 s/p' "$WORK/fill.txt")
    record "nthpool acquire/release, $FILL held, c=50" "$(measure full "$SERVER" "$WORK/full.out" \
        --addr "127.0.0.1:$PORT" --key "$KEY" --pool bench -c 50)"
    stop "$SERVER"
    keep full
fi

NGINX_NOTE="nginx is not installed: no comparison (apt-get install nginx, or scripts/bench.sh --compare)"
[ "${CG_QUICK:-0}" = 1 ] && NGINX_NOTE="CG_QUICK=1: no fill, no nginx"
if [ "${CG_QUICK:-0}" != 1 ] && ! command -v nginx >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing nginx (apt-get)..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null 2>&1 ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null 2>&1 || true
fi
if [ "${CG_QUICK:-0}" != 1 ] && command -v nginx >/dev/null; then
    say "nginx: $N1 then $N2 GET /grant.json (return 200) under callgrind, ${SHAPES[*]} connections..."
    mkdir -p "$WORK/www" "$WORK/nginx-tmp"
    [ -s "$WORK/grant.json" ] || die "could not fetch a grant body from nthpool"
    cp "$WORK/grant.json" "$WORK/www/grant.json"
    cat >"$WORK/nginx.conf" <<NGINX
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
NGINX
    nginx_http_block "$NGINX_PORT" >>"$WORK/nginx.conf"
    check_free "$NGINX_PORT"
    "${ON_SERVER[@]}" valgrind --tool=callgrind --trace-children=yes --instr-atstart=no \
        --callgrind-out-file="$WORK/nginx.out" nginx -e "$WORK/nginx-error.log" -p "$WORK" -c "$WORK/nginx.conf" \
        -g 'daemon off; master_process off;' >"$WORK/nginx.log" 2>&1 &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    wait_port "$NGINX_PORT" "$NGINX_PID" 600 || die "nginx under valgrind did not start: $(tail "$WORK/nginx.log")"
    for c in "${SHAPES[@]}"; do
        record "nginx return 200, c=$c" "$(measure "nginx$c" "$NGINX_PID" "$WORK/nginx.out" \
            --addr "127.0.0.1:$NGINX_PORT" --get /grant.json -c "$c")"
    done
    stop "$NGINX_PID"
    keep nginx
    NGINX_NOTE="nginx: $(nginx -v 2>&1 | sed 's/.*: //'), one process, return 200 with a body of $(wc -c <"$WORK/www/grant.json") bytes"
fi

say ""
say "====== user-space instructions per request (callgrind Ir), access log on, 127.0.0.1 ======"
say "  $(git rev-parse --short HEAD 2>/dev/null || echo '?')${CG_SERVER:+ (server: $CG_SERVER)}; $(valgrind --version); $NGINX_NOTE"
say "  an nthpool request is one acquire or one release (a cycle is two); the fill: ${FILLED:-?}"
printf '%-52s %9s %13s %9s %13s %12s\n' "server" "requests1" "Ir1" "requests2" "Ir2" "Ir/request"
for r in "${RESULTS[@]}"; do
    say "$r"
done
say "  Ir/request = (Ir2 - Ir1) / (requests2 - requests1)"
if [ -n "${TOP:-}" ]; then
    say ""
    say "nthpool, empty, second run: functions by own instructions (callgrind_annotate)"
    say "$TOP"
fi
if [ -n "${TOP_VARY:-}" ]; then
    say ""
    say "nthpool, empty, varying header, second run: functions by own instructions (callgrind_annotate)"
    say "$TOP_VARY"
fi
