#!/usr/bin/env bash
# Throughput of sluice with the Redis store against the memory store, same machine,
# same load: wrk -t1 -c32, one sluice worker, a limit that never trips, a private
# redis-server on loopback. Two workloads:
#   proxied  forwarded to an nginx upstream answering 200 (what a gateway does)
#   direct   a direct-response route (no upstream: the limiter's share is largest)
# Prints req/s of each store per workload and the ratio redis/memory, and per Redis
# round: script calls, decisions per call and Redis's time per call and per decision.
#
#   benches/proxy/redis.sh            # DURATION=10s ROUNDS=3 by default
#   DURATION=2s ROUNDS=1 benches/proxy/redis.sh
#   WORKLOADS=proxied benches/proxy/redis.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18190}
ADMIN=${ADMIN:-18191}
REDIS_PORT=${REDIS_PORT:-18192}
UPSTREAM=${UPSTREAM:-18193}
WORKLOADS=${WORKLOADS:-proxied direct}

for tool in wrk redis-server nginx; do
    command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk redis-server nginx >/dev/null; }
done
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q
BIN=${SLUICE_BIN:-target/release/sluice}

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -f "$tmp/upstream-nginx.pid" ] && kill "$(cat "$tmp/upstream-nginx.pid")" 2>/dev/null || true
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$tmp" --daemonize yes >/dev/null
chmod 755 "$tmp" # nginx workers run as nobody when we are root
sed -e "s|@TMP@|$tmp|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM|g" benches/proxy/upstream-nginx.conf.in \
    | sed 's/^daemon off;/daemon on;/' > "$tmp/upstream.conf"
nginx -e "$tmp/upstream.error.log" -p "$tmp" -c "$tmp/upstream.conf"

config() { # backend workload
    local answer="respond = { status = 200, body = \"ok\\n\" }"
    [ "$2" = proxied ] && answer='upstream = "api"'
    cat <<TOML
[server]
listen = "127.0.0.1:$PORT"
worker_threads = 1
[admin]
listen = "127.0.0.1:$ADMIN"
[log]
access = "off"
[store]
backend = "$1"
$( [ "$1" = redis ] && echo "url = \"redis://127.0.0.1:$REDIS_PORT/0\"" )
[upstreams.api]
targets = ["http://127.0.0.1:$UPSTREAM"]
[policies.open]
anonymous = { per_second = 1_000_000_000 }
[[routes]]
name = "bench"
path_prefix = "/"
$answer
policy = "open"
TOML
}

run() { # backend workload -> req/s
    config "$1" "$2" > "$tmp/$1.toml"
    SLUICE_LOG=warn "$BIN" run -c "$tmp/$1.toml" 2>>"$tmp/sluice.log" &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/" || { echo "sluice ($1) did not answer" >&2; exit 1; }
    wrk -t1 -c32 -d2s "http://127.0.0.1:$PORT/" >/dev/null
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    wrk -t1 -c32 -d"$DURATION" "http://127.0.0.1:$PORT/" > "$tmp/wrk.txt"
    awk '/^Requests\/sec/ {print $2}' "$tmp/wrk.txt"
    [ "$1" = redis ] && script_cost >&2
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

# Redis's side of the last run: script calls, decisions per call and Redis's time per
# call and per decision (INFO commandstats; the time spent inside EVALSHA only).
script_cost() {
    local requests calls usec
    requests=$(awk '/ requests in / {print $1}' "$tmp/wrk.txt")
    read -r calls usec < <(redis-cli -p "$REDIS_PORT" info commandstats \
        | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $2, $4}')
    awk -v r="$requests" -v c="$calls" -v u="$usec" 'BEGIN {
        printf "  redis: %d script calls, %.1f decisions per call, %.1f us per call, %.2f us per decision\n",
            c, r / c, u / c, u / r }'
}

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for workload in $WORKLOADS; do
    memory=() redis=()
    for round in $(seq "$ROUNDS"); do
        memory+=("$(run memory "$workload")")
        redis+=("$(run redis "$workload")")
        echo "$workload round $round: memory ${memory[-1]} req/s, redis ${redis[-1]} req/s"
    done
    m=$(median "${memory[@]}"); r=$(median "${redis[@]}")
    echo "$workload median: memory $m req/s, redis $r req/s, redis/memory $(awk -v r="$r" -v m="$m" 'BEGIN {printf "%.2f", r/m}')x"
done
