#!/usr/bin/env bash
# Instructions and simulated L1 cache misses per request of sluice, nginx and HAProxy,
# each under valgrind's callgrind with the config the comparison script gives it:
# a steady figure for where the three differ, on a machine too noisy for req/s.
#
#   benches/proxy/callgrind-peers.sh
#
# Each server runs twice per scenario (proxied: limits never tripping; reject: every
# request a 429), serving N1 and then N2 requests from h2load (HTTP/1.1, CONNECTIONS
# keep-alive connections); the figure is (count(N2) - count(N1)) / (N2 - N1), so
# start-up and shutdown cancel out. Counts are user-space only, and the cache is
# valgrind's model (this machine's L1 sizes, no prefetching).
# Environment: N1 [2000], N2 [12000], CONNECTIONS [32], SLUICE_BIN [target/release/sluice].
# Needs valgrind, h2load, nginx, haproxy, wrk (for the comparison script's smoke run).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
N1=${N1:-2000}
N2=${N2:-12000}
CONNECTIONS=${CONNECTIONS:-32}
SLUICE_BIN=${SLUICE_BIN:-$REPO/target/release/sluice}
UPSTREAM_PID=""
cleanup() {
    [ -n "$UPSTREAM_PID" ] && kill "$UPSTREAM_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${DIR:-}" ] && rm -rf "$DIR"
}
trap cleanup EXIT

# The comparison script renders every server's config; its smoke run keeps them.
log=$(mktemp)
KEEP_TMP=1 NO_BUILD=1 SLUICE_BIN="$SLUICE_BIN" SCENARIOS="proxied reject" \
    "$HERE/compare.sh" --smoke >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
DIR=$(awk '/^kept / {print $2}' "$log" | tail -1)
rm -f "$log"
[ -d "$DIR" ] || { echo "the comparison script kept no configs" >&2; exit 1; }

nginx -p "$DIR" -c "$DIR/upstream-nginx.conf" >/dev/null 2>&1 &
UPSTREAM_PID=$!

# The port a server listens on for a scenario, from its rendered config.
port_of() {
    case "$1:$2" in
        sluice:proxied) awk -F'[:"]' '/^listen/ {print $3; exit}' "$DIR/sluice-limited.toml" ;;
        sluice:reject) awk -F'[:"]' '/^listen/ {print $3; exit}' "$DIR/sluice-reject.toml" ;;
        nginx:*)
            # The first two `listen`s of nginx.conf: limited, then reject.
            awk -v n=$([ "$2" = proxied ] && echo 1 || echo 2) \
                '/^ *listen .*backlog/ {c++; if (c == n) {split($2, a, ":"); sub(";", "", a[2]); print a[2]; exit}}' \
                "$DIR/nginx.conf"
            ;;
        haproxy:*)
            awk -v f=$([ "$2" = proxied ] && echo limited || echo reject) \
                '$1 == "frontend" {in_f = ($2 == f)} in_f && $1 == "bind" {split($2, a, ":"); print a[2]; exit}' \
                "$DIR/haproxy.cfg"
            ;;
    esac
}

# server scenario requests -> "Ir I1mr D1mr D1mw" of the whole run
counts() {
    local out="$DIR/callgrind.out.$RANDOM" port
    port=$(port_of "$1" "$2")
    local vg=(valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file="$out")
    case "$1" in
        sluice)
            local config=$([ "$2" = proxied ] && echo limited || echo reject)
            SLUICE_LOG=error "${vg[@]}" "$SLUICE_BIN" run -c "$DIR/sluice-$config.toml" \
                >"$DIR/valgrind.log" 2>&1 &
            ;;
        nginx)
            "${vg[@]}" nginx -p "$DIR" -c "$DIR/nginx.conf" -g "master_process off;" \
                >"$DIR/valgrind.log" 2>&1 &
            ;;
        haproxy) "${vg[@]}" haproxy -db -f "$DIR/haproxy.cfg" >"$DIR/valgrind.log" 2>&1 & ;;
    esac
    local pid=$!
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && break
        sleep 0.1
    done
    h2load --h1 -n "$3" -c "$CONNECTIONS" "http://127.0.0.1:$port/" >"$DIR/h2load.log" 2>&1
    kill -INT "$pid" 2>/dev/null || true
    sleep 0.5
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || true
    # events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
    awk '/^summary:/ {print $2, $5, $6, $7}' "$out"
}

printf '%-9s %-8s %12s %12s %12s\n' scenario server instructions "L1i misses" "L1d misses"
for scenario in proxied reject; do
    for server in nginx haproxy sluice; do
        read -r a_ir a_i1 a_dr a_dw <<<"$(counts "$server" "$scenario" "$N1")"
        read -r b_ir b_i1 b_dr b_dw <<<"$(counts "$server" "$scenario" "$N2")"
        awk -v s="$scenario" -v v="$server" -v n=$((N2 - N1)) \
            -v ir=$((b_ir - a_ir)) -v i1=$((b_i1 - a_i1)) -v d=$((b_dr + b_dw - a_dr - a_dw)) \
            'BEGIN { printf "%-9s %-8s %12.0f %12.0f %12.0f\n", s, v, ir / n, i1 / n, d / n }'
    done
done
