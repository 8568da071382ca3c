#!/usr/bin/env bash
# Runs nthpool as several instances behind one HAProxy, pools sharded by a
# consistent hash (SPEC §14), on this machine's loopback.
#
#   scripts/cluster.sh [--instances N] [--config FILE] [--dir DIR] [--port PORT]
#   scripts/cluster.sh --restart NAME [--dir DIR]        start instance NAME (n1…) again
#                                                        (the binary the cluster started with)
#   scripts/cluster.sh --stop [--dir DIR]                stop everything it started
#   scripts/cluster.sh --print-haproxy [options]         print the HAProxy configuration
#   scripts/cluster.sh --print-hosts-map --config FILE   print hosts.map for FILE
#   scripts/cluster.sh --bench [--duration S]            throughput of 1, 2, 3 instances
#
# Starts N instances (default 3) named n1…nN that share one slot secret
# (DIR/nthpool.secret, 32 random bytes, created when missing), then HAProxy
# (Debian's package, installed with apt-get when missing) on PORT:
#   - the lock API is routed by the pool segment of the path, proxy traffic by
#     its Host (mapped to the pool that names it in `upstream.hosts`, so both
#     kinds of a pool's traffic reach the same instance; DIR/hosts.map, which
#     --print-hosts-map prints, and which must be written again and HAProxy
#     reloaded when a reload of the instances changes `upstream.hosts`);
#   - `balance hash` + `hash-type consistent`, and a stick table that keeps a
#     pool on its instance while it is busy, so a pool moves only when its
#     instance leaves rotation (health check on the instance's /healthz) or
#     after it was idle for the stick expiry;
#   - the first request of a pool whose instance is down carries
#     `X-Nthpool-Moved`, which opens the pool's re-adoption window on the
#     instance it reaches (README: "Running more than one instance").
# Ports: HAProxy PORT (default 7070), its stats page PORT+1 and its stick
# table's peer PORT+2; instance nI listens on PORT+10+I, its admin listener
# (/healthz, /metrics, dashboard) on PORT+20+I. Logs and pid files are under
# DIR (default /tmp/nthpool-cluster).
#
# FILE is an nthpool configuration without `listen`, `adminListen` and
# `slotSecretFile` (the script sets them per instance, and adds HAProxy's
# address, 127.0.0.2/32, to every pool's `access.trustedProxies`: an instance
# honours `X-Nthpool-Moved` only from a trusted proxy), and without a pool's
# `upstream.listen` (refused: behind HAProxy, proxy traffic is placed by its
# Host, `upstream.hosts`). Each instance runs in DIR/nI: a relative accessLog
# or stateFile is its own, and the files FILE reads (jwksFile, caFile,
# ${file:PATH}) are found from the directory the script is started in, as
# nthpool started there would find them. Without --config a demo
# with pools dept-a … dept-f (key cluster-demo-key) is used, named so that
# HAProxy's hash places two on each of the default three instances.
#
# --bench runs acquire -> release cycles (nthpool-bench, 12 pools, one load
# process of 4 connections each, closed loop, S seconds, default 10) against
# one instance directly, then through HAProxy to 1, 2 and 3 instances (port
# PORT+100, its own directory), and prints requests/s with the CPU time that
# nthpool (all instances) and HAProxy spent per request, from /proc. Nothing
# is pinned: on a machine with fewer cores than processes they share them.
#
# Options: --bin PATH (the nthpool binary; default target/release/nthpool,
# built when missing), --check-ms MS (health-check interval, 1000), --stick-ms
# MS (stick-table expiry: 120000, or more when a pool of FILE needs it). The
# expiry must be longer than any pool's slot or waiter can live without a
# request of the pool reaching HAProxy: termMs + queue.timeoutMs (a waiter,
# then a holder's first renewal), and for a pool with an upstream its longest
# wait (queue.timeoutMs or upstream.waitMs) + requestTimeoutMs (a proxied
# exchange holds its slot without renewing); a shorter --stick-ms is refused.
# The committed deploy/haproxy.cfg is `--print-haproxy` with the defaults.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Where the script was started: relative paths of files FILE names are read
# from here, as nthpool started here with FILE would read them.
START_DIR=$PWD
N=3
CONFIG=
DIR=/tmp/nthpool-cluster
PORT=7070
BIN=
CHECK_MS=1000
# HAProxy connects to the instances from this loopback address, the only one
# the pools trust as a proxy: a local client reaching an instance directly
# comes from 127.0.0.1, so its X-Nthpool-Moved and X-Forwarded-For are ignored.
PROXY_SOURCE=127.0.0.2
STICK_MS=
# The demo pools' termMs (without --config).
DEMO_TERM_MS=10000
ACTION=start
DURATION=10
RESTART=

