#!/usr/bin/env bash
# Resident memory per idle keep-alive connection: sluice, nginx and HAProxy, each in
# front of the same nginx upstream, one worker each, everything on loopback.
#
#   benches/proxy/idle-conns.sh
#
# For each protocol (plain HTTP/1.1, HTTP/1.1 over TLS 1.3 with one ECDSA P-256
# certificate made with openssl for all three, HTTP/2 with prior knowledge) and each
# server, started afresh: a few warm-up requests, the server's resident size (VmRSS
# summed over its processes), then COUNT connections each making one proxied
# request and staying open and idle (idle-client.py), the resident size again.
# Printed: (RSS after - RSS before) / COUNT, in bytes per idle connection.
#
# Protocol ws (PROTOS="ws"): an idle open WebSocket instead, each having sent one
# message and had its echo (ws-bench.py, an echo server it also runs as the
# upstream): a proxy then holds two connections per socket, the client's and the
# upstream's (sluice's route has websocket = true; nginx passes Upgrade on;
# HAProxy tunnels after the 101).
#
# Environment (defaults in brackets):
#   COUNT [8000]          idle connections per measurement
#   PROTOS ["http1 tls h2c"]   which protocols (also: ws)
#   SERVERS ["sluice nginx haproxy"]   which servers
#   SETTLE [4]            seconds to wait after the last connection went idle (sluice
#                         hands an idle HTTP/1 connection's hyper state back after 1-2 s,
#                         and each worker returns freed memory to the system once a second)
#   PORT_BASE [19080]     first port tried; the next free block of 100 is used
#   SLUICE_BIN            use this binary instead of building target/dist/sluice
#   NO_BUILD=1            do not run cargo build --profile dist
#   KEEP_TMP=1            keep the temp dir (configs, logs)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
COUNT=${COUNT:-8000}
PROTOS=${PROTOS:-http1 tls h2c}
SERVERS=${SERVERS:-sluice nginx haproxy}
SETTLE=${SETTLE:-4}
PORT_BASE=${PORT_BASE:-19080}

