#!/usr/bin/env bash
# What a graceful stop's snapshot and its restore cost at scale: one pool of
# N held slots (default 1 000 000), filled with `nthpool-bench --fill`, then
# SIGTERM, timed from the signal to the process's exit, and a second start
# that restores the file. Prints the server's own log lines about the
# snapshot and the wall-clock time of each stop. Loopback only, bounded.
#
#   scripts/snapshot-bench.sh                 # 1 000 000 slots, 2 rounds
#   SNAP_N=100000 SNAP_ROUNDS=1 scripts/snapshot-bench.sh
#
# Builds the release binaries first (cargo build --release).
# Environment: SNAP_N (1000000), SNAP_ROUNDS (2), SNAP_PORT (the server's,
# 27470), CARGO_TARGET_DIR.
set -euo pipefail

for arg in "$@"; do
    case "$arg" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "snapshot-bench.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done
cd "$(dirname "$0")/.."
SCRIPT=snapshot-bench.sh
WORK_PREFIX=nthpool-snapshot
# shellcheck source=scripts/common.sh
. scripts/common.sh

N=${SNAP_N:-1000000}
ROUNDS=${SNAP_ROUNDS:-2}
PORT=${SNAP_PORT:-27470}
KEY=nb_snapshot_bench_key
check_free "$PORT"

cargo build --release --quiet --bin nthpool -p nthpool
cargo build --release --quiet -p nthpool-bench
# Where cargo put them: CARGO_TARGET_DIR when set, as for the builds above.
BIN=${CARGO_TARGET_DIR:-target}/release

cat >"$WORK/config.json" <<EOF
{
  "listen": "127.0.0.1:$PORT",
  "adminListen": null,
  "stateFile": "nthpool.state",
  "pools": {
    "full": {
      "keys": ["$KEY"],
      "concurrency": $N,
      "adaptive": false,
      "termMs": 3600000,
      "renewIntervalMs": 60000,
      "requestTimeoutMs": 7200000
    }
  }
}
EOF

# start LOG: the server in the background, its pid in SERVER.
start() {
    RUST_LOG=info "${ON_SERVER[@]}" "$BIN/nthpool" --config "$WORK/config.json" 2>"$1" &
    SERVER=$!
    PIDS+=("$SERVER")
    wait_port "$PORT" "$SERVER" 600 || die "the server did not start; see $1"
}

# stop: SIGTERM, then wait for the exit; prints the milliseconds it took.
stop() {
    local t0 t1
    t0=$(date +%s%N)
    kill -TERM "$SERVER"
    wait "$SERVER" || true
    t1=$(date +%s%N)
    say "  SIGTERM to exit: $(((t1 - t0) / 1000000)) ms"
}

say "snapshot bench: $N held slots, $ROUNDS round(s), $PINNING"
start "$WORK/first.log"
"${ON_CLIENT[@]}" "$BIN/nthpool-bench" --addr "127.0.0.1:$PORT" --key "$KEY" --pool full \
    --fill "$N" -c 64 -d 300 >/dev/null
say "round 0: filled $N slots"
stop
grep -h "snapshot" "$WORK/first.log" | sed 's/^/  /'
say "  file: $(stat -c %s "$WORK/nthpool.state") bytes"
for round in $(seq 1 "$ROUNDS"); do
    say "round $round: restart"
    start "$WORK/round$round.log"
    # The listener is bound before the file is read: wait for its line.
    for _ in $(seq 1 600); do
        grep -q "restored\|refused" "$WORK/round$round.log" && break
        sleep 0.1
    done
    grep -h "restored\|refused\|WARN\|ERROR" "$WORK/round$round.log" | sed "s/^/  /" || true
    stop
    grep -h "snapshot of" "$WORK/round$round.log" | sed 's/^/  /'
done
