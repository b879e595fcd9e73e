#!/usr/bin/env bash
# What a usage export (GET /admin/usage?policy=P&format=jsonl) of CALLERS tracked
# callers costs the proxied traffic of a release sluice: the p99 of proxied requests
# with and without an export running, in one interleaved run.
#
#   benches/usage-export.sh [BINARY]      (default: target/release/sluice)
#
# One sluice (one worker thread, the memory store) proxies "/" to the shared nginx
# upstream (proxy/upstream-nginx.conf.in) under policy "bench". wrk fills the store
# with CALLERS callers (ip:10.x.y.z, through POST /v1/check on the admin listener),
# until sluice_tracked_callers says they are all there. Then ROUNDS rounds, each
# two wrk runs of DURATION seconds over CONNS connections against "/" (--latency):
# "quiet", then "export", during which a loop of curl reads the whole export, page
# after page (limit=100000, following X-Next-Cursor), again and again. Printed: each
# run's p99, the median p99 of each kind and their ratio, the exports completed
# during the export runs and the seconds one whole export took.
# Environment: CALLERS [1000000], ROUNDS [3], DURATION [15], CONNS [16].
set -euo pipefail

HERE=$(cd "$(dirname "$0")/proxy" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${1:-$REPO/target/release/sluice}
CALLERS=${CALLERS:-1000000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15}
CONNS=${CONNS:-16}
[ -x "$BIN" ] || { echo "no sluice binary at $BIN (cargo build --release)" >&2; exit 2; }
# shellcheck source=proxy/bench-config.sh
. "$HERE/bench-config.sh"
bench_workspace
UP=$(free_port)
PORT=$(free_port)
ADMIN=$(free_port)
start_upstream
# A day's window: a caller stays tracked (a per-second window empties, and the
# maintenance sweeps the caller away).
sluice_bench_config "$PORT" "$ADMIN" '{ per_day = 4_000_000_000 }' >"$TMP/sluice.toml"
printf '[store]\nbackend = "memory"\nmax_keys = %d\n' $((CALLERS * 2)) >>"$TMP/sluice.toml"
SLUICE_LOG=error "$BIN" run -c "$TMP/sluice.toml" >"$TMP/sluice.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
    sleep 0.1
done

# One wrk thread charges callers n, n + 1, ... (mod CALLERS), n from the argument
# on: each run goes on where the callers tracked so far end, leaving no gaps.
cat >"$TMP/fill.lua" <<EOF
local callers = $CALLERS
function init(args)
    n = tonumber(args[1]) or 0
end
function request()
    local i = n % callers
    n = n + 1
    local body = string.format('{"policy":"bench","caller":"ip:10.%d.%d.%d"}',
        math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256)
    return wrk.format("POST", "/v1/check", {["Content-Type"] = "application/json"}, body)
end
EOF
tracked() {
    curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^sluice_tracked_callers / {print int($2)}'
}
while [ "$(tracked)" -lt "$CALLERS" ]; do
    wrk -t1 -c32 -d10s -s "$TMP/fill.lua" "http://127.0.0.1:$ADMIN/" -- "$(tracked)" >/dev/null
done
echo "tracked callers: $(tracked)"

# One whole export, page after page; prints its lines and seconds.
export_once() {
    local url="/admin/usage?policy=bench&format=jsonl&limit=100000" lines=0 start next
    start=$(date +%s.%N)
    while :; do
        next=$(curl -s -D "$TMP/head" "http://127.0.0.1:$ADMIN$url" | wc -l)
        lines=$((lines + next))
        next=$(awk -F': ' 'tolower($1) == "x-next-cursor" {print $2}' "$TMP/head" | tr -d '\r')
        [ -n "$next" ] || break
        url="/admin/usage?policy=bench&format=jsonl&limit=100000&cursor=$next"
    done
    echo "$lines $(echo "$(date +%s.%N) - $start" | bc)"
}
# wrk's 99% line, in ms.
p99() {
    awk '$1 == "99%" {v = $2; if (v ~ /us$/) {sub(/us$/, "", v); v /= 1000}
        else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) {sub(/s$/, "", v); v *= 1000}
        printf "%.3f\n", v}'
}
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

quiet=() exporting=() exports=0
for round in $(seq "$ROUNDS"); do
    q=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/" | p99)
    quiet+=("$q")
    (while [ ! -e "$TMP/stop" ]; do export_once >>"$TMP/exports"; done) &
    LOOP=$!
    e=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/" | p99)
    touch "$TMP/stop"
    wait "$LOOP"
    rm -f "$TMP/stop"
    exporting+=("$e")
    echo "round $round: p99 quiet ${q} ms, during an export ${e} ms"
done
q=$(printf '%s\n' "${quiet[@]}" | median)
e=$(printf '%s\n' "${exporting[@]}" | median)
echo "median p99: quiet $q ms, during an export $e ms, ratio $(echo "scale=2; $e / $q" | bc)"
exports=$(wc -l <"$TMP/exports")
awk -v callers="$CALLERS" '$1 >= callers {n++; s += $2} END {
    if (n) printf "whole exports of %d callers: %d, %.1f s each on average\n", callers, n, s / n }' "$TMP/exports"
echo "export loops run (whole or cut by the end of a run): $exports"