log() { printf '%s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

PATH=$PATH:/usr/sbin:/sbin
need_install=()
command -v nginx >/dev/null || need_install+=(nginx)
command -v haproxy >/dev/null || need_install+=(haproxy)
command -v openssl >/dev/null || need_install+=(openssl)
command -v python3 >/dev/null || need_install+=(python3)
if [ ${#need_install[@]} -gt 0 ]; then
    log "installing ${need_install[*]} with apt-get"
    apt-get install -y "${need_install[@]}" >/dev/null || die "could not install ${need_install[*]}"
fi

# Each server holds COUNT client connections plus its upstream ones (COUNT more for
# WebSockets); the client holds COUNT.
want=$((2 * COUNT + 500))
[ "$(ulimit -Hn)" -ge "$want" ] || die "the descriptor limit ($(ulimit -Hn)) is below $want: lower COUNT"
ulimit -n "$(ulimit -Hn)"

if [ -z "${SLUICE_BIN:-}" ]; then
    if [ -z "${NO_BUILD:-}" ]; then
        (cd "$REPO" && cargo build --profile dist --quiet) || die "cargo build --profile dist failed"
    fi
    SLUICE_BIN=$REPO/target/dist/sluice
fi
[ -x "$SLUICE_BIN" ] || die "no sluice binary at $SLUICE_BIN"

TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [ -n "${KEEP_TMP:-}" ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=$PORT_BASE
for _ in $(seq 20); do
    busy=0
    for off in 0 1 2 3 4; do
        if port_busy $((base + off)); then busy=1; fi
    done
    [ $busy = 0 ] && break
    base=$((base + 100))
done
[ $busy = 0 ] || die "no free block of ports from $PORT_BASE (set PORT_BASE)"
UPSTREAM_PORT=$base PLAIN_PORT=$((base + 1)) TLS_PORT=$((base + 2)) ADMIN_PORT=$((base + 3))
WS_PORT=$((base + 4))

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$TMP/openssl.log" ||
    { cat "$TMP/openssl.log" >&2; die "openssl could not make the benchmark certificate"; }
cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/combined.pem"

sed -e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" \
    "$HERE/upstream-nginx.conf.in" >"$TMP/upstream-nginx.conf"
mkdir -p "$TMP/nginx"

# sluice: one worker, the route "/" to the upstream under a policy that never trips,
# keep-alive connections kept open as long as nginx's (75 s) and longer.
cat >"$TMP/sluice.toml" <<EOF
[server]
listen = "127.0.0.1:$PLAIN_PORT"
worker_threads = 1
max_connections = $want
header_timeout = "300s"
idle_timeout = "300s"

[server.tls]
listen = ["127.0.0.1:$TLS_PORT"]
cert = "$TMP/cert.pem"
key = "$TMP/key.pem"

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[log]
access = "off"

[store]
backend = "memory"

[upstreams.up]
targets = ["http://127.0.0.1:$UPSTREAM_PORT"]

[upstreams.ws]
targets = ["http://127.0.0.1:$WS_PORT"]

[policies.bench]
anonymous = { per_second = 1_000_000_000 }

[[routes]]
name = "ws"
path_prefix = "/ws"
upstream = "ws"
policy = "bench"
websocket = true

[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
policy = "bench"
EOF

# nginx: one worker, limit_req that never trips, as in compare.sh.
nginx_conf() { # listen-suffix
    cat <<EOF
daemon off;
worker_processes 1;
worker_rlimit_nofile $want;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log error;
events { worker_connections $want; }
http {
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 100000000;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
    limit_req_zone \$binary_remote_addr zone=limited:10m rate=10000000r/s;
    limit_req_status 429;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    server {
        listen 127.0.0.1:$1 backlog=4096;
        ssl_certificate $TMP/cert.pem;
        ssl_certificate_key $TMP/key.pem;
        ssl_protocols TLSv1.3;
        location / {
            limit_req zone=limited burst=1000 nodelay;
            proxy_pass http://up;
        }
        location /ws {
            limit_req zone=limited burst=1000 nodelay;
            proxy_pass http://127.0.0.1:$WS_PORT;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 300s;
        }
    }
}
EOF
}

# HAProxy: one thread, a stick-table rate counter that never trips, as in compare.sh.
haproxy_conf() { # bind-suffix
    cat <<EOF
global
    nbthread 1
    maxconn $want
defaults
    mode http
    option http-keep-alive
    option forwardfor
    timeout connect 2s
    timeout client 300s
    timeout server 30s
    timeout http-keep-alive 300s
frontend limited
    bind 127.0.0.1:$1
    stick-table type ip size 100k expire 60s store http_req_rate(1s)
    http-request track-sc0 src
    http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }
    use_backend ws if { path_beg /ws }
    default_backend up
backend up
    server up1 127.0.0.1:$UPSTREAM_PORT
backend ws
    timeout tunnel 300s
    server ws1 127.0.0.1:$WS_PORT
EOF
}

wait_port() { # port pid logfile
    for _ in $(seq 100); do
        kill -0 "$2" 2>/dev/null || { tail -20 "$3" >&2; die "a server exited during start-up"; }
        port_busy "$1" && return 0
        sleep 0.1
    done
    tail -20 "$3" >&2
    die "nothing listens on 127.0.0.1:$1 after 10 s"
}

# VmRSS in bytes of pid and its descendants.
rss() {
    local pids total=0 pid kb
    pids=$(ps -o pid= --ppid "$1" 2>/dev/null || true)
    for pid in $1 $pids; do
        kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
        total=$((total + ${kb:-0}))
    done
    echo $((total * 1024))
}

nginx -e "$TMP/nginx/upstream.error.log" -p "$TMP" -c "$TMP/upstream-nginx.conf" \
    >"$TMP/upstream.log" 2>&1 &
UPSTREAM_PID=$!
PIDS+=("$UPSTREAM_PID")
wait_port "$UPSTREAM_PORT" "$UPSTREAM_PID" "$TMP/upstream.log"
if [[ " $PROTOS " == *" ws "* ]]; then
    python3 "$HERE/ws-bench.py" serve "$WS_PORT" >"$TMP/ws-echo.log" 2>&1 &
    WS_PID=$!
    PIDS+=("$WS_PID")
    wait_port "$WS_PORT" "$WS_PID" "$TMP/ws-echo.log"
fi

# Starts server $1 for protocol $2; sets SERVER_PID and SERVER_PORT.
start_server() {
    local server=$1 proto=$2
    SERVER_PORT=$PLAIN_PORT
    case $server in
        sluice)
            [ "$proto" = tls ] && SERVER_PORT=$TLS_PORT
            SLUICE_LOG=warn "$SLUICE_BIN" run -c "$TMP/sluice.toml" >"$TMP/server.log" 2>&1 &
            ;;
        nginx)
            local suffix=""
            [ "$proto" = tls ] && suffix=" ssl"
            [ "$proto" = h2c ] && suffix=" http2"
            nginx_conf "$PLAIN_PORT$suffix" >"$TMP/nginx.conf"
            nginx -e "$TMP/nginx/error.log" -p "$TMP" -c "$TMP/nginx.conf" >"$TMP/server.log" 2>&1 &
            ;;
        haproxy)
            local suffix=""
            [ "$proto" = tls ] && suffix=" ssl crt $TMP/combined.pem alpn http/1.1 ssl-min-ver TLSv1.3"
            [ "$proto" = h2c ] && suffix=" proto h2"
            haproxy_conf "$PLAIN_PORT$suffix" >"$TMP/haproxy.cfg"
            haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/server.log" 2>&1 &
            ;;
    esac
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_port "$SERVER_PORT" "$SERVER_PID" "$TMP/server.log"
}

stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
}

