# Shared by before-after.sh, callgrind.sh and usage-scanner.sh (sourced): the sluice config both
# measure, one worker thread and one route "/" with policy "bench" to the nginx
# upstream on port $UP; the access log off unless ACCESS_LOG is json or text.
# OLD_BUILD=1 leaves out the [log] section, for builds from before it existed (they
# log no access lines). BENCH_POLICY replaces the route's policy (a list of policies:
# the stacked scenario).
#
#   sluice_bench_config PORT ADMIN_PORT ANONYMOUS_LIMIT [SERVER_LINES] [POLICY_LINES] [ROUTE_LINES]
sluice_bench_config() {
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
worker_threads = 1
${4:-}
[admin]
listen = "127.0.0.1:$2"
$([ "${OLD_BUILD:-0}" = 1 ] || printf '[log]\naccess = "%s"' "${ACCESS_LOG:-off}")
[upstreams.up]
targets = ["http://127.0.0.1:$UP"]
[policies.bench]
anonymous = $3
${5:-}
[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
policy = ${BENCH_POLICY:-\"bench\"}
${6:-}
EOF
}

# Limits that never trip (per-window limits must fit u32).
NEVER='{ per_second = 1_000_000_000 }'

# Prints the first of COUNT consecutive loopback ports nobody listens on or connects
# from, trying blocks of 100 from a base picked at random in 20000-39999 (the machine
# may run other benchmarks and tests at once).
#
#   base=$(free_port_block COUNT)
free_port_block() {
    local count=$1 base try off busy
    base=$((20000 + (RANDOM % 200) * 100))
    for try in $(seq 50); do
        busy=0
        for off in $(seq 0 $((count - 1))); do
            if [ -n "$(ss -Htan "( sport = :$((base + off)) or dport = :$((base + off)) )" 2>/dev/null)" ] ||
                (exec 3<>"/dev/tcp/127.0.0.1/$((base + off))") 2>/dev/null; then
                busy=1
                break
            fi
        done
        [ $busy = 0 ] && { echo "$base"; return 0; }
        base=$((20000 + (base - 20000 + 100) % 20000))
    done
    echo "no block of $count free ports found" >&2
    return 1
}

# A loopback port free when asked (the kernel's pick), for benches that may run
# beside others.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts the shared nginx upstream (upstream-nginx.conf.in) on port $UP, serving
# from $TMP, in the background; its pid is added to PIDS.
start_upstream() {
    sed -e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|$UP|g" \
        "$HERE/upstream-nginx.conf.in" >"$TMP/up.conf"
    mkdir -p "$TMP/upstream-body"
    nginx -e "$TMP/up.err" -p "$TMP" -c "$TMP/up.conf" &
    PIDS+=($!)
}

# A temporary directory $TMP for the run, and $PIDS, the background processes the
# script starts: both cleaned up when the script exits.
bench_workspace() {
    TMP=$(mktemp -d)
    PIDS=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
