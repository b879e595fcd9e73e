#!/usr/bin/env bash
# Instructions per request of sluice binaries, under valgrind's callgrind: steady
# figures on a noisy machine, for before/after comparisons of the request path.
#
#   benches/proxy/callgrind.sh BINARY [BINARY...]
#
# For each binary and each scenario (proxied: to an nginx upstream, limits never
# tripping; reject: every request a 429; banned: every request a 403, the client
# banned through the admin API), sluice runs under callgrind twice, serving
# N1 and N2 keep-alive requests from h2load (HTTP/1.1, one connection); the figure is
# (I(N2) - I(N1)) / (N2 - N1), so start-up and shutdown cancel out.
# Environment: N1 [2000], N2 [12000], SCENARIOS ["proxied reject"], KEEP=1 keeps the
# callgrind.out files (callgrind_annotate shows where the instructions go).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: callgrind.sh BINARY [BINARY...]" >&2; exit 2; }
N1=${N1:-2000}
N2=${N2:-12000}
SCENARIOS=${SCENARIOS:-proxied reject}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
UPSTREAM_PID=
cleanup() {
    [ -n "$UPSTREAM_PID" ] && kill "$UPSTREAM_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ "${KEEP:-0}" = 1 ] && echo "kept $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT

UP=19580
PORT=19581
ADMIN=19582
sed -e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|$UP|g" "$HERE/upstream-nginx.conf.in" >"$TMP/up.conf"
mkdir -p "$TMP/upstream-body"
nginx -e "$TMP/up.err" -p "$TMP" -c "$TMP/up.conf" &
UPSTREAM_PID=$!

# shellcheck source=bench-config.sh
. "$HERE/bench-config.sh"

# binary scenario requests -> total instructions (Ir) of the run
instructions() {
    local limit=$NEVER out="$TMP/callgrind.out.$RANDOM"
    [ "$2" = reject ] && limit='{ per_minute = 1 }'
    sluice_bench_config "$PORT" "$ADMIN" "$limit" >"$TMP/sluice.toml"
    SLUICE_LOG=error valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$1" run -c "$TMP/sluice.toml" >"$TMP/valgrind.log" 2>&1 &
    local pid=$!
    for _ in $(seq 200); do
        curl -s -o /dev/null "http://127.0.0.1:$ADMIN/healthz" && break
        sleep 0.1
    done
    if [ "$2" = banned ]; then
        curl -s -o /dev/null -d '{"caller": "ip:127.0.0.1", "duration": "1h"}' \
            "http://127.0.0.1:$ADMIN/admin/bans"
    fi
    h2load --h1 -n "$3" -c 1 "http://127.0.0.1:$PORT/" >"$TMP/h2load.log" 2>&1
    kill -INT "$pid"
    wait "$pid" || true
    awk '/^summary:/ {print $2} /^totals:/ {t=$2} END {if (t) print t}' "$out" | head -1
}

for bin in "$@"; do
    for scenario in $SCENARIOS; do
        a=$(instructions "$bin" "$scenario" "$N1")
        b=$(instructions "$bin" "$scenario" "$N2")
        awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) -v bin="$bin" -v s="$scenario" \
            'BEGIN { printf "%-9s %8.0f instructions/request  %s\n", s, (b - a) / n, bin }'
    done
done
