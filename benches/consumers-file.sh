#!/usr/bin/env bash
# Consumers file at scale: how long the release binary takes to start serving with
# N consumers in `consumers_file`, how much memory it holds for them, and how long
# a reload of the whole file takes while it runs, and what that reload costs the
# requests in flight.
#
#   benches/consumers-file.sh            N = 100 000 and 1 000 000
#   benches/consumers-file.sh 250000     one size
#   SLUICE=path/to/sluice benches/consumers-file.sh   another build (no cargo build)
#
# For each size: the file is generated with `sluice hash-key --batch`; sluice starts
# and the time to the first 200 from /readyz is taken; its peak resident memory
# (VmHWM) is compared with the same config without the file (the difference is what
# the consumers cost); then the file is rewritten (one consumer disabled) and the
# time until that consumer's key gets 401 is taken (from renaming the new file,
# stamped as just written, over the old one: the watcher's wait, compile and swap),
# and the peak memory again (it now includes the old and the new set held at once).
# The swap happens under load: wrk sends API-key requests (another consumer's key)
# for LOAD_SECONDS before the change and for LOAD_SECONDS from just before it; the
# p99 of each run and its non-2xx responses plus socket errors are printed.
# Everything stays on loopback; the processes started here are stopped by PID.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ -z "${SLUICE:-}" ]; then
    cargo build --profile dist --quiet --bin sluice
    SLUICE=$PWD/target/dist/sluice
fi
LOAD_SECONDS=${LOAD_SECONDS:-10}
SIZES=("$@")
[ ${#SIZES[@]} -eq 0 ] && SIZES=(100000 1000000)

work=$(mktemp -d)
pid=
wrk_pid=
cleanup() {
    [ -n "$wrk_pid" ] && kill "$wrk_pid" 2>/dev/null || true
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }

# Starts sluice in $work with `consumers_file = $1` (or none), waits for /readyz;
# sets PID, PORT, STARTUP_MS and KB (peak resident memory).
start() {
    local file=$1 port admin
    port=$(free_port); admin=$(free_port)
    {
        echo "[server]"; echo "listen = \"127.0.0.1:$port\""
        echo "[admin]"; echo "listen = \"127.0.0.1:$admin\""
        echo "[log]"; echo "access = \"off\""
        echo "[identity]"
        [ -n "$file" ] && echo "consumers_file = \"$file\""
        echo "[policies.p]"; echo "anonymous = { per_minute = 10 }"; echo "registered = { per_second = 1000000 }"
        echo "[[routes]]"; echo "name = \"api\""; echo "path_prefix = \"/\""
        echo "respond = { status = 200, body = \"ok\" }"; echo "policy = \"p\""
    } > "$work/gateway.toml"
    local started
    started=$(now_ms)
    "$SLUICE" -c "$work/gateway.toml" run > /dev/null 2> "$work/stderr" &
    pid=$!
    until curl -fs "http://127.0.0.1:$admin/readyz" > /dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { cat "$work/stderr"; exit 1; }
        sleep 0.01
    done
    local ready
    ready=$(now_ms)
    PORT=$port
    STARTUP_MS=$((ready - started))
    KB=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
}

stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

# wrk's p99 (ms), and its non-2xx/3xx responses plus socket errors, from its output.
p99_ms() {
    awk '$1 == "99%" { v = $2; u = v; sub(/[a-z]+$/, "", v); sub(/^[0-9.]+/, "", u);
        if (u == "us") v /= 1000; else if (u == "s") v *= 1000; printf "%.2f", v }' "$1"
}
failed() {
    awk '/Non-2xx/ { n += $NF } /Socket errors/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 }
        END { print n + 0 }' "$1"
}
load() { wrk -t1 -c16 -d"${LOAD_SECONDS}s" --latency -H "x-api-key: key-0" "http://127.0.0.1:$PORT/"; }

start ""
base_kb=$KB
stop
printf '%-10s %8s %11s %10s %10s %10s %15s %15s\n' consumers file_MB startup_ms memory_MB reload_ms \
    peak_MB p99_before_ms p99_during_ms
for n in "${SIZES[@]}"; do
    awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "c%d registered key-%d\n", i, i }' \
        | "$SLUICE" hash-key --batch > "$work/consumers.jsonl"
    size_mb=$(( $(stat -c %s "$work/consumers.jsonl") / 1048576 ))
    start consumers.jsonl
    startup_ms=$STARTUP_MS
    kb=$KB
    # Disable the last consumer, rewrite the file by rename, wait for its 401.
    last=$((n - 1))
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: key-$last" "http://127.0.0.1:$PORT/")
    [ "$code" = 200 ] || { echo "key-$last answered $code before the change"; exit 1; }
    sed "\$s/}\$/, \"disabled\": true}/" "$work/consumers.jsonl" > "$work/consumers.new"
    load > "$work/before.txt"
    load > "$work/during.txt" &
    wrk_pid=$!
    sleep 1
    # Stamped as just written, as a generator's output renamed over the old file is.
    touch "$work/consumers.new"
    changed=$(now_ms)
    mv "$work/consumers.new" "$work/consumers.jsonl"
    until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: key-$last" "http://127.0.0.1:$PORT/")" = 401 ]; do
        sleep 0.02
    done
    reload_ms=$(( $(now_ms) - changed ))
    wait "$wrk_pid"
    wrk_pid=
    peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
    stop
    printf '%-10s %8s %11s %10s %10s %10s %15s %15s\n' "$n" "$size_mb" "$startup_ms" \
        "$(( (kb - base_kb) / 1024 ))" "$reload_ms" "$(( (peak_kb - base_kb) / 1024 ))" \
        "$(p99_ms "$work/before.txt") ($(failed "$work/before.txt") failed)" \
        "$(p99_ms "$work/during.txt") ($(failed "$work/during.txt") failed)"
done
