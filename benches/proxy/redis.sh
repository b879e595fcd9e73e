#!/usr/bin/env bash
# Throughput of sluice with the Redis store against the memory store, same machine,
# same load: wrk -t1 -c32, one sluice worker, a limit that never trips, a private
# redis-server on loopback. Two workloads:
#   proxied  forwarded to an nginx upstream answering 200 (what a gateway does)
#   direct   a direct-response route (no upstream: the limiter's share is largest)
# Prints req/s of each store per workload and the ratio redis/memory, and per Redis
# round: script calls, decisions per call and Redis's time per call and per decision.
#
#
# A third workload, scale (WORKLOADS=scale), measures a fleet: four sluice replicas
# (one worker each, direct-response route, CALLERS distinct callers from
# X-Forwarded-For) loaded at once by four wrk, against one redis-server and then
# against a Redis Cluster of MASTERS masters (no replicas; "3" by default, "1 2 3"
# runs each), interleaved per round. It prints decisions per second; the replicas'
# CPU per decision (utime + stime of the four sluice processes from /proc, over the
# measured run: on a small machine the replicas are the bottleneck); Redis's CPU per
# decision, all servers together and the busiest one alone, and its total CPU use.
# The busiest server's CPU per decision bounds what Redis can serve when each server
# has a core of its own: 1 / that is the "ceiling" printed, the figure that scales
# with masters when the load does not fit on the machine that measures it. Each run
# also prints the script calls all servers took, the decisions per call, and the
# wall time per call inside the script (INFO commandstats: on a machine with more
# runnable processes than cores it includes waits for a core). FLEET_CONNS sets the
# wrk connections per replica (8 by default).
#
# PERF=DIR records a call-graph profile (perf record -g) of replica 0 over each
# measured run, as DIR/one.data and DIR/cluster-N.data.
#
#   benches/proxy/redis.sh            # DURATION=10s ROUNDS=3 by default
#   DURATION=2s ROUNDS=1 benches/proxy/redis.sh
#   WORKLOADS=proxied benches/proxy/redis.sh
#   WORKLOADS=scale DURATION=8s ROUNDS=3 benches/proxy/redis.sh
#
# A fourth, wait (WORKLOADS=wait), prices [store] wait_replicas = 1: the direct
# workload against the private redis-server with a replica of it, wait_replicas 0
# and 1 interleaved per round; prints req/s of each and the cost ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18190}
ADMIN=${ADMIN:-18191}
REDIS_PORT=${REDIS_PORT:-18192}
UPSTREAM=${UPSTREAM:-18193}
WORKLOADS=${WORKLOADS:-proxied direct}

for tool in wrk redis-server redis-cli nginx; do
    command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk redis-server redis-tools nginx >/dev/null; }
done
[ "${NO_BUILD:-0}" = 1 ] || cargo build --profile dist -q
BIN=${SLUICE_BIN:-target/dist/sluice}

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -f "$tmp/upstream-nginx.pid" ] && kill "$(cat "$tmp/upstream-nginx.pid")" 2>/dev/null || true
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    # The wait workload's replica and the scale workload's cluster, if still up.
    for pidfile in "$tmp"/replica.pid "$tmp"/node*/pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$tmp" --daemonize yes >/dev/null
chmod 755 "$tmp" # nginx workers run as nobody when we are root
if [[ " $WORKLOADS " == *" proxied "* ]]; then
    sed -e "s|@TMP@|$tmp|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM|g" benches/proxy/upstream-nginx.conf.in \
        | sed 's/^daemon off;/daemon on;/' > "$tmp/upstream.conf"
    nginx -e "$tmp/upstream.error.log" -p "$tmp" -c "$tmp/upstream.conf"
fi

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

# ---- scale: four replicas against one server, then against a 3-master cluster ----
CALLERS=${CALLERS:-100000}
CLUSTER_BASE=${CLUSTER_BASE:-18300}   # 3 cluster masters on BASE..BASE+2
FLEET_BASE=${FLEET_BASE:-18310}       # replica i listens on BASE+2i, admin BASE+2i+1

MASTERS=${MASTERS:-3}
FLEET_CONNS=${FLEET_CONNS:-8}         # wrk connections per replica

