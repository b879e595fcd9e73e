#!/usr/bin/env bash
# Two sluice binaries, same config, same nginx upstream, interleaved wrk rounds: the
# before/after figure for a change (req/s and CPU per request, proxied and 429).
#
#   benches/proxy/before-after.sh OLD_BINARY NEW_BINARY
#
# Environment: DURATION [5] seconds per run, ROUNDS [3], CONNECTIONS [32], OLD_BUILD=1
# for an old binary from before the [log] section.
# Prints one line per run and the medians; needs nginx and wrk.
set -euo pipefail

OLD=${1:?usage: before-after.sh OLD_BINARY NEW_BINARY}
NEW=${2:?usage: before-after.sh OLD_BINARY NEW_BINARY}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-32}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-config.sh
. "$HERE/bench-config.sh"
bench_workspace
# Free ports: the upstream, then the four servers and their admin listeners.
UP=$(free_port_block 20)
sed -e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|$UP|g" "$HERE/upstream-nginx.conf.in" >"$TMP/up.conf"
mkdir -p "$TMP/upstream-body"
nginx -e "$TMP/up.err" -p "$TMP" -c "$TMP/up.conf" &
PIDS+=($!)

declare -A PORT PID
start() { # name binary port admin limit
    # OLD_BUILD=1 applies to the old binary only (see bench-config.sh).
    local old_build=0
    [[ $1 == old-* ]] && old_build=${OLD_BUILD:-0}
    OLD_BUILD=$old_build sluice_bench_config "$3" "$4" "$5" >"$TMP/$1.toml"
    SLUICE_LOG=warn "$2" run -c "$TMP/$1.toml" >"$TMP/$1.log" 2>&1 &
    PID[$1]=$!
    PIDS+=($!)
    PORT[$1]=$3
}
start old-proxied "$OLD" $((UP + 1)) $((UP + 11)) "$NEVER"
start new-proxied "$NEW" $((UP + 2)) $((UP + 12)) "$NEVER"
start old-reject "$OLD" $((UP + 3)) $((UP + 13)) '{ per_minute = 1 }'
start new-reject "$NEW" $((UP + 4)) $((UP + 14)) '{ per_minute = 1 }'
sleep 1
for name in "${!PORT[@]}"; do
    curl -s -o /dev/null "http://127.0.0.1:${PORT[$name]}/" || { cat "$TMP/$name.log"; exit 1; }
done

CLK_TCK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name -> "rps cpu_us_per_req"
    local before after out rps total
    before=$(ticks "${PID[$1]}")
    out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:${PORT[$1]}/")
    after=$(ticks "${PID[$1]}")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    awk -v r="$rps" -v t="$total" -v d=$((after - before)) -v hz="$CLK_TCK" \
        'BEGIN { printf "%.0f %.1f\n", r, d / hz * 1e6 / t }'
}

for name in "${!PORT[@]}"; do run "$name" >/dev/null; done # warm-up
declare -A RESULTS
for r in $(seq "$ROUNDS"); do
    for name in old-proxied new-proxied old-reject new-reject; do
        res=$(run "$name")
        echo "round $r  $name  $res  (req/s, CPU us/req)"
        RESULTS[$name]+="$res"$'\n'
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
echo
for name in old-proxied new-proxied old-reject new-reject; do
    rps=$(printf '%s' "${RESULTS[$name]}" | awk 'NF {print $1}' | median)
    cpu=$(printf '%s' "${RESULTS[$name]}" | awk 'NF {print $2}' | median)
    printf '%-12s median %7s req/s  %5s us CPU/req\n' "$name" "$rps" "$cpu"
done
