#!/usr/bin/env bash
# Runs the fleet simulator's standard scenarios against the release server
# and prints one markdown table. Each scenario runs 100 workers; the main four
# run FLEET_SECS (default 60) seconds, the dialect runs and the direct
# baseline DIALECT_SECS (default 40), which keeps the whole under 10 minutes.
#
#   scripts/fleet.sh            # build, run everything, print the table
#   FLEET_OUT=dir scripts/fleet.sh   # also keep each run's JSON (timeline) there
#
# Upstream (unless a row says otherwise): 20 calls in flight, 600 requests a
# minute in fixed 6-s windows (60 per window), OpenAI headers stamped at
# admission, service time lognormal with median 500 ms and p99 2000 ms.
set -euo pipefail

SCRIPT=fleet.sh
cd "$(dirname "$0")/.."
FLEET_SECS=${FLEET_SECS:-60}
DIALECT_SECS=${DIALECT_SECS:-40}
OUT=${FLEET_OUT:-target/fleet}
mkdir -p "$OUT"

cargo build --release --quiet -p nthpool --bin nthpool -p nthpool-bench --bin nthpool-fleet
FLEET=target/release/nthpool-fleet

WRONG=(--pool-concurrency 64 --adaptive on)

run() {
    local name=$1
    shift
    "$FLEET" --name "$name" --no-header --json-file "$OUT/$name.json" "$@"
}

printf '%s\n' "| scenario | goodput/s | of max | upstream 429s | job p50 / p99 | 429 < 1 % after |"
printf '%s\n' "|---|---|---|---|---|---|"
run a-static-right --mode static -d "$FLEET_SECS"
run b-wrong "${WRONG[@]}" -d "$FLEET_SECS"
run c-wrong-concurrency-only "${WRONG[@]}" --upstream-rpm 0 -d "$FLEET_SECS"
run d-wrong-halving "${WRONG[@]}" --change 30s:concurrency=10,rpm=300 -d "$FLEET_SECS"
run b-direct --mode direct -d "$DIALECT_SECS"
for dialect in anthropic ietf xratelimit retry-after none; do
    run "e-wrong-$dialect" "${WRONG[@]}" --dialect "$dialect" -d "$DIALECT_SECS"
done
printf '\n%s\n' "Timelines: $OUT/*.json"