start_cluster() { # masters: slots split evenly, met by hand (any number of masters)
    local n=$1 i
    for ((i = 0; i < n; i++)); do
        local port=$((CLUSTER_BASE + i))
        rm -rf "$tmp/node$port"; mkdir -p "$tmp/node$port"
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --cluster-enabled yes --cluster-config-file "$tmp/node$port/nodes.conf" \
            --dir "$tmp/node$port" --pidfile "$tmp/node$port/pid" --daemonize yes >/dev/null
    done
    for ((i = 0; i < n; i++)); do
        local port=$((CLUSTER_BASE + i))
        for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
        redis-cli -p "$port" cluster addslotsrange $((16384 * i / n)) $((16384 * (i + 1) / n - 1)) >/dev/null
        [ "$i" = 0 ] || redis-cli -p "$port" cluster meet 127.0.0.1 "$CLUSTER_BASE" >/dev/null
    done
    for _ in $(seq 100); do
        local ok=0
        for ((i = 0; i < n; i++)); do
            redis-cli -p $((CLUSTER_BASE + i)) cluster info | grep -q cluster_state:ok && ok=$((ok + 1))
        done
        [ "$ok" = "$n" ] && return
        sleep 0.1
    done
    echo "the cluster did not become ok" >&2; exit 1
}
stop_cluster() { # masters
    local n=$1 i
    for ((i = 0; i < n; i++)); do redis-cli -p $((CLUSTER_BASE + i)) shutdown nosave >/dev/null 2>&1 || true; done
    for ((i = 0; i < n; i++)); do
        while [ -f "$tmp/node$((CLUSTER_BASE + i))/pid" ] && kill -0 "$(cat "$tmp/node$((CLUSTER_BASE + i))/pid")" 2>/dev/null; do sleep 0.1; done
    done
}

fleet_config() { # target i
    local store="url = \"redis://127.0.0.1:$REDIS_PORT/0\""
    [ "$1" = cluster ] && store="cluster = [\"redis://127.0.0.1:$CLUSTER_BASE\"]"
    cat <<TOML
[server]
listen = "127.0.0.1:$((FLEET_BASE + 2 * $2))"
worker_threads = 1
[admin]
listen = "127.0.0.1:$((FLEET_BASE + 2 * $2 + 1))"
[identity]
trusted_proxies = ["127.0.0.1/32"]
[log]
access = "off"
[store]
backend = "redis"
$store
timeout = "500ms"
on_error = "deny"
[policies.open]
anonymous = { per_second = 1_000_000_000 }
[[routes]]
name = "bench"
path_prefix = "/"
respond = { status = 200, body = "ok\n" }
policy = "open"
TOML
}

# utime + stime (clock ticks) of the given pids, summed.
ticks() { for pid in "$@"; do awk '{print $14 + $15}' "/proc/$pid/stat"; done | awk '{s += $1} END {print s + 0}'; }

