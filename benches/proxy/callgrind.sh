#!/usr/bin/env bash
# Instructions per request of sluice binaries, under valgrind's callgrind: steady
# figures on a noisy machine, for before/after comparisons of the request path.
#
#   benches/proxy/callgrind.sh BINARY [BINARY...]
#
# For each binary and each scenario (proxied: to an nginx upstream, limits never
# tripping; reject: every request a 429; banned: every request a 403, the client
# banned through the admin API; capacity: every request a 503, the one slot of a
# concurrency cap held by a client that never reads its response; usage: proxied, to
# a small JSON answer carrying a usage field; costafter: the same with the route's
# cost_after = "json:usage.total_tokens", so usage -> costafter is what the response
# scanner costs; stacked: proxied, on a route of three policies, each under its own
# key; ws: WebSocket messages on a websocket = true route to ws-bench.py's echo
# server, one socket sending a 32-byte message after each echo, a "request" being a
# message and its echo; wslimit: the same with a message limit that never trips),
# sluice runs under callgrind twice, serving N1 and N2 keep-alive requests from h2load
# (HTTP/1.1, one connection), counting from when it first answers; the figure is
# (I(N2) - I(N1)) / (N2 - N1), so what is not per request (the holder or the ban of
# a scenario, the socket's upgrade, shutdown) cancels out.
# Environment: N1 [2000], N2 [12000], SCENARIOS ["proxied reject"], KEEP=1 keeps the
# callgrind.out files (callgrind_annotate shows where the instructions go),
# ACCESS_LOG=json|text logs every request (to a file in a directory of its own: one
# beside the config would wake the config watcher at every write), SPLIT=1 adds
# a line per thread that ran (callgrind's --separate-threads; threads numbered in
# order of creation): the worker's share and the access-log writer's apart.
# STORE='url = "redis://127.0.0.1:6379"' (or 'cluster = ["redis://...", ...]') puts
# the limits in that Redis (the [store] lines after backend = "redis"; the server is
# the caller's to start): the Redis store's request path, batcher included, e.g.
#   STORE='url = "redis://127.0.0.1:6390"' SCENARIOS=proxied callgrind.sh BEFORE AFTER
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
    [ -n "$WS_PID" ] && kill "$WS_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ "${KEEP:-0}" = 1 ] && echo "kept $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT

# shellcheck source=bench-config.sh
. "$HERE/bench-config.sh"
# Free ports, so that it can run beside the comparison and other benchmarks.
UP=$(free_port_block 4)
PORT=$((UP + 1))
ADMIN=$((UP + 2))
WS_UP=$((UP + 3))
sed -e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|$UP|g" "$HERE/upstream-nginx.conf.in" >"$TMP/up.conf"
mkdir -p "$TMP/upstream-body" "$TMP/log"
truncate -s 1G "$TMP/hold.bin"
# nginx's workers (another user) read hold.bin through the directory.
chmod 755 "$TMP"
nginx -e "$TMP/up.err" -p "$TMP" -c "$TMP/up.conf" &
UPSTREAM_PID=$!
WS_PID=
case " $SCENARIOS " in
    *" ws "* | *" wslimit "*)
        python3 "$HERE/ws-bench.py" serve "$WS_UP" >"$TMP/ws-echo.log" 2>&1 &
        WS_PID=$!
        ;;
esac