SCRIPT=cluster.sh
WORK_PREFIX=nthpool-cluster
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

while [ $# -gt 0 ]; do
    case "$1" in
        --instances | --config | --dir | --port | --bin | --check-ms | --stick-ms | --restart | --duration)
            # Not a shell error about `$2`, nor the next option taken for the value.
            case "${2:---}" in --*) die "$1 needs a value (try --help)" ;; esac
            ;;
    esac
    case "$1" in
        --instances) N=$2; shift ;;
        --config) CONFIG=$(realpath -e -- "$2" 2>/dev/null) || die "--config $2: no such file"; shift ;;
        --dir) DIR=$(realpath -m -- "$2"); shift ;;
        --port) PORT=$2; shift ;;
        --bin) BIN=$(realpath -e -- "$2" 2>/dev/null) || die "--bin $2: no such file"; shift ;;
        --check-ms) CHECK_MS=$2; shift ;;
        --stick-ms) STICK_MS=$2; shift ;;
        --restart) ACTION=restart; RESTART=$2; shift ;;
        --stop) ACTION=stop ;;
        --print-haproxy) ACTION=print ;;
        --print-hosts-map) ACTION=print-map ;;
        --bench) ACTION=bench ;;
        --duration) DURATION=$2; shift ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
done
cd "$ROOT"
case "$N" in '' | *[!0-9]* | 0) die "--instances takes a number from 1" ;; esac
[ "$N" -le 9 ] || die "--instances: at most 9 (ports PORT+11 … PORT+19)"
case "$PORT" in '' | *[!0-9]* | 0*) die "--port takes a port number (HAProxy's; the cluster takes it and up to PORT+29)" ;; esac
[ "$PORT" -le $((65535 - 29)) ] || die "--port $PORT: the cluster takes ports up to PORT+29, past 65535"
case "$CHECK_MS" in '' | *[!0-9]* | 0*) die "--check-ms takes milliseconds, at least 1" ;; esac
# HAProxy refuses a timer past 2^31 - 1 ms; say so now, not in its check.
HAPROXY_MAX_MS=2147483647
fits_haproxy() { [ "${#1}" -le 10 ] && [ "$1" -le "$HAPROXY_MAX_MS" ]; }
fits_haproxy "$CHECK_MS" ||
    die "--check-ms $CHECK_MS: HAProxy's timers take at most $HAPROXY_MAX_MS ms (about 24.8 days)"