scale_run() { # target [masters] -> "decisions/s us-redis-cpu-per-decision redis-cpu-percent
              #   us-busiest-redis-cpu-per-decision us-sluice-cpu-per-decision"
    local target=$1 masters=${2:-1} redis_pids=() fleet=() i
    if [ "$target" = cluster ]; then
        start_cluster "$masters"
        for ((i = 0; i < masters; i++)); do redis_pids+=("$(cat "$tmp/node$((CLUSTER_BASE + i))/pid")"); done
    else
        redis-cli -p "$REDIS_PORT" flushall >/dev/null
        redis_pids+=("$(redis-cli -p "$REDIS_PORT" info server | awk -F: '/^process_id:/ {print $2+0}')")
    fi
    for i in 0 1 2 3; do
        fleet_config "$target" "$i" > "$tmp/fleet$i.toml"
        SLUICE_LOG=warn "$BIN" run -c "$tmp/fleet$i.toml" 2>>"$tmp/sluice.log" &
        fleet+=($!)
    done
    for i in 0 1 2 3; do
        local port=$((FLEET_BASE + 2 * i))
        for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
        curl -sf -o /dev/null "http://127.0.0.1:$port/" || { echo "replica $i ($target) did not answer" >&2; exit 1; }
    done
    local lua=benches/proxy/xff.lua loads=()
    for i in 0 1 2 3; do
        CALLERS=$CALLERS wrk -t1 -c"$FLEET_CONNS" -d2s -s "$lua" "http://127.0.0.1:$((FLEET_BASE + 2 * i))/" >/dev/null &
        loads+=($!)
    done
    wait "${loads[@]}"
    local before started busiest_before=() pid sluice_before perf_pid= ports=("$REDIS_PORT") port
    [ "$target" = cluster ] && { ports=(); for ((i = 0; i < masters; i++)); do ports+=($((CLUSTER_BASE + i))); done; }
    for port in "${ports[@]}"; do redis-cli -p "$port" config resetstat >/dev/null; done
    before=$(ticks "${redis_pids[@]}"); started=$(date +%s.%N)
    for pid in "${redis_pids[@]}"; do busiest_before+=("$(ticks "$pid")"); done
    sluice_before=$(ticks "${fleet[@]}")
    if [ -n "${PERF:-}" ]; then
        mkdir -p "$PERF"
        local name=one; [ "$target" = cluster ] && name=cluster-$masters
        perf record -q -g -o "$PERF/$name.data" -p "${fleet[0]}" -- sleep "${DURATION%s}" >/dev/null 2>&1 &
        perf_pid=$!
    fi
    loads=()
    for i in 0 1 2 3; do
        CALLERS=$CALLERS wrk -t1 -c"$FLEET_CONNS" -d"$DURATION" -s "$lua" \
            "http://127.0.0.1:$((FLEET_BASE + 2 * i))/" > "$tmp/fleet-wrk$i.txt" &
        loads+=($!)
    done
    wait "${loads[@]}"
    local after elapsed requests errors busiest=0 sluice_ticks
    after=$(ticks "${redis_pids[@]}"); elapsed=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {print e - s}')
    sluice_ticks=$(($(ticks "${fleet[@]}") - sluice_before))
    for i in "${!redis_pids[@]}"; do
        local used=$(($(ticks "${redis_pids[$i]}") - busiest_before[i]))
        [ "$used" -gt "$busiest" ] && busiest=$used
    done
    [ -n "$perf_pid" ] && wait "$perf_pid" 2>/dev/null || true
    requests=$(cat "$tmp"/fleet-wrk?.txt | awk '/ requests in / {s += $1} END {print s}')
    local calls=0 usec=0 c u
    for port in "${ports[@]}"; do
        read -r c u < <(redis-cli -p "$port" info commandstats | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $2, $4}')
        calls=$((calls + ${c:-0})) usec=$((usec + ${u:-0}))
    done
    awk -v r="$requests" -v c="$calls" -v u="$usec" -v t="$target" -v m="$masters" 'BEGIN {
        printf "  %s (%d): %d script calls, %.1f decisions per call, %.1f us inside the script per call (wall time)\n",
            t, m, c, r / c, u / c }' >&2
    errors=$(cat "$tmp"/fleet-wrk?.txt | awk '/Non-2xx/ {s += $NF} END {print s + 0}')
    [ "$errors" = 0 ] || echo "  $target: $errors answers other than 200" >&2
    for pid in "${fleet[@]}"; do kill "$pid"; wait "$pid" 2>/dev/null || true; done
    [ "$target" = cluster ] && stop_cluster "$masters"
    local hz; hz=$(getconf CLK_TCK)
    awk -v r="$requests" -v t="$((after - before))" -v hz="$hz" -v e="$elapsed" -v d="${DURATION%s}" \
        -v b="$busiest" -v s="$sluice_ticks" 'BEGIN {
        printf "%.0f %.2f %.0f %.2f %.2f\n", r / d, t / hz * 1e6 / r, t / hz / e * 100,
            b / hz * 1e6 / r, s / hz * 1e6 / r }'
}