# binary scenario requests -> total instructions (Ir) of the run
instructions() {
    local limit=$NEVER out="$TMP/callgrind.out.$RANDOM" server="" policy="" route="" path=/
    [ "$2" = reject ] && limit='{ per_minute = 1 }'
    case "$2" in
        usage) path=/usage ;;
        costafter)
            path=/usage
            route='cost_after = "json:usage.total_tokens"'
            ;;
    esac
    if [ "$2" = capacity ]; then
        server='idle_timeout = "1h"'
        policy='concurrency = { max = 1, queue = 0 }'
    fi
    local stack="" upstream=$UP
    case "$2" in
        ws | wslimit)
            upstream=$WS_UP
            route='websocket = true'
            ;;
    esac
    [ "$2" = wslimit ] && policy='messages = { per_second = 1_000_000_000 }'
    if [ "$2" = stacked ]; then
        # Three policies on the route, each under its own key, limits never tripping.
        policy=$(printf '[policies.per_ip]\nkey = ["ip"]\nanonymous = %s\n[policies.per_path]\nkey = ["path:1"]\nanonymous = %s' "$NEVER" "$NEVER")
        stack='["bench", "per_ip", "per_path"]'
    fi
    UP=$upstream BENCH_POLICY=$stack sluice_bench_config "$PORT" "$ADMIN" "$limit" "$server" "$policy" "$route" >"$TMP/sluice.toml"
    if [ -n "${STORE:-}" ]; then
        printf '[store]\nbackend = "redis"\n%s\n' "$STORE" >>"$TMP/sluice.toml"
    fi
    # Counting starts once sluice serves: start-up work (the clock's calibration
    # runs for a time, not a number of steps) would add its run-to-run spread.
    local split=()
    [ "${SPLIT:-0}" = 1 ] && split=(--separate-threads=yes)
    # shellcheck disable=SC2086 # CALLGRIND_ARGS is a list of options
    SLUICE_LOG=error valgrind --tool=callgrind --instr-atstart=no "${split[@]}" ${CALLGRIND_ARGS:-} \
        --callgrind-out-file="$out" \
        "$1" run -c "$TMP/sluice.toml" >"$TMP/log/access.log" 2>"$TMP/valgrind.log" &
    local pid=$!
    for _ in $(seq 200); do
        curl -s -o /dev/null "http://127.0.0.1:$ADMIN/healthz" && break
        sleep 0.1
    done
    callgrind_control --instr=on "$pid" >/dev/null 2>&1
    if [ "$2" = capacity ]; then
        # The one slot: a response far larger than socket buffers, never read.
        # Its status line says the slot is taken (under valgrind that takes a while;
        # a request sent sooner could take the slot first).
        exec 5<>"/dev/tcp/127.0.0.1/$PORT"
        printf 'GET /hold HTTP/1.1\r\nHost: hold\r\n\r\n' >&5
        local status=""
        read -r -t 30 -u 5 status || true
        case "$status" in
            "HTTP/1.1 200"*) ;;
            *)
                echo "the holder did not get the slot: $status" >&2
                kill "$pid"
                exit 1
                ;;
        esac
    fi
    if [ "$2" = banned ]; then
        curl -s -o /dev/null -d '{"caller": "ip:127.0.0.1", "duration": "1h"}' \
            "http://127.0.0.1:$ADMIN/admin/bans"
    fi
    case "$2" in
        ws | wslimit) python3 "$HERE/ws-bench.py" count "ws://127.0.0.1:$PORT/chat" "$3" ;;
        *) h2load --h1 -n "$3" -c 1 "http://127.0.0.1:$PORT$path" >"$TMP/h2load.log" 2>&1 ;;
    esac
    [ "$2" = capacity ] && exec 5>&-
    kill -INT "$pid"
    wait "$pid" || true
    if [ "${SPLIT:-0}" = 1 ]; then
        # "thread=instructions ..." over the threads' files, then their sum.
        local f n sum=0 parts=""
        for f in "$out"-*; do
            n=$(awk '/^summary:/ {print $2} /^totals:/ {t=$2} END {if (t) print t}' "$f" | head -1)
            parts="$parts ${f##*-}=$n"
            sum=$((sum + n))
        done
        echo "$sum$parts"
        return
    fi
    awk '/^summary:/ {print $2} /^totals:/ {t=$2} END {if (t) print t}' "$out" | head -1
}

for bin in "$@"; do
    for scenario in $SCENARIOS; do
        a=$(instructions "$bin" "$scenario" "$N1")
        b=$(instructions "$bin" "$scenario" "$N2")
        awk -v a="${a%% *}" -v b="${b%% *}" -v n=$((N2 - N1)) -v bin="$bin" -v s="$scenario" \
            'BEGIN { printf "%-9s %8.0f instructions/request  %s\n", s, (b - a) / n, bin }'
        if [ "${SPLIT:-0}" = 1 ]; then
            # Threads by number, as in both runs (the same start-up makes the same ones).
            awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN {
                na = split(a, pa, " "); split(b, pb, " ")
                for (i = 2; i <= na; i++) {
                    split(pa[i], x, "="); split(pb[i], y, "=")
                    printf "  thread %s %8.0f instructions/request\n", x[1], (y[2] - x[2]) / n
                }
            }'
        fi
    done
done
