#!/usr/bin/env bash
# Consumers file at scale: how long the release binary takes to start serving with
# N consumers in `consumers_file`, how much memory it holds for them, and how long
# a reload of the whole file takes while it runs.
#
#   benches/consumers-file.sh            N = 100 000 and 1 000 000
#   benches/consumers-file.sh 250000     one size
#
# For each size: the file is generated with `sluice hash-key --batch`; sluice starts
# and the time to the first 200 from /readyz is taken; its peak resident memory
# (VmHWM) is compared with the same config without the file (the difference is what
# the consumers cost); then the file is rewritten (one consumer disabled) and the
# time until that consumer's key gets 401 is taken (watcher poll + compile + swap).
# Everything stays on loopback; the processes started here are stopped by PID.
set -euo pipefail

cd "$(dirname "$0")/.."
cargo build --release --quiet --bin sluice
SLUICE=$PWD/target/release/sluice
SIZES=("$@")
[ ${#SIZES[@]} -eq 0 ] && SIZES=(100000 1000000)

work=$(mktemp -d)
pid=
cleanup() {
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
        echo "[policies.p]"; echo "anonymous = { per_minute = 10 }"; echo "registered = { per_minute = 100 }"
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

start ""
base_kb=$KB
stop
printf '%-10s %12s %14s %16s %14s\n' consumers file_MB startup_ms memory_MB reload_ms
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
    changed=$(now_ms)
    mv "$work/consumers.new" "$work/consumers.jsonl"
    until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: key-$last" "http://127.0.0.1:$PORT/")" = 401 ]; do
        sleep 0.02
    done
    reload_ms=$(( $(now_ms) - changed ))
    stop
    printf '%-10s %12s %14s %16s %14s\n' "$n" "$size_mb" "$startup_ms" "$(( (kb - base_kb) / 1024 ))" "$reload_ms"
done