if [[ " $WORKLOADS " == *" scale "* ]]; then
    declare -A rates=() sluice=() redis=() busy=()
    targets=(one); for m in $MASTERS; do targets+=("cluster-$m"); done
    report() { # target rate redis-us use busiest-us sluice-us round
        local what="one redis-server" n=${1#cluster-}
        [ "$1" = one ] || what="$n-master cluster"
        echo "scale round $7: $what: $2 decisions/s, sluice $6 us CPU per decision (4 replicas), redis $3 us CPU per decision ($4 % of a core), busiest redis-server $5 us (ceiling $(awk -v b="$5" 'BEGIN {printf "%.0f", 1e6 / b}') decisions/s)"
    }
    for round in $(seq "$ROUNDS"); do
        for t in "${targets[@]}"; do
            if [ "$t" = one ]; then
                read -r rate cpu use top own < <(scale_run one)
            else
                read -r rate cpu use top own < <(scale_run cluster "${t#cluster-}")
            fi
            rates[$t]+=" $rate"; redis[$t]+=" $cpu"; busy[$t]+=" $top"; sluice[$t]+=" $own"
            report "$t" "$rate" "$cpu" "$use" "$top" "$own" "$round"
        done
    done
    # shellcheck disable=SC2086
    o=$(median ${rates[one]})
    for t in "${targets[@]}"; do
        # shellcheck disable=SC2086
        r=$(median ${rates[$t]}) b=$(median ${busy[$t]})
        # shellcheck disable=SC2086
        echo "scale median: $t: $r decisions/s ($(awk -v r="$r" -v o="$o" 'BEGIN {printf "%.2f", r/o}')x one server), sluice $(median ${sluice[$t]}) us CPU each, redis $(median ${redis[$t]}) us CPU each, busiest redis-server $b us each (ceiling $(awk -v b="$b" 'BEGIN {printf "%.0f", 1e6 / b}') decisions/s)"
    done
    WORKLOADS=${WORKLOADS//scale/}
fi

# ---- wait: the cost of [store] wait_replicas = 1 (WAIT after each script call) ----
WAIT_REPLICA_PORT=${WAIT_REPLICA_PORT:-18194}

wait_run() { # wait_replicas -> req/s
    config redis direct | sed "s/^backend = \"redis\"/backend = \"redis\"\nwait_replicas = $1\ntimeout = \"500ms\"/" > "$tmp/wait.toml"
    SLUICE_LOG=warn "$BIN" run -c "$tmp/wait.toml" 2>>"$tmp/sluice.log" &
    local pid=$!
    for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/" || { echo "sluice (wait $1) did not answer" >&2; exit 1; }
    wrk -t1 -c32 -d2s "http://127.0.0.1:$PORT/" >/dev/null
    wrk -t1 -c32 -d"$DURATION" "http://127.0.0.1:$PORT/" > "$tmp/wrk.txt"
    grep -q Non-2xx "$tmp/wrk.txt" && grep Non-2xx "$tmp/wrk.txt" >&2
    awk '/^Requests\/sec/ {print $2}' "$tmp/wrk.txt"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

if [[ " $WORKLOADS " == *" wait "* ]]; then
    redis-server --port "$WAIT_REPLICA_PORT" --bind 127.0.0.1 --save "" --appendonly no \
        --replicaof 127.0.0.1 "$REDIS_PORT" --dir "$tmp" --dbfilename replica.rdb \
        --pidfile "$tmp/replica.pid" --daemonize yes >/dev/null
    for _ in $(seq 100); do
        redis-cli -p "$WAIT_REPLICA_PORT" info replication | grep -q master_link_status:up && break
        sleep 0.1
    done
    plain=() waiting=()
    for round in $(seq "$ROUNDS"); do
        plain+=("$(wait_run 0)"); waiting+=("$(wait_run 1)")
        echo "wait round $round: wait_replicas = 0: ${plain[-1]} req/s, wait_replicas = 1: ${waiting[-1]} req/s"
    done
    p=$(median "${plain[@]}"); w=$(median "${waiting[@]}")
    echo "wait median: wait_replicas = 0: $p req/s, 1: $w req/s, cost $(awk -v p="$p" -v w="$w" 'BEGIN {printf "%.2f", p/w}')x"
    redis-cli -p "$WAIT_REPLICA_PORT" shutdown nosave >/dev/null 2>&1 || true
    WORKLOADS=${WORKLOADS//wait/}
fi

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
