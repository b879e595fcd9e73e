#!/usr/bin/env bash
# The decision listener under load: Envoy rate limit service decisions per second
# and CPU per decision (h2load, one RateLimitRequest per call, 1 and 64 concurrent
# streams on one connection), in memory and Redis mode; and forward auth through a
# real nginx (auth_request -> sluice) against nginx proxying alone (wrk).
#
#   benches/decision.sh [path/to/sluice]     (default: target/release/sluice)
#
# Needs h2load (Debian nghttp2-client), wrk, nginx and redis-server. Every call is
# admitted (the limits are far above the load), so each is a full decision: match
# the descriptor, count it in the store, answer. CPU is the sluice process's user +
# system time (/proc/PID/stat) over the run, divided by the calls it answered.
#
# Environment: CALLS [200000] per RLS run; DURATION [10s] per wrk run;
# CONNECTIONS [32] for wrk. CALLGRIND=1 instead counts instructions: one sluice
# (memory store) under valgrind's callgrind, instrumented only while it answers
# CALLS (say 2000) calls on one stream, prints instructions per decision and keeps
# the profile (callgrind_annotate --inclusive=yes FILE) for where they go: steady
# on a busy machine, where the CPU times above are not.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE=${1:-target/release/sluice}
CALLS=${CALLS:-200000}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-32}
for tool in h2load wrk nginx redis-server; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || {
        echo "needs $tool"; exit 1; }
done
[ -x "$SLUICE" ] || { echo "no $SLUICE: cargo build --release"; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 "${WAIT_TRIES:-200}"); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on port $1"; exit 1; }
# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)

# One RateLimitRequest, gRPC-framed: domain "bench", one descriptor
# [remote_address=10.0.0.1] (37 bytes of protobuf).
printf '\x00\x00\x00\x00\x25\x0a\x05bench\x12\x1c\x0a\x1a\x0a\x0eremote_address\x12\x0810.0.0.1' > "$tmp/call.bin"

mkdir -p "$tmp/ratelimit"
cat > "$tmp/ratelimit/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
EOF

# Starts sluice with [decision] on $1 and the extra config $2; sets SLUICE_PID.
start_sluice() {
    local decision=$1 extra=$2 port admin
    port=$(free_port); admin=$(free_port)
    cat > "$tmp/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
[admin]
listen = "127.0.0.1:$admin"
[log]
access = "off"
[decision]
listen = "127.0.0.1:$decision"
envoy_config = ["ratelimit/*.yaml"]
h2_max_streams = 128
[identity]
trusted_proxies = ["127.0.0.1/32"]
[policies.standard]
anonymous = { per_second = 4000000000 }
[[routes]]
name = "api"
path_prefix = "/"
policy = "standard"
$extra
EOF
    ${WRAP:-} "$SLUICE" run -c "$tmp/gateway.toml" 2>"$tmp/sluice.log" &
    SLUICE_PID=$!
    pids+=("$SLUICE_PID")
    wait_port "$decision"
}

# h2load's calls/s for $2 concurrent streams against port $1, and CPU us/call.
rls_run() {
    local port=$1 streams=$2 before after out rps
    # Warm-up.
    h2load -n 5000 -c 1 -m "$streams" -d "$tmp/call.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >/dev/null
    before=$(cpu_ticks "$SLUICE_PID")
    out=$(h2load -n "$CALLS" -c 1 -m "$streams" -d "$tmp/call.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
    after=$(cpu_ticks "$SLUICE_PID")
    # h2load: "requests: N total, N started, N done, N succeeded, 0 failed, 0 errored, 0 timeout".
    echo "$out" | grep -Eq "^requests: .* 0 failed, 0 errored" || { echo "$out"; exit 1; }
    rps=$(echo "$out" | awk '/^finished in/ {print $4}')
    awk -v rps="$rps" -v t=$((after - before)) -v tick="$TICK" -v n="$CALLS" -v m="$streams" \
        'BEGIN { printf "  %2d streams: %10.0f decisions/s  %6.2f us CPU/decision\n", m, rps, t / tick * 1e6 / n }'
}

# Instructions per decision under callgrind (CALLGRIND=1), instrumented only
# while the calls are answered.
if [ -n "${CALLGRIND:-}" ]; then
    port=$(free_port)
    profile=${PROFILE:-callgrind.decision.out}
    WRAP="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$profile"
    WAIT_TRIES=1200
    start_sluice "$port" ""
    for _ in $(seq 1 600); do callgrind_control -i on "$SLUICE_PID" >/dev/null 2>&1 && break; sleep 0.1; done
    h2load -n "$CALLS" -c 1 -m 1 -d "$tmp/call.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" | grep '^requests:'
    callgrind_control -i off "$SLUICE_PID" >/dev/null 2>&1
    kill "$SLUICE_PID"; wait "$SLUICE_PID" 2>/dev/null || true
    total=$(callgrind_annotate "$profile" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    awk -v t="$total" -v n="$CALLS" 'BEGIN { printf "  %.0f instructions per decision (%d calls, 1 stream)\n", t / n, n }'
    echo "  profile: $profile"
    exit 0
fi

echo "== Envoy RLS, memory store ($CALLS calls a run)"
port=$(free_port)
start_sluice "$port" ""
rls_run "$port" 1
rls_run "$port" 64
kill "$SLUICE_PID"; wait "$SLUICE_PID" 2>/dev/null || true

echo "== Envoy RLS, Redis store (a private redis-server)"
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
pids+=($!)
wait_port "$redis_port"
port=$(free_port)
start_sluice "$port" "[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\""
rls_run "$port" 1
rls_run "$port" 64
kill "$SLUICE_PID"; wait "$SLUICE_PID" 2>/dev/null || true

echo "== forward auth: nginx auth_request -> sluice vs nginx alone (wrk -c $CONNECTIONS, $DURATION)"
decision=$(free_port)
start_sluice "$decision" ""
front=$(free_port); alone=$(free_port); app=$(free_port)
sed -e "s/listen 8080;/listen 127.0.0.1:$front;/" -e "s/127.0.0.1:8081/127.0.0.1:$decision/" \
    -e "s/127.0.0.1:3000/127.0.0.1:$app/" examples/proxies/nginx.conf > "$tmp/site.conf"
cat > "$tmp/nginx.conf" <<EOF
worker_processes 1;
error_log $tmp/error.log;
pid $tmp/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  include $tmp/site.conf;
  # The app: nginx answering itself.
  server { listen 127.0.0.1:$app; location / { return 200 "ok\n"; } }
  # nginx alone, proxying to the same app.
  server { listen 127.0.0.1:$alone; location / { proxy_pass http://127.0.0.1:$app; } }
}
EOF
"$NGINX" -g 'daemon off;' -p "$tmp" -c "$tmp/nginx.conf" &
pids+=($!)
wait_port "$front"; wait_port "$alone"
wrk_rps() { wrk -t1 -c "$CONNECTIONS" -d "$DURATION" "http://127.0.0.1:$1/api/items" | awk '/^Requests\/sec/ {print $2}'; }
wrk -t1 -c "$CONNECTIONS" -d 2s "http://127.0.0.1:$front/api/items" >/dev/null
with=$(wrk_rps "$front")
without=$(wrk_rps "$alone")
awk -v a="$with" -v b="$without" 'BEGIN {
    printf "  nginx -> sluice (auth_request): %8.0f req/s\n  nginx alone:                    %8.0f req/s\n  ratio: %.2f\n", a, b, a / b }'
