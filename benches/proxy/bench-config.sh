# Shared by before-after.sh and callgrind.sh (sourced): the sluice config both
# measure, one worker thread and one route "/" with policy "bench" to the nginx
# upstream on port $UP; the access log off unless ACCESS_LOG is json or text.
# OLD_BUILD=1 leaves out the [log] section, for builds from before it existed (they
# log no access lines).
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
policy = "bench"
${6:-}
EOF
}

# Limits that never trip (per-window limits must fit u32).
NEVER='{ per_second = 1_000_000_000 }'

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
