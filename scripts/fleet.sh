#!/usr/bin/env bash
# Runs the fleet simulator's standard scenarios against the release server
# and prints one markdown table. Each scenario runs 100 workers (10 where
# its name says so) with its own server and upstream; FLEET_JOBS (default 3)
# scenarios run at once (the simulator mostly sleeps), which keeps the whole
# under 10 minutes. The main scenarios run FLEET_SECS (default 60) seconds,
# the raise RAISE_SECS (default 90), the dialects, the stamping and window
# variants and the direct baseline DIALECT_SECS (default 40).
#
#   scripts/fleet.sh                 # build, run everything, print the table
#   FLEET_OUT=dir scripts/fleet.sh   # where each run's JSON (timeline) goes
#   FLEET_JOBS=1 scripts/fleet.sh    # one scenario at a time (about 18 min)
#
# Upstream (unless a row says otherwise): 20 calls in flight, 600 requests a
# minute in fixed 6-s windows (60 per window), OpenAI headers stamped at
# admission, service time lognormal with median 500 ms and p99 2000 ms.
# The binaries are built (and run from) CARGO_TARGET_DIR when it is set.
set -euo pipefail

for arg in "$@"; do
    case "$arg" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "fleet.sh: unknown argument $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

SCRIPT=fleet.sh
cd "$(dirname "$0")/.."
FLEET_SECS=${FLEET_SECS:-60}
RAISE_SECS=${RAISE_SECS:-90}
DIALECT_SECS=${DIALECT_SECS:-40}
FLEET_JOBS=${FLEET_JOBS:-3}
OUT=${FLEET_OUT:-target/fleet}
mkdir -p "$OUT"

cargo build --release --quiet -p nthpool --bin nthpool -p nthpool-bench --bin nthpool-fleet
# Where cargo put it: CARGO_TARGET_DIR when set, as for the build above.
FLEET=${CARGO_TARGET_DIR:-target}/release/nthpool-fleet

WRONG="--pool-concurrency 64 --adaptive on"
HALVING="--change 30s:concurrency=10,rpm=300"
# name | arguments (word-split on purpose)
SCENARIOS=(
    "a-static-right|--mode static -d $FLEET_SECS"
    "b-wrong|$WRONG -d $FLEET_SECS"
    "c-wrong-concurrency-only|$WRONG --upstream-rpm 0 -d $FLEET_SECS"
    "d-wrong-halving|$WRONG $HALVING -d $FLEET_SECS"
    "b-proxy-wrong|--mode proxy $WRONG -d $FLEET_SECS"
    "c-proxy-wrong-concurrency-only|--mode proxy $WRONG --upstream-rpm 0 -d $FLEET_SECS"
    "d-proxy-wrong-halving|--mode proxy $WRONG $HALVING -d $FLEET_SECS"
    "c-wrong-5-in-flight|$WRONG --upstream-rpm 0 --upstream-concurrency 5 -d $FLEET_SECS"
    "f-wrong-raise-concurrency-only|$WRONG --upstream-rpm 0 --change 30s:concurrency=40 -d $RAISE_SECS"
    "f-wrong-10-callers-drop|$WRONG -w 10 --upstream-rpm 0 --change 20s:concurrency=5 -d $FLEET_SECS"
    "b-direct|--mode direct -d $DIALECT_SECS"
    "b-wrong-stamp-response|$WRONG --stamp response -d $DIALECT_SECS"
    "b-wrong-sliding|$WRONG --window-kind sliding -d $DIALECT_SECS"
)
for dialect in anthropic ietf ietf-structured xratelimit remaining-only reset-only retry-after none; do
    SCENARIOS+=("e-wrong-$dialect|$WRONG --dialect $dialect -d $DIALECT_SECS")
done

run() {
    local name=${1%%|*} args=${1#*|}
    # shellcheck disable=SC2086
    "$FLEET" --name "$name" --no-header --json-file "$OUT/$name.json" $args >"$OUT/$name.row" 2>"$OUT/$name.err" ||
        echo "| $name | failed: $(tail -1 "$OUT/$name.err") |||||" >"$OUT/$name.row"
}

running=0
for s in "${SCENARIOS[@]}"; do
    run "$s" &
    running=$((running + 1))
    if [ "$running" -ge "$FLEET_JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

printf '%s\n' "| scenario | goodput/s | of max | upstream 429s | job p50 / p99 | 429 < 1 % after |"
printf '%s\n' "|---|---|---|---|---|---|"
for s in "${SCENARIOS[@]}"; do
    cat "$OUT/${s%%|*}.row"
done
printf '\n%s\n' "Timelines: $OUT/*.json"
