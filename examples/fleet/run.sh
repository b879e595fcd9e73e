#!/usr/bin/env bash
# The docker-compose fleet without Docker: a private redis-server and three sluice
# replicas on this machine, each from gateway.toml with its own ports.
#
#   examples/fleet/run.sh            # then: curl localhost:8081/ ... localhost:8083/
#
# Ports: REDIS_PORT (6390), BASE_PORT (8081: replicas on 8081-8083, admin on
# 9091-9093 unless ADMIN_BASE_PORT is set). SLUICE is the binary (default: sluice on
# PATH, else target/release/sluice). Ctrl-C (or SIGTERM) stops everything.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
REDIS_PORT="${REDIS_PORT:-6390}"
BASE_PORT="${BASE_PORT:-8081}"
ADMIN_BASE_PORT="${ADMIN_BASE_PORT:-9091}"
SLUICE="${SLUICE:-$(command -v sluice || echo "$here/../../target/release/sluice")}"
work="$(mktemp -d)"
pids=()
stop() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap stop EXIT
trap 'exit 0' INT TERM

# With persistence (the append-only file, fsynced every second), as a fleet's Redis
# should run: one restarted empty hands every caller a fresh window (docs/fleet.md).
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --appendonly yes --appendfsync everysec \
    --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
done

for i in 1 2 3; do
    port=$((BASE_PORT + i - 1))
    admin=$((ADMIN_BASE_PORT + i - 1))
    sed -e "s|redis://redis:6379/0|redis://127.0.0.1:$REDIS_PORT/0|" \
        -e "s|0.0.0.0:8080|127.0.0.1:$port|" \
        -e "s|0.0.0.0:9090|127.0.0.1:$admin|" \
        "$here/gateway.toml" >"$work/replica-$i.toml"
    "$SLUICE" run -c "$work/replica-$i.toml" >"$work/replica-$i.access.log" 2>"$work/replica-$i.log" &
    pids+=($!)
done
for i in 1 2 3; do
    admin=$((ADMIN_BASE_PORT + i - 1))
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
done
echo "fleet ready: replicas on 127.0.0.1:$BASE_PORT-$((BASE_PORT + 2)), redis on 127.0.0.1:$REDIS_PORT"
wait