# The idle client of protocol $1: to 127.0.0.1:$2, $3 connections.
client() { # proto port count
    case $1 in
        ws) python3 "$HERE/ws-bench.py" idle 127.0.0.1 "$2" /ws "$3" ;;
        *) python3 "$HERE/idle-client.py" "$1" 127.0.0.1 "$2" "$3" ;;
    esac
}

# One measurement: prints bytes per idle connection.
measure() { # server proto
    start_server "$1" "$2"
    # Warm-up: the upstream pool, TLS and HTTP/2 state, the allocator's first pages.
    # As many connections as the client opens at once, three times over, so the
    # upstream pool already holds what the measured run needs (its idle upstream
    # connections are not the clients').
    client "$2" "$SERVER_PORT" 300 </dev/null >/dev/null
    sleep 1
    local before after ready
    before=$(rss "$SERVER_PID")
    mkfifo "$TMP/hold"
    client "$2" "$SERVER_PORT" "$COUNT" <"$TMP/hold" >"$TMP/client.out" 2>"$TMP/client.err" &
    local client=$!
    exec 4>"$TMP/hold"
    for _ in $(seq 600); do
        grep -q '^ready' "$TMP/client.out" && break
        kill -0 "$client" 2>/dev/null || break
        sleep 0.2
    done
    ready=$(awk '/^ready/ {print $2}' "$TMP/client.out")
    sleep "$SETTLE"
    after=$(rss "$SERVER_PID")
    echo >&4
    exec 4>&-
    wait "$client" || true
    rm -f "$TMP/hold"
    stop_server
    if [ "${ready:-0}" != "$COUNT" ]; then
        log "$1 $2: only ${ready:-0} of $COUNT connections made one request and stayed: $(head -c 300 "$TMP/client.err")"
        echo "-"
        return
    fi
    echo $(((after - before) / COUNT))
}

rev=$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "bytes of resident memory per idle keep-alive connection, $COUNT connections, one proxied request each"
echo "sluice ($rev) vs $(nginx -v 2>&1 | sed 's/.*version: //') vs HAProxy $(haproxy -v | awk 'NR==1 {print $3}')"
printf '%-8s' protocol
for s in $SERVERS; do printf '%10s' "$s"; done
echo
for p in $PROTOS; do
    printf '%-8s' "$p"
    for s in $SERVERS; do printf '%10s' "$(measure "$s" "$p")"; done
    echo
done