# The longest a pool's slot or waiter lives without a request of the pool
# (defaults as nthpool's: termMs 30000, queue.timeoutMs 30000, upstream.waitMs
# 30000, requestTimeoutMs 60000), and the pool that needs it: a pool whose
# stick entry expired may move, and must leave nothing alive behind.
STICK_NEED=0
if [ -n "$CONFIG" ]; then
    command -v jq >/dev/null || die "jq is needed to read $CONFIG"
    read -r STICK_NEED STICK_POOL < <(jq -r '[.pools // {} | to_entries[] | .value as $p
        | ($p.queue.timeoutMs // 30000) as $queue
        | {pool: .key, ms: ([($p.termMs // 30000) + $queue]
            + if $p.upstream then [([$queue, ($p.upstream.waitMs // 30000)] | max) + ($p.requestTimeoutMs // 60000)] else [] end
            | max)}]
        | max_by(.ms) // {pool: "-", ms: 0} | "\(.ms) \(.pool)"' "$CONFIG") ||
        die "$CONFIG is not a JSON configuration"
elif [ "$ACTION" = start ]; then
    # The demo's pools (below), all alike: a waiter for the default
    # queue.timeoutMs, then a holder's first renewal within its term.
    STICK_NEED=$((DEMO_TERM_MS + 30000)) STICK_POOL=dept-a
fi
if [ -z "$STICK_MS" ]; then
    STICK_MS=$((STICK_NEED + 1000 > 120000 ? STICK_NEED + 1000 : 120000))
fi
# The longest an instance may take to start answering (a queued acquire's
# wait, a proxied call's wait and upstream.timeoutMs, default 600000): HAProxy's
# `timeout server` must outlast it, or it cuts the request with a 504 of its own.
# A proxied call waits up to queue.timeoutMs, not only upstream.waitMs: its
# X-Nthpool-Queue-Timeout-Ms asks for any wait, clamped to queue.timeoutMs.
SERVER_NEED=0
if [ -n "$CONFIG" ]; then
    SERVER_NEED=$(jq -r '[.pools // {} | to_entries[] | .value as $p
        | ($p.queue.timeoutMs // 30000) as $queue
        | [$queue] + if $p.upstream then [$queue + ($p.upstream.timeoutMs // 600000)] else [] end
        | max] | max // 0' "$CONFIG") || die "$CONFIG is not a JSON configuration"
fi
SERVER_MS=$((SERVER_NEED + 60000 > 660000 ? SERVER_NEED + 60000 : 660000))
case "$STICK_MS" in '' | *[!0-9]*) die "--stick-ms takes milliseconds" ;; esac
fits_haproxy "$STICK_MS" ||
    die "--stick-ms $STICK_MS: HAProxy's timers take at most $HAPROXY_MAX_MS ms (about 24.8 days)"
[ "$STICK_MS" -gt "$STICK_NEED" ] ||
    die "--stick-ms $STICK_MS: pool $STICK_POOL can have a slot or a waiter alive for ${STICK_NEED} ms without a request reaching HAProxy; the stick expiry must be longer, or the pool could move and be granted twice over"

# The HAProxy configuration for N instances, with the map of proxy hosts in
# hosts.map beside it ($DIR/hosts.map; deploy/hosts.map for deploy/haproxy.cfg). Comments explain each choice; deploy/haproxy.cfg is this
# output with the defaults.
haproxy_config() {
    local check_s i moved=""
    cat <<EOF
# nthpool behind HAProxy: pools sharded over $N instances (scripts/cluster.sh).
# Every pool lives on exactly one instance at a time (SPEC §14).
global
    # Two descriptors a connection: within a 20000-descriptor limit.
    maxconn 8000
    # Relative paths (hosts.map) are read beside this file, wherever HAProxy
    # is started from: \`haproxy -c -f deploy/haproxy.cfg\` checks it as shipped.
    default-path config
    # The stick table survives \`haproxy -sf\` reloads through this local peer.
    localpeer local

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    # Longer than the longest wait (queue.timeoutMs) and proxied call's wait
    # and upstream.timeoutMs, read from the configuration: at least 660 s.
    timeout server ${SERVER_MS}ms
    timeout http-keep-alive 60s
    timeout http-request 10s
    # A failed connection is retried on the same instance, never redispatched to
    # another: a pool must not move while its instance still counts as up.
    retries 2
    # HAProxy's own answers in nthpool's shape: JSON with an error code and
    # one sentence, and a Retry-After, as the lock API answers every error:
    # its own failure (500), the instance of a pool unreachable (503),
    # dropping a request (502) or silent past timeout server (504). (A head
    # HAProxy cannot parse is refused by its connection layer, 400/408/422,
    # with its built-in page: HAProxy 2.6 has no setting that replaces it.)
    http-error status 500 content-type application/json hdr Retry-After 1 string '{"error":"internal_error","message":"The proxy in front of the pools failed on this request; retry in a second."}'
    http-error status 502 content-type application/json hdr Retry-After 1 string '{"error":"bad_gateway","message":"The instance serving this pool dropped the request; retry in a second."}'
    http-error status 503 content-type application/json hdr Retry-After 1 string '{"error":"unavailable","message":"No instance can serve this pool right now; retry in a second."}'
    http-error status 504 content-type application/json hdr Retry-After 1 string '{"error":"gateway_timeout","message":"The instance serving this pool did not answer in time; retry in a second."}'

peers cluster
    peer local 127.0.0.1:$((PORT + 2))

frontend api
    bind 127.0.0.1:$PORT
    option forwardfor
    # The pool: the Host of proxy traffic (hosts.map: host -> pool, from each
    # pool's upstream.hosts), else the pool segment of /pools/{pool}/lock/...
    # An absolute-form target's authority takes the place of Host, as in
    # nthpool (RFC 9112 §3.2.2): an HTTP/1.0 request may carry no Host at all.
    # The host is compared as nthpool compares it: without case, port (after a
    # name, an IPv4 address or an IPv6 literal's \`]\`) or one final dot, an IPv6
    # literal kept in its brackets (\`API.example.:443\` is \`api.example\`,
    # \`[FD00::1]:80\` is \`[fd00::1]\`), the form hosts.map holds each name in:
    # a Host that nthpool routes but the map missed would reach any instance.
    # The regex keeps the shortest name that leaves at most one dot and a port.
    http-request set-var(txn.pool) 'req.hdr(host),lower,regsub("^(.+?)\.?(:[0-9]*)?\$","\1"),map(hosts.map)' if !{ url_beg -i http:// https:// }
    http-request set-var(txn.pool) 'url,field(3,/),lower,regsub("^(.+?)\.?(:[0-9]*)?\$","\1"),map(hosts.map)' if { url_beg -i http:// https:// }
    # The pool segment is percent-decoded as nthpool decodes it (\`d%65mo\` is
    # \`demo\`), so both spellings are placed with the one pool.
    http-request set-var(txn.pool) path,field(3,/),url_dec if !{ var(txn.pool) -m found } { path_beg /pools/ }
    # A segment no pool can be named places nothing: the instance it reaches
    # refuses it, and it must neither move nor stick a pool (a decoded NUL,
    # which the stick table's key would end at, must not name the pool
    # before it). \`\\z\`, not \`\$\`, which PCRE lets match before a final newline.
    http-request unset-var(txn.pool) if { var(txn.pool) -m found } !{ var(txn.pool) -m reg '^[a-z0-9-]{1,63}\z' }
    # The pool this request is placed by, for the instance to check against the
    # pool it reaches there (empty when the map named none): a Host that an
    # instance routes to a pool but this map does not (a map older than the
    # instances' configuration) is refused with 421 rather than balanced to an
    # instance that would govern the pool beside its own one. Replaces any copy
    # a client sent.
    http-request set-header X-Nthpool-Pool %[var(txn.pool)]
    # Where the pool was served last; if that instance is down now, this request
    # moves the pool and tells the instance it reaches (clients cannot set it).
    http-request del-header X-Nthpool-Moved
    http-request set-var(txn.owner) var(txn.pool),table_server_id(nthpool)
EOF
    for i in $(seq 1 "$N"); do
        moved+="    http-request set-header X-Nthpool-Moved n$i if { var(txn.owner) -m int $i } !{ srv_is_up(nthpool/n$i) }"$'\n'
    done
    printf '%s' "$moved"
    cat <<EOF
    default_backend nthpool

backend nthpool
    balance hash var(txn.pool)
    hash-type consistent
    # A busy pool stays where it is, even when its hash home comes back: it
    # moves only when its instance is down or after it was idle this long.
    stick-table type string len 253 size 1m expire ${STICK_MS}ms peers cluster
    stick on var(txn.pool)
    http-response set-header X-Nthpool-Instance %[srv_name]
    option httpchk GET /healthz
    http-check expect status 200
EOF
    check_s="inter ${CHECK_MS}ms fall 2 rise 2"
    for i in $(seq 1 "$N"); do
        echo "    server n$i 127.0.0.1:$((PORT + 10 + i)) id $i source $PROXY_SOURCE check port $((PORT + 20 + i)) $check_s on-marked-down shutdown-sessions"
    done
    cat <<EOF

listen stats
    bind 127.0.0.1:$((PORT + 1))
    stats enable
    stats uri /
    stats refresh 2s
EOF
}

# hosts.map: each name of a pool's upstream.hosts in the form HAProxy reads a
# Host in (above): lower case, one final dot dropped, an IPv6 literal in brackets.
hosts_map() {
    jq -r '.pools // {} | to_entries[] | .key as $pool | (.value.upstream.hosts // [])[]
        | "\(ascii_downcase | rtrimstr(".")) \($pool)"' "$1"
}

if [ "$ACTION" = print ]; then
    haproxy_config
    exit 0
fi
if [ "$ACTION" = print-map ]; then
    [ -n "$CONFIG" ] || die "--print-hosts-map needs --config FILE"
    hosts_map "$CONFIG"
    exit 0
fi

# ours FILE MARK: the pid FILE holds, while that process is still the one
# this script started (MARK in its command line). One that died (an instance
# killed with -9) leaves its pid to the system, which may give it to any
# other process: that one is none of ours to stop or to wait for.
ours() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "$2" >/dev/null || return 1
    echo "$pid"
}

# What each process started here has in its command line (after `tr`, every
# argument is followed by a space).
haproxy_mark() { echo "-f $DIR/haproxy.cfg "; }
instance_mark() { echo "--listen 127.0.0.1:$((PORT + 10 + $1)) "; }

stop_pid() {
    local file=$1 pid
    if pid=$(ours "$file" "$2") && kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

if [ "$ACTION" = stop ]; then
    [ ! -f "$DIR/port" ] || PORT=$(cat "$DIR/port")
    stop_pid "$DIR/haproxy.pid" "$(haproxy_mark)"
    for f in "$DIR"/n*/pid; do
        [ -f "$f" ] || continue
        i=${f%/pid}
        stop_pid "$f" "$(instance_mark "${i##*/n}")"
    done
    echo "cluster.sh: stopped (logs kept in $DIR)"
    exit 0
fi

start_instance() {
    local i=${1#n} pid
    local dir=$DIR/n$i
    [ -f "$dir/config.json" ] || die "no instance $1 in $DIR"
    if pid=$(ours "$dir/pid" "$(instance_mark "$i")"); then
        die "instance n$i is running (pid $pid)"
    fi
    local out=0 err=0
    [ ! -f "$dir/stdout.log" ] || out=$(wc -l <"$dir/stdout.log")
    [ ! -f "$dir/stderr.log" ] || err=$(wc -l <"$dir/stderr.log")
    (cd "$dir" && exec "$BIN" --config config.json --listen "127.0.0.1:$((PORT + 10 + i))" \
        >>"$dir/stdout.log" 2>>"$dir/stderr.log" </dev/null) &
    pid=$!
    echo "$pid" >"$dir/pid"
    wait_port "$((PORT + 20 + i))" "$pid" 100 || die "instance n$i did not start: $(tail -n 3 "$dir/stderr.log")"
    # An open port is not a started instance: it may still fail to bind a
    # later listener and exit. It has started once it says it is listening
    # (on standard error when its access log is standard output). Not
    # `grep -q`: with pipefail, the tail it stops early fails the test.
    local tries=0
    until { tail -n +"$((out + 1))" "$dir/stdout.log"; tail -n +"$((err + 1))" "$dir/stderr.log"; } |
        grep '^nthpool listening on' >/dev/null; do
        kill -0 "$pid" 2>/dev/null || die "instance n$i did not start: $(tail -n 3 "$dir/stderr.log")"
        tries=$((tries + 1))
        [ "$tries" -le 100 ] || die "instance n$i did not say it listens within 10 s"
        sleep 0.1
    done
}

# An instance that is not there is said at once, before a binary is built for it.
if [ "$ACTION" = restart ]; then
    [ -f "$DIR/n${RESTART#n}/config.json" ] || die "no instance $RESTART in $DIR"
fi
# A restarted instance runs the binary its cluster started with (DIR/bin),
# not whatever the default build is now.
if [ -z "$BIN" ] && [ "$ACTION" = restart ] && [ -f "$DIR/bin" ]; then
    BIN=$(cat "$DIR/bin")
fi
if [ -z "$BIN" ]; then
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/nthpool
    [ -x "$BIN" ] || cargo build --release --quiet -p nthpool || die "build failed"
fi
[ -x "$BIN" ] || die "no nthpool binary at $BIN"

# cpu_ticks PID…: user + system CPU time of the processes, in clock ticks.
cpu_ticks() {
    local total=0 pid
    for pid in "$@"; do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}

# bench_row LABEL ADDR NTHPOOL_PIDS HAPROXY_PID: one closed-loop run, one row.
bench_row() {
    local label=$1 addr=$2 nthpool_pids=$3 haproxy_pid=$4 out=$DIR/load i
    local n0 h0 n1 h1 requests tick
    mkdir -p "$out"
    rm -f "$out"/*.json
    # shellcheck disable=SC2086 # a list of pids
    n0=$(cpu_ticks $nthpool_pids)
    h0=$([ -n "$haproxy_pid" ] && cpu_ticks "$haproxy_pid" || echo 0)
    for i in $(seq -w 0 11); do
        "$LOAD_TOOL" --addr "$addr" --pool "bench-$i" --key bench-key -c 4 -d "$DURATION" --json >"$out/$i.json" &
    done
    wait
    # shellcheck disable=SC2086
    n1=$(cpu_ticks $nthpool_pids)
    h1=$([ -n "$haproxy_pid" ] && cpu_ticks "$haproxy_pid" || echo 0)
    requests=$(jq -s 'map(.requests) | add' "$out"/*.json)
    tick=$(getconf CLK_TCK)
    awk -v label="$label" -v req="$requests" -v n=$((n1 - n0)) -v h=$((h1 - h0)) -v tick="$tick" \
        -v rps="$(jq -s 'map(.requestsPerSec) | add' "$out"/*.json)" \
        -v bad="$(jq -s '[.[].endpoints[].statuses | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0' "$out"/*.json)" \
        -v proxied="$haproxy_pid" 'BEGIN {
            hs = proxied == "" ? "-" : sprintf("%.1f", h / tick * 1e6 / req)
            printf "%-26s %11.0f %20.1f %20s %9d\n", label, rps, n / tick * 1e6 / req, hs, bad
        }'
}

if [ "$ACTION" = bench ]; then
    LOAD_TOOL=${CARGO_TARGET_DIR:-$ROOT/target}/release/nthpool-bench
    cargo build --release --quiet -p nthpool-bench || die "build failed"
    BENCH_ROOT=$DIR
    mkdir -p "$BENCH_ROOT"
    jq -n '{accessLog: null, pools: ([range(0; 12)] | map({key: ("bench-" + (if . < 10 then "0" else "" end) + tostring),
        value: {keys: ["bench-key"], concurrency: 1000, termMs: 1000, renewIntervalMs: 300}}) | from_entries)}' \
        >"$BENCH_ROOT/pools.json"
    echo "acquire -> release, closed loop, 12 pools x 4 connections, ${DURATION}s each, $(nproc) CPUs, nothing pinned"
    printf '%-26s %11s %20s %20s %9s\n' setup requests/s "nthpool CPU us/req" "HAProxy CPU us/req" non-2xx
    for k in 0 1 2 3; do
        DIR=$BENCH_ROOT/k$k
        "$ROOT/scripts/cluster.sh" --instances "$([ "$k" = 0 ] && echo 1 || echo "$k")" --config "$BENCH_ROOT/pools.json" \
            --dir "$DIR" --port $((PORT + 100)) --bin "$BIN" >/dev/null
        # Every fresh instance answers `recovering` for one term first.
        sleep 1.5
        pids=$(cat "$DIR"/n*/pid | tr '\n' ' ')
        if [ "$k" = 0 ]; then
            bench_row "1 instance, no HAProxy" "127.0.0.1:$((PORT + 111))" "$pids" ""
        else
            bench_row "$k instance(s) via HAProxy" "127.0.0.1:$((PORT + 100))" "$pids" "$(cat "$DIR/haproxy.pid")"
        fi
        "$ROOT/scripts/cluster.sh" --stop --dir "$DIR" >/dev/null
    done
    command -v valgrind >/dev/null || { echo "(valgrind absent: HAProxy's instructions per request not counted)"; exit 0; }
    # HAProxy's own instructions per request, as scripts/callgrind.sh counts
    # nthpool's: HAProxy under callgrind in front of one instance, one pool,
    # 1 connection; (Ir2 - Ir1) / (requests2 - requests1) over two runs.
    DIR=$BENCH_ROOT/callgrind
    CLUSTER_HAPROXY_WRAP="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$DIR/haproxy.cg" \
        "$ROOT/scripts/cluster.sh" --instances 1 --config "$BENCH_ROOT/pools.json" --dir "$DIR" \
        --port $((PORT + 100)) --bin "$BIN" >/dev/null
    sleep 1.5
    hpid=$(cat "$DIR/haproxy.pid")
    callgrind_control -i on "$hpid" >/dev/null 2>&1
    callgrind_control -z "$hpid" >/dev/null 2>&1
    irs=() reqs=()
    for n in 20000 60000; do
        "$LOAD_TOOL" --addr "127.0.0.1:$((PORT + 100))" --pool bench-00 --key bench-key -c 1 -n "$n" -d 600 --json \
            >"$DIR/run-$n.json"
        sleep 1
        callgrind_control -d "run-$n" "$hpid" >/dev/null 2>&1
        sleep 0.5
        dump=$(find "$DIR" -maxdepth 1 -name 'haproxy.cg.*' -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
        irs+=("$(awk '/^summary:/ { print $2 }' "$dump")")
        reqs+=("$(jq .requests "$DIR/run-$n.json")")
    done
    "$ROOT/scripts/cluster.sh" --stop --dir "$DIR" >/dev/null
    echo "HAProxy, user-space instructions per request (callgrind, 1 connection):" \
        "$(((irs[1] - irs[0]) / (reqs[1] - reqs[0])))"
    exit 0
fi

if [ "$ACTION" = restart ]; then
    PORT=$(cat "$DIR/port")
    start_instance "$RESTART"
    echo "cluster.sh: n${RESTART#n} started again"
    exit 0
fi

if ! command -v haproxy >/dev/null; then
    echo "cluster.sh: installing haproxy (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1; } ||
        die "haproxy is not installed and apt-get could not install it"
fi
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
command -v jq >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null 2>&1 ||
    die "jq is not installed and apt-get could not install it"

ours "$DIR/haproxy.pid" "$(haproxy_mark)" >/dev/null &&
    die "a cluster is running in $DIR; scripts/cluster.sh --stop --dir $DIR first"
for p in "$PORT" $((PORT + 1)) $((PORT + 2)) $(seq $((PORT + 11)) $((PORT + 10 + N))) $(seq $((PORT + 21)) $((PORT + 20 + N))); do
    check_free "$p"
done
mkdir -p "$DIR"
echo "$PORT" >"$DIR/port"
echo "$BIN" >"$DIR/bin"
# A start that fails half-way stops what it started.
started=0
trap 'cleanup; [ "$started" = 1 ] || "$ROOT/scripts/cluster.sh" --stop --dir "$DIR" >/dev/null' EXIT

if [ -z "$CONFIG" ]; then
    CONFIG=$DIR/pools.json
    jq -n '{accessLog: null, pools: ([range(0; 6)] | map({key: ("dept-" + ([97 + .] | implode)),
        value: {keys: ["cluster-demo-key"], concurrency: 8, termMs: $term, renewIntervalMs: 3000,
                access: {trustedProxies: [$proxy]}}}) | from_entries)}' --arg proxy "$PROXY_SOURCE/32" \
        --argjson term "$DEMO_TERM_MS" >"$CONFIG"
fi
for field in listen adminListen slotSecretFile; do
    [ "$(jq "has(\"$field\")" "$CONFIG")" = false ] || die "$CONFIG sets $field; the script sets it per instance"
done
# A pool's own proxy listener would be bound by every instance (the second
# one fails), and traffic there would bypass HAProxy's placement.
OWN_LISTENERS=$(jq -r '[.pools // {} | to_entries[] | select(.value.upstream.listen != null) | .key] | join(", ")' "$CONFIG")
[ -z "$OWN_LISTENERS" ] ||
    die "$CONFIG sets upstream.listen for $OWN_LISTENERS: behind HAProxy a pool's proxy traffic is placed by its Host (upstream.hosts); remove the listener"
# A relative stateFile is one per instance (each config is in its own
# directory); an absolute one would be shared, and the second start refused.
[ "$(jq -r '.stateFile // "" | startswith("/")' "$CONFIG")" = false ] ||
    die "$CONFIG sets an absolute stateFile: every instance would share it; use a relative one"

hosts_map "$CONFIG" >"$DIR/hosts.map"

if [ ! -f "$DIR/nthpool.secret" ]; then
    (umask 077 && head -c 32 /dev/urandom >"$DIR/nthpool.secret")
fi
# The stop that ended an earlier run of this cluster ended HAProxy too, and with
# it the table of where failed-over pools live: they go back to their hash home
# now, which may have no record of their holders. An instance starting from its
# own stop snapshot would open no re-adoption window and grant beside them, so
# earlier snapshots are set aside (renamed *.before-start): every instance takes
# the crash path, its window re-adopts the holders of any instance (they share
# the slot secret), and no pool is over-admitted. What the pools learned is lost.
STATE_NAME=$(jq -r 'if has("stateFile") then (.stateFile // "") else "nthpool.state" end' "$CONFIG")
for i in $(seq 1 "$N"); do
    if [ -n "$STATE_NAME" ] && [ -f "$DIR/n$i/$STATE_NAME" ]; then
        mv -f "$DIR/n$i/$STATE_NAME" "$DIR/n$i/$STATE_NAME.before-start"
    fi
done
for i in $(seq 1 "$N"); do
    mkdir -p "$DIR/n$i"
    # HAProxy reaches the instances from $PROXY_SOURCE: each pool trusts it,
    # so its X-Forwarded-For names the caller and its X-Nthpool-Moved is
    # honoured, and from no other address.
    # Each instance runs in its own directory, and reads relative paths from
    # there: the files FILE names (jwksFile, caFile, ${file:PATH}) are given
    # to it by their path from START_DIR; accessLog and stateFile stay
    # relative, one per instance.
    jq --arg admin "127.0.0.1:$((PORT + 20 + i))" --arg proxy "$PROXY_SOURCE/32" --arg base "$START_DIR" \
        'def from_base: if type == "string" and (startswith("/") | not) then "\($base)/\(.)" else . end;
        . + {adminListen: $admin, slotSecretFile: "../nthpool.secret"}
        | .pools |= map_values(.access.trustedProxies |= ((. // []) + [$proxy] | unique)
            | if .access.cloudflareAccess.jwksFile? then .access.cloudflareAccess.jwksFile |= from_base else . end
            | if .upstream.caFile? then .upstream.caFile |= from_base else . end
            | if .upstream.setHeaders? | type == "object" then .upstream.setHeaders |= map_values(
                if type == "string" then gsub("\\$\\{file:(?<p>[^/}][^}]*)\\}"; "${file:\($base)/\(.p)}") else . end)
              else . end)' \
        "$CONFIG" >"$DIR/n$i/config.json"
    start_instance "n$i"
done

haproxy_config >"$DIR/haproxy.cfg"
"$HAPROXY" -c -q -f "$DIR/haproxy.cfg" || die "HAProxy refused $DIR/haproxy.cfg"
# shellcheck disable=SC2086 # CLUSTER_HAPROXY_WRAP is a command prefix (the bench's valgrind)
(exec ${CLUSTER_HAPROXY_WRAP:-} "$HAPROXY" -f "$DIR/haproxy.cfg" -db >>"$DIR/haproxy.log" 2>&1 </dev/null) &
echo $! >"$DIR/haproxy.pid"
wait_port "$PORT" "$(cat "$DIR/haproxy.pid")" 300 || die "HAProxy did not start: $(tail -n 3 "$DIR/haproxy.log")"

started=1
echo "nthpool cluster: $N instances behind HAProxy on http://127.0.0.1:$PORT (stats http://127.0.0.1:$((PORT + 1))/)"
for i in $(seq 1 "$N"); do
    echo "  n$i: http://127.0.0.1:$((PORT + 10 + i)), admin http://127.0.0.1:$((PORT + 20 + i))/ (pid $(cat "$DIR/n$i/pid"))"
done
echo "stop with: scripts/cluster.sh --stop --dir $DIR"
