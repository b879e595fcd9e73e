#!/usr/bin/env bash
# What a refusal flood writes to the access log: one anonymous caller over its limit
# (`per_minute = 1`) for DURATION seconds, as fast as h2load sends on CONNECTIONS
# keep-alive HTTP/1.1 connections; the log (JSON) to a file. Prints, per binary, the
# requests answered, the 429s, and the lines and bytes the log holds once sluice has
# stopped.
#
#   benches/proxy/log-flood.sh BINARY [BINARY...]
#
# Environment: DURATION [15], CONNECTIONS [4], REFUSED [unset: the binary's default;
# "all" or "summary" sets [log] refused]. Needs h2load, curl. No upstream is
# started: every request but the first is refused before it would be forwarded.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: log-flood.sh BINARY [BINARY...]" >&2; exit 2; }
DURATION=${DURATION:-15}
CONNECTIONS=${CONNECTIONS:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-config.sh
. "$HERE/bench-config.sh"
bench_workspace

for bin in "$@"; do
    UP=$(free_port_block 3)
    PORT=$((UP + 1))
    ADMIN=$((UP + 2))
    ACCESS_LOG=json sluice_bench_config "$PORT" "$ADMIN" '{ per_minute = 1 }' >"$TMP/sluice.toml"
    if [ -n "${REFUSED:-}" ]; then
        sed -i "s|^access = \"json\"|access = \"json\"\nrefused = \"$REFUSED\"|" "$TMP/sluice.toml"
    fi
    SLUICE_LOG=error "$bin" run -c "$TMP/sluice.toml" >"$TMP/access.log" 2>"$TMP/sluice.err" &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$ADMIN/healthz" && break
        sleep 0.1
    done
    h2load --h1 -D "$DURATION" -c "$CONNECTIONS" "http://127.0.0.1:$PORT/flood" >"$TMP/h2load.log" 2>&1
    # The flood's last refusals are written once the caller has been quiet a second.
    sleep 3
    suppressed=$(curl -s "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_access_log_suppressed_total / {print $2}')
    kill -TERM "$pid"
    wait "$pid" || true
    requests=$(awk '/^requests:/ {print $6}' "$TMP/h2load.log")
    refused=$(awk '/^status codes:/ {print $7}' "$TMP/h2load.log")
    read -r lines bytes < <(wc -l -c <"$TMP/access.log")
    repeated=$({ grep -o '"repeated":[0-9]*' "$TMP/access.log" || true; } | awk -F: '{s += $2} END {print s + 0}')
    printf '%s: %ss, %s requests answered (%s 4xx): %s lines, %s bytes; repeated %s, suppressed_total %s\n' \
        "$bin" "$DURATION" "$requests" "$refused" "$lines" "$bytes" "$repeated" "${suppressed:--}"
done
