#!/usr/bin/env bash
# Reproducible throughput/latency comparison of sluice against nginx (limit_req)
# and HAProxy (stick-table rate counter), all in front of the same nginx upstream,
# one worker each, everything on loopback.
#
#   benches/proxy/compare.sh            full run (DURATION=10s, ROUNDS=3)
#   benches/proxy/compare.sh --smoke    1 s per server, 1 round: checks that every
#                                       server starts and answers as expected (CI)
#   benches/proxy/compare.sh --profile  perf profile + syscall counts of one server
#                                       under wrk load (default: sluice, proxied)
#
# Scenarios (wrk -t1 -c32, interleaved rounds after a warm-up, medians reported):
#   proxied  limits configured but never tripping; also direct-to-upstream,
#            sluice with the same route without a policy (the limiter tax), and
#            sluice with its JSON access log on (off elsewhere, as nginx's is)
#   reject   every request over a tiny limit (1/minute): 429 from all three; and
#            sluice's 503 for a full concurrency cap (max = 1, no queue, its one slot
#            held by a client that never reads its response), beside its 429; and
#            sluice's 403 for a banned caller (a manual ban of 127.0.0.1 made
#            through the admin API), which must be at least as fast as its 429
#   xff      callers from X-Forwarded-For sent by a trusted proxy (loopback):
#            one caller vs CALLERS (1 000 000) distinct callers, same wrk Lua script
#   tls      the proxied scenario over TLS keep-alive connections (wrk https):
#            sluice's rustls listener vs nginx `ssl`, the same ECDSA P-256
#            certificate (made with openssl at start) and TLS 1.3
#   h2       the proxied scenario over HTTP/2 without TLS (h2c, prior knowledge):
#            h2load -c CONNECTIONS -m 10 against sluice and nginx (`listen http2`);
#            the p50 column shows h2load's mean, p99 is not measured
#   reload   the proxied scenario while sluice's config file is rewritten every
#            second (each a real reload: the file watcher compiles and swaps it),
#            beside the same sluice without reloads: errors and the dip
#   status   the proxied scenario while the status page is open on the admin
#            listener (its HTML once, then GET /admin/status every 2 s, as the
#            page's script does), beside the same sluice without it
#   features what this round's features cost, sluice against sluice, all proxied to
#            the same upstream with limits that never refuse: a consumer's API key
#            vs a cached RS256 JWT (a token made with openssl at start, verified
#            once); the default key (the client IP) vs a keyed policy
#            (key = ["header:x-tenant"], wrk sending the header); the enforced
#            policy vs the same in mode = "shadow", with limits that never trip and
#            with limits every request is over (each a would-be refusal, counted
#            and logged, none refused); an 86-byte JSON answer with a usage field
#            (/usage) without and with cost_after = "json:usage.total_tokens"; one
#            policy vs three stacked on the route, each under its own key (the
#            client IP, the path's first segment)
#   ws       WebSocket echo messages (not in the default list): ws-bench.py's load
#            client (CONNECTIONS sockets, each a 32-byte message and its echo,
#            again and again) through sluice (a websocket = true route; and the same
#            with a message limit that never trips) and nginx (proxy_pass with
#            Upgrade) to ws-bench.py's echo server, and direct to it; a message is
#            a "request" in the table. The Python peers bound the messages per
#            second alike for all: CPU/req (per message) compares the proxies.
#   grpc     gRPC unary calls (not in the default list): h2load -c CONNECTIONS
#            -m 10 with a length-prefixed message (content-type application/grpc,
#            te: trailers) to /greet.Greeter/SayHello, through sluice (protocol =
#            "h2") and nginx grpc_pass to the same grpcio greeter
#            (tests/protocols/greeter.py, needs grpcio); the greeter bounds the
#            calls per second alike: CPU/req compares the proxies
#   h2up     plain requests (wrk) through sluice to an HTTP/1.1 upstream vs to an
#            HTTP/2 one (protocol = "h2", h2c): one nginx worker with both
#            listeners (not in the default list)
#
# Environment (defaults in brackets):
#   DURATION [10s]    length of one measured wrk run (s or m suffix)
#   ROUNDS [3]        measured rounds per server, interleaved
#   WARMUP [3s]       warm-up run per server before the rounds (0 = none)
#   CONNECTIONS [32] THREADS [1]   wrk -c / -t
#   CALLERS [1000000] distinct X-Forwarded-For addresses in the xff scenario
#   SCENARIOS ["proxied reject xff tls h2 reload status features"]  which scenarios to run,
#                     in order; also ws, grpc and h2up (SCENARIOS="ws grpc h2up")
#   PORT_BASE [18080] first port tried; the next free block of 100 is used
#   SLUICE_BIN        use this binary instead of building REPO/target/dist/sluice
#   NO_BUILD=1        do not run cargo build --profile dist (use the existing binary)
#   KEEP_TMP=1        keep the temp dir (configs, logs, raw wrk output, perf.data)
#   QUIET_WAIT [0]    before each run wait up to this many seconds for the machine
#                     to be under QUIET_MAX [10] % busy (useful on a shared machine)
#   RETRIES [0]       run a round again (at most this many times) when processes
#                     not started here took more than NOISY [15] % of the machine
#   PROFILE_SERVER [sluice]     --profile: sluice | nginx | haproxy | upstream
#   PROFILE_SCENARIO [proxied]  --profile: proxied | nopolicy | reject | xff
#   PROFILE_SECONDS [8]         --profile: seconds of perf record
#   PROFILE_CALLGRAPH [fp]      --profile: perf --call-graph; "dwarf" gives callers
#                               inside sluice (release builds have no frame pointers)
#
# Columns: req/s, p50, p99 (wrk --latency), non-2xx (share of responses), CPU/req
# (user+system CPU of the server under test per request, in microseconds: less
# sensitive to a busy machine than req/s), kernel (the system-CPU part of CPU/req:
# socket work done by the kernel for the server), other CPU (CPU used by processes not
# started here during the run, in % of the machine; a few % is loopback softirq
# accounting, above 10 % the run is noisy).
#
# Exit status: 0 every server started, answered as expected and every wrk run had
# the expected statuses; 1 a server failed to start, a check request got an
# unexpected status or wrk failed; 2 the runs finished but some had unexpected
# statuses (non-2xx on a path that should be all 200, 2xx on the rejection path).
# Nothing is pinned to a CPU: on a 2-core machine wrk, the proxy and the upstream
# share the cores, as they did for the numbers in the issue.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

MODE=full
case "${1:-}" in
    "") ;;
    --smoke) MODE=smoke ;;
    --profile) MODE=profile ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: $0 [--smoke | --profile | --help]" >&2
        exit 64
        ;;
esac

if [ "$MODE" = smoke ]; then
    DURATION=${DURATION:-1s}
    ROUNDS=${ROUNDS:-1}
    WARMUP=${WARMUP:-0}
else
    DURATION=${DURATION:-10s}
    ROUNDS=${ROUNDS:-3}
    WARMUP=${WARMUP:-3s}
fi
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-1}
CALLERS=${CALLERS:-1000000}
SCENARIOS=${SCENARIOS:-proxied reject xff tls h2 reload status features}
PORT_BASE=${PORT_BASE:-18080}
QUIET_WAIT=${QUIET_WAIT:-0}
QUIET_MAX=${QUIET_MAX:-10}
RETRIES=${RETRIES:-0}
NOISY=${NOISY:-15}
PROFILE_SERVER=${PROFILE_SERVER:-sluice}
PROFILE_SCENARIO=${PROFILE_SCENARIO:-proxied}
PROFILE_SECONDS=${PROFILE_SECONDS:-8}
PROFILE_CALLGRAPH=${PROFILE_CALLGRAPH:-fp}

log() { printf '%s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# "10s" / "10" / "1m" -> whole seconds
secs() {
    local d=$1
    case "$d" in
        *ms) echo 1 ;;
        *s) echo "${d%s}" ;;
        *m) echo $((${d%m} * 60)) ;;
        *h) echo $((${d%h} * 3600)) ;;
        *) echo "$d" ;;
    esac
}
[[ "$(secs "$DURATION")" =~ ^[0-9]+$ ]] || die "DURATION must look like 10s or 1m, not $DURATION"
[[ "$(secs "$WARMUP")" =~ ^[0-9]+$ ]] || die "WARMUP must look like 3s or 0, not $WARMUP"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
for s in $SCENARIOS; do
    case $s in proxied | reject | xff | tls | h2 | reload | status | features | ws | grpc | h2up) ;;
        *) die "unknown scenario $s (proxied, reject, xff, tls, h2, reload, status, features, ws, grpc, h2up)" ;;
    esac
done

# --- tools -----------------------------------------------------------------------

PATH=$PATH:/usr/sbin:/sbin
need_install=()
command -v nginx >/dev/null || need_install+=(nginx)
command -v haproxy >/dev/null || need_install+=(haproxy)
command -v wrk >/dev/null || need_install+=(wrk)
command -v curl >/dev/null || need_install+=(curl)
command -v openssl >/dev/null || need_install+=(openssl)
command -v h2load >/dev/null || need_install+=(nghttp2-client)
if [ "$MODE" = profile ] && ! command -v perf >/dev/null; then
    need_install+=(linux-perf)
fi
if [ ${#need_install[@]} -gt 0 ]; then
    log "installing ${need_install[*]} with apt-get"
    SUDO=
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    command -v apt-get >/dev/null || die "missing ${need_install[*]} and no apt-get"
    $SUDO apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_install[@]}" >&2 ||
        die "apt-get install ${need_install[*]} failed"
fi

if [ -n "${SLUICE_BIN:-}" ]; then
    [ -x "$SLUICE_BIN" ] || die "SLUICE_BIN=$SLUICE_BIN is not executable"
else
    if [ "${NO_BUILD:-0}" != 1 ]; then
        log "building sluice (cargo build --profile dist in $REPO)"
        (cd "$REPO" && cargo build --profile dist --bin sluice >&2) || die "cargo build --profile dist failed"
    fi
    SLUICE_BIN=$REPO/target/dist/sluice
    [ -x "$SLUICE_BIN" ] || die "$SLUICE_BIN not found (build it or set SLUICE_BIN)"
fi

# --- temp dir, processes, cleanup ------------------------------------------------

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-compare.XXXXXX")
chmod 755 "$TMP" # nginx workers run as nobody when we are root
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local pid kids=()
    # a wrk run in progress (timeout passes the signal on to wrk)
    # (|| true: under set -e a failed kill of a wrk that already ended would stop the
    # cleanup here and leave every server running)
    [ -n "${WRK_PID:-}" ] && { kill -TERM "$WRK_PID" 2>/dev/null || true; }
    for pid in "${PIDS[@]}"; do
        # nginx workers too, in case their master goes before them
        kids+=($(pgrep -P "$pid" 2>/dev/null || true))
        kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}" "${kids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}" "${kids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [ "${KEEP_TMP:-0}" = 1 ]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- ports -----------------------------------------------------------------------

port_busy() {
    if command -v ss >/dev/null; then
        [ -n "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

# Offsets inside a block of 100 ports from the base.
declare -A OFF=(
    [UPSTREAM]=0
    [SLUICE_LIMITED]=10 [SLUICE_NOPOLICY]=11 [SLUICE_REJECT]=12 [SLUICE_XFF]=13
    [SLUICE_CAPACITY]=14 [SLUICE_BANNED]=15 [SLUICE_LOGGED]=16 [SLUICE_TLS]=17
    [SLUICE_TLS_S]=18 [SLUICE_RELOAD]=19
    [ADMIN_LIMITED]=20 [ADMIN_NOPOLICY]=21 [ADMIN_REJECT]=22 [ADMIN_XFF]=23
    [ADMIN_CAPACITY]=24 [ADMIN_BANNED]=25 [ADMIN_LOGGED]=26 [ADMIN_TLS]=27 [ADMIN_RELOAD]=28
    [NGINX_LIMITED]=30 [NGINX_REJECT]=31 [NGINX_XFF]=32 [NGINX_TLS]=33 [NGINX_H2]=34
    [HAPROXY_LIMITED]=40 [HAPROXY_REJECT]=41 [HAPROXY_XFF]=42
    [SLUICE_IDENT]=50 [SLUICE_KEYED]=51 [SLUICE_SHADOW]=52 [SLUICE_SHADOWX]=53 [SLUICE_USAGE]=54
    [SLUICE_STATUS]=55 [SLUICE_STACKED]=56
    [ADMIN_IDENT]=60 [ADMIN_KEYED]=61 [ADMIN_SHADOW]=62 [ADMIN_SHADOWX]=63 [ADMIN_USAGE]=64
    [ADMIN_STATUS]=65 [ADMIN_STACKED]=66
    [WS_ECHO]=70 [PROTO_UP_H1]=71 [PROTO_UP_H2]=72 [NGINX_WS]=73 [NGINX_GRPC]=74
    [SLUICE_WS]=75 [SLUICE_WSLIM]=76 [SLUICE_GRPC]=77 [SLUICE_H1UP]=78 [SLUICE_H2UP]=79
    [ADMIN_WS]=85 [ADMIN_WSLIM]=86 [ADMIN_GRPC]=87 [ADMIN_H1UP]=88 [ADMIN_H2UP]=89
)
declare -A PORT
base=$PORT_BASE
free=0
for _ in $(seq 20); do
    free=1
    for off in "${OFF[@]}"; do
        if port_busy $((base + off)); then
            free=0
            break
        fi
    done
    [ $free = 1 ] && break
    base=$((base + 100))
done
[ $free = 1 ] || die "no free block of ports from $PORT_BASE (set PORT_BASE)"
for name in "${!OFF[@]}"; do
    PORT[$name]=$((base + ${OFF[$name]}))
done

render() { # template output NAME=value...
    local template=$1 out=$2
    shift 2
    local args=(-e "s|@TMP@|$TMP|g" -e "s|@UPSTREAM_PORT@|${PORT[UPSTREAM]}|g")
    local kv
    for kv in "$@"; do
        args+=(-e "s|@${kv%%=*}@|${kv#*=}|g")
    done
    sed "${args[@]}" "$HERE/$template" >"$out"
    if grep -q '@[A-Z_]*@' "$out"; then
        die "unreplaced placeholder in $out: $(grep -o '@[A-Z_]*@' "$out" | head -1)"
    fi
}

declare -A PID
start() { # name logfile command...
    local name=$1 logfile=$2
    shift 2
    "$@" >"$logfile" 2>&1 &
    PID[$name]=$!
    PIDS+=("$!")
}

wait_port() { # label port pid logfile
    local label=$1 port=$2 pid=$3 logfile=$4
    for _ in $(seq 100); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "error: $label exited during start-up; its log ($logfile):"
            tail -20 "$logfile" >&2 || true
            exit 1
        fi
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    log "error: $label is not listening on 127.0.0.1:$port after 10 s; its log ($logfile):"
    tail -20 "$logfile" >&2 || true
    exit 1
}

# --- configs ---------------------------------------------------------------------

# The servers' output (the logged variant's JSON lines among it) goes to a directory
# of its own: every sluice watches the directory of its config, and a log written
# beside the configs woke all their watchers at each write of its lines.
mkdir -p "$TMP/wrk" "$TMP/out"
# One certificate for both TLS listeners: ECDSA P-256, for localhost and 127.0.0.1.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$TMP/openssl.log" ||
    { cat "$TMP/openssl.log" >&2; die "openssl could not make the benchmark certificate"; }
render upstream-nginx.conf.in "$TMP/upstream-nginx.conf"
render nginx.conf.in "$TMP/nginx.conf" \
    NGINX_LIMITED_PORT="${PORT[NGINX_LIMITED]}" NGINX_REJECT_PORT="${PORT[NGINX_REJECT]}" \
    NGINX_XFF_PORT="${PORT[NGINX_XFF]}" NGINX_TLS_PORT="${PORT[NGINX_TLS]}" \
    NGINX_H2_PORT="${PORT[NGINX_H2]}"
render haproxy.cfg.in "$TMP/haproxy.cfg" \
    HAPROXY_LIMITED_PORT="${PORT[HAPROXY_LIMITED]}" HAPROXY_REJECT_PORT="${PORT[HAPROXY_REJECT]}" \
    HAPROXY_XFF_PORT="${PORT[HAPROXY_XFF]}"
# Per-window limits must fit u32: 1e9 a second never trips.
NEVER='{ per_second = 1_000_000_000 }'
sluice_config() { # variant trusted anonymous policy_line [policy_extra] [server_extra]
    render sluice.toml.in "$TMP/sluice-$1.toml" PORT="${PORT[SLUICE_${1^^}]}" \
        ADMIN_PORT="${PORT[ADMIN_${1^^}]}" TRUSTED_PROXIES="$2" ANONYMOUS="$3" POLICY_LINE="$4" \
        POLICY_EXTRA="${5:-}" SERVER_EXTRA="${6:-}" ACCESS_LOG="${ACCESS_LOG:-off}"
}
sluice_config limited "" "$NEVER" 'policy = "bench"'
sluice_config nopolicy "" "$NEVER" '# no policy: not limited'
sluice_config reject "" '{ per_minute = 1 }' 'policy = "bench"'
sluice_config xff '"127.0.0.0/8"' "$NEVER" 'policy = "bench"'
# One slot, no queue; the holder below keeps the slot for the whole run (the idle
# timeout must not cut it).
sluice_config capacity "" "$NEVER" 'policy = "bench"' 'concurrency = { max = 1, queue = 0 }' \
    'idle_timeout = "1h"'
# Limits that never trip; the caller (127.0.0.1) is banned once it runs.
sluice_config banned "" "$NEVER" 'policy = "bench"'
# The limited variant with the access log on: a JSON line per request to its log file.
ACCESS_LOG=json sluice_config logged "" "$NEVER" 'policy = "bench"'
# The limited variant with a TLS listener (its plain one is only used for the checks).
sluice_config tls "" "$NEVER" 'policy = "bench"' '' \
    "[server.tls]\nlisten = [\"127.0.0.1:${PORT[SLUICE_TLS_S]}\"]\ncert = \"$TMP/cert.pem\"\nkey = \"$TMP/key.pem\""
# The limited variant whose config file is rewritten every second during the run.
sluice_config reload "" "$NEVER" 'policy = "bench"'
# The limited variant whose status page is open (and refreshing) during the run.
sluice_config status "" "$NEVER" 'policy = "bench"'
# The features scenario. A consumer with an API key, and RS256 JWTs verified with a
# public key file: one token, made here, cached after its first verification.
API_KEY=bench-key-0123456789
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/jwt.key" 2>"$TMP/openssl.log" &&
    openssl pkey -pubout -in "$TMP/jwt.key" -out "$TMP/jwt.pem" 2>>"$TMP/openssl.log" ||
    { cat "$TMP/openssl.log" >&2; die "openssl could not make the JWT signing key"; }
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
jwt_head=$(printf '{"alg":"RS256","typ":"JWT"}' | b64url)
jwt_claims=$(printf '{"sub":"bench","exp":4000000000}' | b64url)
JWT="$jwt_head.$jwt_claims.$(printf '%s.%s' "$jwt_head" "$jwt_claims" |
    openssl dgst -sha256 -sign "$TMP/jwt.key" -binary | b64url)"
sluice_config ident "" "$NEVER" 'policy = "bench"' \
    "registered = $NEVER\n\n[identity.jwt]\nkeys = [\"$TMP/jwt.pem\"]\nalgorithms = [\"RS256\"]\n\n[[consumers]]\nname = \"keyed\"\nkey_sha256 = \"$(printf %s "$API_KEY" | sha256sum | cut -d' ' -f1)\""
# One budget per tenant, whoever calls (wrk sends one tenant).
sluice_config keyed "" "$NEVER" 'policy = "bench"' 'key = ["header:x-tenant"]'
# Shadow: limits never tripping; and every request over the limit, a would-be 429.
sluice_config shadow "" "$NEVER" 'policy = "bench"' 'mode = "shadow"'
sluice_config shadowx "" '{ per_minute = 1 }' 'policy = "bench"' 'mode = "shadow"'
# The usage scanner: every answer read for its usage (the /usage answer of the
# upstream carries one); the limited variant at /usage is the same route without.
sluice_config usage "" "$NEVER" 'policy = "bench"\ncost_after = "json:usage.total_tokens"'
# Three policies stacked on the route, each under its own key, limits never tripping.
sluice_config stacked "" "$NEVER" 'policy = ["bench", "per_ip", "per_path"]' \
    "\n[policies.per_ip]\nkey = [\"ip\"]\nanonymous = $NEVER\n\n[policies.per_path]\nkey = [\"path:1\"]\nanonymous = $NEVER"
# What the holder downloads and never reads: far more than socket buffers hold.
truncate -s 1G "$TMP/hold.bin"

SLUICE_VARIANTS=(limited nopolicy reject xff capacity banned logged tls reload status ident keyed shadow shadowx usage stacked)
# For other scripts (callgrind-peers.sh) that reuse the rendered configs (KEEP_TMP=1).
for name in "${!PORT[@]}"; do
    echo "$name=${PORT[$name]}"
done | sort >"$TMP/ports.env"
printf '%s\n' "$JWT" >"$TMP/jwt.token"
for v in "${SLUICE_VARIANTS[@]}"; do
    "$SLUICE_BIN" check -c "$TMP/sluice-$v.toml" >"$TMP/sluice-$v.check" 2>&1 ||
        { cat "$TMP/sluice-$v.check" >&2; die "sluice check rejected the $v config"; }
done
nginx -t -q -e "$TMP/nginx-t.log" -p "$TMP" -c "$TMP/nginx.conf" >&2 ||
    { cat "$TMP/nginx-t.log" >&2 || true; die "nginx -t rejected nginx.conf"; }
haproxy -c -q -f "$TMP/haproxy.cfg" >&2 || die "haproxy -c rejected haproxy.cfg"

# --- start the servers -----------------------------------------------------------

start UPSTREAM "$TMP/upstream-nginx.log" nginx -e "$TMP/upstream-nginx.error.log" -p "$TMP" -c "$TMP/upstream-nginx.conf"
wait_port "upstream nginx" "${PORT[UPSTREAM]}" "${PID[UPSTREAM]}" "$TMP/upstream-nginx.error.log"
for v in "${SLUICE_VARIANTS[@]}"; do
    V=SLUICE_${v^^}
    SLUICE_LOG=${SLUICE_LOG:-warn} start "$V" "$TMP/out/sluice-$v.log" "$SLUICE_BIN" run -c "$TMP/sluice-$v.toml"
    wait_port "sluice ($v)" "${PORT[$V]}" "${PID[$V]}" "$TMP/out/sluice-$v.log"
done
# The capacity variant's one slot: a request for a huge body that is never read.
exec 5<>"/dev/tcp/127.0.0.1/${PORT[SLUICE_CAPACITY]}"
printf 'GET /hold HTTP/1.1\r\nHost: hold\r\n\r\n' >&5
# The banned variant's caller: every benchmark client connects from 127.0.0.1.
curl -s -o /dev/null --max-time 5 -H 'content-type: application/json' \
    -d '{"caller": "ip:127.0.0.1", "duration": "24h", "reason": "benchmark"}' \
    "http://127.0.0.1:${PORT[ADMIN_BANNED]}/admin/bans" || die "could not ban through the admin API"
# Rewrites the reload variant's config every second: a changed comment is enough for
# the file watcher to compile and swap a new snapshot.
(
    n=0
    while :; do
        sleep 1
        n=$((n + 1))
        sed "1s|^.*$|# reload $n|" "$TMP/sluice-reload.toml" >"$TMP/sluice-reload.next"
        mv "$TMP/sluice-reload.next" "$TMP/sluice-reload.toml"
    done
) &
PIDS+=($!)
# The status variant's page, open in a browser: the HTML once, then its JSON every
# 2 s, as the page's script reads it.
(
    curl -s -o /dev/null --max-time 5 "http://127.0.0.1:${PORT[ADMIN_STATUS]}/"
    while :; do
        sleep 2
        curl -s -o /dev/null --max-time 5 "http://127.0.0.1:${PORT[ADMIN_STATUS]}/admin/status"
    done
) &
PIDS+=($!)
start NGINX "$TMP/nginx.log" nginx -e "$TMP/nginx.error.log" -p "$TMP" -c "$TMP/nginx.conf"
wait_port nginx "${PORT[NGINX_LIMITED]}" "${PID[NGINX]}" "$TMP/nginx.error.log"
start HAPROXY "$TMP/haproxy.log" haproxy -db -f "$TMP/haproxy.cfg"
wait_port haproxy "${PORT[HAPROXY_LIMITED]}" "${PID[HAPROXY]}" "$TMP/haproxy.log"

# --- check that every server answers as expected ---------------------------------

FAILED=0
code() { # port [curl args...]
    local port=$1
    shift
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" "http://127.0.0.1:$port/" || true
}
expect() { # label want got
    if [ "$2" = "$3" ]; then
        log "ok    $1: $3"
    else
        log "FAIL  $1: expected $2, got $3"
        FAILED=1
    fi
}
expect_reject() { # label port: the third request in a row must be refused with 429
    local a c
    a=$(code "$2")
    code "$2" >/dev/null
    c=$(code "$2")
    case "$a" in 200 | 429) ;; *) expect "$1 (first request)" "200 or 429" "$a" ;; esac
    expect "$1 (third request, over the limit)" 429 "$c"
}

log "checking every server with curl"
XFF_HDR=(-H 'X-Forwarded-For: 10.255.255.254')
expect "upstream" 200 "$(code "${PORT[UPSTREAM]}")"
expect "sluice limited" 200 "$(code "${PORT[SLUICE_LIMITED]}")"
expect "sluice without policy" 200 "$(code "${PORT[SLUICE_NOPOLICY]}")"
expect "sluice access log json" 200 "$(code "${PORT[SLUICE_LOGGED]}")"
expect_reject "sluice reject" "${PORT[SLUICE_REJECT]}"
expect "sluice capacity (slot held)" 503 "$(code "${PORT[SLUICE_CAPACITY]}")"
expect "sluice banned" 403 "$(code "${PORT[SLUICE_BANNED]}")"
expect "sluice xff" 200 "$(code "${PORT[SLUICE_XFF]}" "${XFF_HDR[@]}")"
expect "sluice reload" 200 "$(code "${PORT[SLUICE_RELOAD]}")"
expect "sluice status variant" 200 "$(code "${PORT[SLUICE_STATUS]}")"
expect "sluice status page" 200 "$(code "${PORT[ADMIN_STATUS]}")"
expect "sluice API key" 200 "$(code "${PORT[SLUICE_IDENT]}" -H "x-api-key: $API_KEY")"
expect "sluice JWT" 200 "$(code "${PORT[SLUICE_IDENT]}" -H "authorization: Bearer $JWT")"
expect "sluice JWT, wrong signature" 401 "$(code "${PORT[SLUICE_IDENT]}" -H "authorization: Bearer ${JWT%.*}.AAAA")"
expect "sluice keyed" 200 "$(code "${PORT[SLUICE_KEYED]}" -H 'x-tenant: acme')"
expect "sluice shadow" 200 "$(code "${PORT[SLUICE_SHADOW]}")"
expect "sluice three stacked policies" 200 "$(code "${PORT[SLUICE_STACKED]}")"
expect "sluice shadow, over the limit (third request)" 200 \
    "$(code "${PORT[SLUICE_SHADOWX]}" >/dev/null; code "${PORT[SLUICE_SHADOWX]}" >/dev/null; code "${PORT[SLUICE_SHADOWX]}")"
usage_code() { # port
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$1/usage" || true
}
expect "sluice /usage" 200 "$(usage_code "${PORT[SLUICE_LIMITED]}")"
expect "sluice /usage, cost_after" 200 "$(usage_code "${PORT[SLUICE_USAGE]}")"
tls_code() { # port
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 --cacert "$TMP/cert.pem" \
        "https://localhost:$1/" || true
}
expect "sluice tls" 200 "$(tls_code "${PORT[SLUICE_TLS_S]}")"
expect "nginx tls" 200 "$(tls_code "${PORT[NGINX_TLS]}")"
h2_code() { # port
    curl -s -o /dev/null -w '%{http_code} %{http_version}' --max-time 5 --http2-prior-knowledge \
        "http://127.0.0.1:$1/" || true
}
expect "sluice h2c" "200 2" "$(h2_code "${PORT[SLUICE_LIMITED]}")"
expect "nginx h2c" "200 2" "$(h2_code "${PORT[NGINX_H2]}")"
for s in NGINX HAPROXY; do
    expect "${s,,} limited" 200 "$(code "${PORT[${s}_LIMITED]}")"
    expect_reject "${s,,} reject" "${PORT[${s}_REJECT]}"
    expect "${s,,} xff" 200 "$(code "${PORT[${s}_XFF]}" "${XFF_HDR[@]}")"
done

# --- the protocol scenarios' servers (only when one of them runs) ----------------

PROTOCOLS=0
for s in $SCENARIOS; do
    case $s in ws | grpc | h2up) PROTOCOLS=1 ;; esac
done
if [ $PROTOCOLS = 1 ]; then
    # sluice, one worker, one route "/" to URL (with PROTOCOL), the route's extra
    # lines and the policy's.
    proto_config() { # variant url protocol route_extra policy_extra
        cat >"$TMP/sluice-$1.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[SLUICE_${1^^}]}"
worker_threads = 1
max_connections = 10000

[admin]
listen = "127.0.0.1:${PORT[ADMIN_${1^^}]}"

[log]
access = "off"

[store]
backend = "memory"

[upstreams.up]
targets = ["$2"]
protocol = "$3"

[policies.bench]
anonymous = $NEVER
${5:-}

[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
policy = "bench"
${4:-}
EOF
        "$SLUICE_BIN" check -c "$TMP/sluice-$1.toml" >"$TMP/sluice-$1.check" 2>&1 ||
            { cat "$TMP/sluice-$1.check" >&2; die "sluice check rejected the $1 config"; }
    }
    # The greeter reads its standard input until it ends: a FIFO this script holds.
    mkfifo "$TMP/greeter.in"
    exec 6<>"$TMP/greeter.in"
    # (Not through `start`: an asynchronous command reads /dev/null unless it has a
    # redirection of its own.)
    python3 "$REPO/tests/protocols/greeter.py" <"$TMP/greeter.in" >"$TMP/greeter.log" 2>&1 &
    PID[GREETER]=$!
    PIDS+=("$!")
    for _ in $(seq 100); do
        grep -q '^listening' "$TMP/greeter.log" 2>/dev/null && break
        kill -0 "${PID[GREETER]}" 2>/dev/null || { cat "$TMP/greeter.log" >&2; die "greeter.py did not start (grpcio installed? scripts/test installs it)"; }
        sleep 0.1
    done
    PORT[GREETER]=$(awk '/^listening/ { print $2; exit }' "$TMP/greeter.log")
    [ -n "${PORT[GREETER]}" ] || die "greeter.py printed no port"
    start WS_ECHO "$TMP/ws-echo.log" python3 "$HERE/ws-bench.py" serve "${PORT[WS_ECHO]}"
    wait_port "ws-bench.py echo" "${PORT[WS_ECHO]}" "${PID[WS_ECHO]}" "$TMP/ws-echo.log"
    # The h2up upstream: one nginx worker, "ok" on an HTTP/1.1 and an h2c listener.
    cat >"$TMP/proto-upstream.conf" <<EOF
daemon off;
worker_processes 1;
pid $TMP/proto-upstream.pid;
error_log $TMP/proto-upstream.error.log error;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 75s;
    client_body_temp_path $TMP/proto-upstream-body;
    server {
        listen 127.0.0.1:${PORT[PROTO_UP_H1]} backlog=4096;
        listen 127.0.0.1:${PORT[PROTO_UP_H2]} http2 backlog=4096;
        location / { return 200 "ok\n"; }
    }
}
EOF
    start PROTO_UP "$TMP/proto-upstream.log" nginx -e "$TMP/proto-upstream.error.log" -p "$TMP" -c "$TMP/proto-upstream.conf"
    wait_port "h2up upstream" "${PORT[PROTO_UP_H2]}" "${PID[PROTO_UP]}" "$TMP/proto-upstream.error.log"
    proto_config ws "http://127.0.0.1:${PORT[WS_ECHO]}" http1 "websocket = true"
    proto_config wslim "http://127.0.0.1:${PORT[WS_ECHO]}" http1 "websocket = true" \
        "messages = { per_second = 1_000_000_000 }"
    proto_config grpc "http://127.0.0.1:${PORT[GREETER]}" h2
    proto_config h1up "http://127.0.0.1:${PORT[PROTO_UP_H1]}" http1
    proto_config h2up "http://127.0.0.1:${PORT[PROTO_UP_H2]}" h2
    for v in ws wslim grpc h1up h2up; do
        V=SLUICE_${v^^}
        SLUICE_LOG=${SLUICE_LOG:-warn} start "$V" "$TMP/out/sluice-$v.log" "$SLUICE_BIN" run -c "$TMP/sluice-$v.toml"
        wait_port "sluice ($v)" "${PORT[$V]}" "${PID[$V]}" "$TMP/out/sluice-$v.log"
    done
    # nginx, one worker: WebSocket proxying (Upgrade passed on) and grpc_pass.
    cat >"$TMP/nginx-protocols.conf" <<EOF
daemon off;
worker_processes 1;
pid $TMP/nginx-protocols.pid;
error_log $TMP/nginx-protocols.error.log error;
events { worker_connections 8192; }
http {
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 75s;
    client_body_temp_path $TMP/nginx-protocols-body;
    proxy_temp_path $TMP/nginx-protocols-proxy;
    map \$http_upgrade \$connection_upgrade { default upgrade; '' close; }
    upstream greeter { server 127.0.0.1:${PORT[GREETER]}; keepalive 64; }
    server {
        listen 127.0.0.1:${PORT[NGINX_WS]} backlog=4096;
        location / {
            proxy_pass http://127.0.0.1:${PORT[WS_ECHO]};
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_read_timeout 1h;
        }
    }
    server {
        listen 127.0.0.1:${PORT[NGINX_GRPC]} http2 backlog=4096;
        location / { grpc_pass grpc://greeter; }
    }
}
EOF
    start NGINX_PROTO "$TMP/nginx-protocols.log" nginx -e "$TMP/nginx-protocols.error.log" -p "$TMP" -c "$TMP/nginx-protocols.conf"
    wait_port "nginx (protocols)" "${PORT[NGINX_GRPC]}" "${PID[NGINX_PROTO]}" "$TMP/nginx-protocols.error.log"
    # The gRPC call h2load repeats: one length-prefixed message, b"bench".
    printf '\0\0\0\0\5bench' >"$TMP/grpc-body.bin"
    ws_check() { # port: one socket, a few echoes
        python3 "$HERE/ws-bench.py" load "ws://127.0.0.1:$1/chat" 1 0.3 2>&1 |
            awk '/ requests in / { n = $1 } /Socket errors/ { e = 1 } END { print (n > 0 && !e) ? "echoes" : "no echo" }'
    }
    grpc_check() { # port
        python3 "$REPO/tests/protocols/grpc_call.py" "127.0.0.1:$1" unary:SayHello:x 2>&1 |
            sed -n 's/.*"code": *"\([A-Z_]*\)".*/\1/p'
    }
    expect "ws direct" echoes "$(ws_check "${PORT[WS_ECHO]}")"
    expect "sluice ws" echoes "$(ws_check "${PORT[SLUICE_WS]}")"
    expect "sluice ws, message limit" echoes "$(ws_check "${PORT[SLUICE_WSLIM]}")"
    expect "nginx ws" echoes "$(ws_check "${PORT[NGINX_WS]}")"
    expect "sluice grpc" OK "$(grpc_check "${PORT[SLUICE_GRPC]}")"
    expect "nginx grpc_pass" OK "$(grpc_check "${PORT[NGINX_GRPC]}")"
    expect "sluice, HTTP/1.1 upstream" 200 "$(code "${PORT[SLUICE_H1UP]}")"
    expect "sluice, h2 upstream" 200 "$(code "${PORT[SLUICE_H2UP]}")"
fi
[ $FAILED = 0 ] || die "a server answered with an unexpected status"

# --- measuring -------------------------------------------------------------------

CLK_TCK=$(getconf CLK_TCK)
NCPU=$(nproc)

machine_busy_ticks() { # user nice system irq softirq steal, all CPUs
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
ticks_of() { # utime + stime of these pids and their children (nginx workers)
    proc_ticks '$12 + $13' "$@"
}
kernel_ticks_of() { # stime only: CPU spent in the kernel on the processes' behalf
    proc_ticks '$13' "$@"
}
proc_ticks() { # awk expression over /proc/PID/stat fields (after the name), pids...
    local expr=$1 p pids=()
    shift
    for p in "$@"; do
        pids+=("$p" $(pgrep -P "$p" 2>/dev/null || true))
    done
    for p in "${pids[@]}"; do
        cat "/proc/$p/stat" 2>/dev/null || true
    done | awk '{ sub(/^.*\) /, ""); t += '"$expr"' } END { print t + 0 }'
}

# Before each run, optionally wait for the rest of the machine to be quiet.
wait_quiet() {
    [ "$QUIET_WAIT" -gt 0 ] || return 0
    local start=$SECONDS b0 b1 pct
    while :; do
        b0=$(machine_busy_ticks)
        sleep 1
        b1=$(machine_busy_ticks)
        pct=$((100 * (b1 - b0) / (CLK_TCK * NCPU)))
        [ "$pct" -le "$QUIET_MAX" ] && return 0
        if [ $((SECONDS - start)) -ge "$QUIET_WAIT" ]; then
            log "   machine still ${pct}% busy after ${QUIET_WAIT}s of waiting; running anyway"
            return 0
        fi
    done
}

# User + system CPU seconds of the waited-for children of this shell, from `times`.
children_cpu() { # file written by `times`
    awk 'NR == 2 { n = split($0, f, " "); t = 0
        for (i = 1; i <= n; i++) { split(f[i], ms, "m"); t += ms[1] * 60 + ms[2] }
        print t }' "$1"
}

# One wrk run: label duration port lua callers server-pid [header]. Sets RESULT to
# "rps p50_us p99_us total non2xx sockerr cpu_us_per_req others_pct kernel_us_per_req".
# wrk runs in
# the background and is waited for, so that INT/TERM stop the script at once.
WRK_PID=
RESULT=
wrk_once() {
    local label=$1 dur=$2 port=$3 lua=$4 callers=$5 server=$6 header=${7:-}
    local out=$TMP/wrk/$label.txt
    local args=(-t"$THREADS" -c"$CONNECTIONS" -d"$dur" --latency --timeout 2s)
    case $lua in "" | h2load | h2grpc | wsload) ;; *) args+=(-s "$lua") ;; esac
    [ -n "$header" ] && args+=(-H "$header")
    local busy0 ours0 srv0 sys0 busy1 ours1 srv1 sys1 start end rc=0
    wait_quiet
    busy0=$(machine_busy_ticks)
    ours0=$(ticks_of "${PIDS[@]}")
    srv0=$(ticks_of "$server")
    sys0=$(kernel_ticks_of "$server")
    times >"$out.times0"
    start=$(date +%s%N)
    # A port is plain HTTP on loopback; a URL is used as it is (https://...).
    local url=$port
    [[ $url == *://* ]] || url="http://127.0.0.1:$port/"
    if [ "$lua" = h2load ]; then
        timeout -k 5 $(($(secs "$dur") + 30)) h2load -t"$THREADS" -c"$CONNECTIONS" -m 10 \
            -D "$(secs "$dur")" "$url" >"$out" 2>&1 &
    elif [ "$lua" = h2grpc ]; then
        timeout -k 5 $(($(secs "$dur") + 30)) h2load -t"$THREADS" -c"$CONNECTIONS" -m 10 \
            -D "$(secs "$dur")" -d "$TMP/grpc-body.bin" -H 'content-type: application/grpc' \
            -H 'te: trailers' "$url" >"$out" 2>&1 &
    elif [ "$lua" = wsload ]; then
        timeout -k 5 $(($(secs "$dur") + 60)) python3 "$HERE/ws-bench.py" load "$url" \
            "$CONNECTIONS" "$(secs "$dur")" >"$out" 2>&1 &
    else
        CALLERS=$callers timeout -k 5 $(($(secs "$dur") + 30)) \
            wrk "${args[@]}" "$url" >"$out" 2>&1 &
    fi
    WRK_PID=$!
    wait "$WRK_PID" || rc=$?
    WRK_PID=
    end=$(date +%s%N)
    times >"$out.times1"
    busy1=$(machine_busy_ticks)
    ours1=$(ticks_of "${PIDS[@]}")
    srv1=$(ticks_of "$server")
    sys1=$(kernel_ticks_of "$server")
    if [ $rc != 0 ]; then
        log "error: wrk failed against $label (exit $rc):"
        cat "$out" >&2
        return 1
    fi
    # CPU of processes other than ours (the servers and wrk), in % of the machine
    local others
    others=$(awk -v b=$((busy1 - busy0)) -v o=$((ours1 - ours0)) -v hz="$CLK_TCK" -v n="$NCPU" \
        -v w0="$(children_cpu "$out.times0")" -v w1="$(children_cpu "$out.times1")" -v ns=$((end - start)) '
        BEGIN { pct = 100 * (b - o - (w1 - w0) * hz) / (ns / 1e9 * hz * n); printf "%.0f", pct < 0 ? 0 : pct }')
    RESULT=$(awk -v others="$others" -v srv=$((srv1 - srv0)) -v sys=$((sys1 - sys0)) -v hz="$CLK_TCK" '
        function us(v) {
            if (v ~ /us$/) return v + 0
            if (v ~ /ms$/) return v * 1000
            if (v ~ /m$/) return v * 60e6
            if (v ~ /s$/) return v * 1e6
            return v + 0
        }
        /^ +50%/ { p50 = us($2) }
        /^ +99%/ { p99 = us($2) }
        / requests in / { total = $1 }
        /Non-2xx or 3xx responses:/ { non2xx = $NF }
        /Socket errors:/ { gsub(",", ""); sockerr = $4 + $6 + $8 + $10 }
        /^Requests\/sec:/ { rps = $2 }
        # h2load: "finished in 5.00s, 39871.20 req/s", "requests: N total, ... S succeeded",
        # "status codes: a 2xx, b 3xx, c 4xx, d 5xx", "time for request: min max mean sd"
        /^finished in/ { rps = $4 }
        /^requests:/ { total = $2; h2fail = $10 + $12 + $14 }
        /^status codes:/ { non2xx = $5 + $7 + $9; sockerr = h2fail }
        /^time for request:/ { p50 = us($6); p99 = 0 }
        END {
            if (rps == "" || total == 0) exit 1
            printf "%.0f %.0f %.0f %d %d %d %.1f %s %.1f\n", rps, p50, p99, total, non2xx + 0, sockerr + 0,
                srv * 1e6 / hz / total, others, sys * 1e6 / hz / total
        }' "$out") || {
        log "error: cannot read wrk output for $label:"
        cat "$out" >&2
        return 1
    }
}

RESULTS=$TMP/results.tsv
: >"$RESULTS"
ANOMALY=0
MAX_OTHERS=0

# A target: "key|label|port|lua|callers|expect|server[|header]" (port: a port or a URL;
# expect: 2xx or 429; server: the PID key of the process whose CPU is charged to it;
# header: one request header wrk sends, "name: value")
run_scenario() { # scenario title targets...
    local scenario=$1 title=$2
    shift 2
    local targets=("$@") n=$#
    log ""
    log "== $title"
    local t key label port lua callers want server header
    if [ "$(secs "$WARMUP")" -gt 0 ]; then
        for t in "${targets[@]}"; do
            IFS='|' read -r key label port lua callers want server header <<<"$t"
            log "   warm-up $label ($WARMUP)"
            wrk_once "$scenario-$key-warmup" "$WARMUP" "$port" "$lua" "$callers" "${PID[$server]}" "$header" || exit 1
        done
    fi
    local r i res rps p50 p99 total non2xx sockerr cpu others kernel
    for r in $(seq "$ROUNDS"); do
        # Rotate the order each round so that no server always runs first or last.
        for i in $(seq 0 $((n - 1))); do
            t=${targets[$(((i + r - 1) % n))]}
            IFS='|' read -r key label port lua callers want server header <<<"$t"
            local attempt=0
            while :; do
                wrk_once "$scenario-$key-r$r" "$DURATION" "$port" "$lua" "$callers" "${PID[$server]}" "$header" || exit 1
                res=$RESULT
                read -r rps p50 p99 total non2xx sockerr cpu others kernel <<<"$res"
                [ "$others" -gt "$NOISY" ] && [ "$attempt" -lt "$RETRIES" ] || break
                attempt=$((attempt + 1))
                log "   round $r  $label: other processes took $others% of the machine, again ($attempt/$RETRIES)"
            done
            log "   round $r  $(printf '%-26s %7s req/s  p50 %6s us  p99 %6s us  non-2xx %s/%s  CPU/req %s us  other CPU %s%%' \
                "$label" "$rps" "$p50" "$p99" "$non2xx" "$total" "$cpu" "$others")"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$key" "$label" "$r" \
                "$rps" "$p50" "$p99" "$total" "$non2xx" "$sockerr" "$want" "$others" "$cpu" "$kernel" >>"$RESULTS"
            [ "$others" -gt "$MAX_OTHERS" ] && MAX_OTHERS=$others
            if [ "$want" = 2xx ] && [ "$non2xx" -gt 0 ]; then
                log "   UNEXPECTED: $label answered $non2xx of $total requests with non-2xx"
                ANOMALY=1
            fi
            # Rejection path: all but a handful refused (one a minute may get through).
            if [ "$want" != 2xx ] && [ $((total - non2xx)) -gt $((10 + total / 1000)) ]; then
                log "   UNEXPECTED: $label admitted $((total - non2xx)) of $total requests"
                ANOMALY=1
            fi
            [ "$sockerr" -gt 0 ] && log "   note: $label had $sockerr socket errors"
            sleep 0.5
        done
    done
}

# --- profile mode ----------------------------------------------------------------

if [ "$MODE" = profile ]; then
    case $PROFILE_SERVER in
        sluice)
            case $PROFILE_SCENARIO in
                proxied) key=SLUICE_LIMITED ;; nopolicy) key=SLUICE_NOPOLICY ;;
                reject) key=SLUICE_REJECT ;; xff) key=SLUICE_XFF ;;
                *) die "PROFILE_SCENARIO must be proxied, nopolicy, reject or xff" ;;
            esac
            pid=${PID[$key]}
            port=${PORT[$key]}
            ;;
        nginx | haproxy)
            S=${PROFILE_SERVER^^}
            case $PROFILE_SCENARIO in
                proxied) port=${PORT[${S}_LIMITED]} ;; reject) port=${PORT[${S}_REJECT]} ;;
                xff) port=${PORT[${S}_XFF]} ;;
                *) die "PROFILE_SCENARIO must be proxied, reject or xff for $PROFILE_SERVER" ;;
            esac
            pid=${PID[$S]}
            # nginx: the worker does the work, not the master
            [ "$S" = NGINX ] && pid=$(pgrep -P "$pid" | head -1)
            ;;
        upstream)
            port=${PORT[UPSTREAM]}
            pid=$(pgrep -P "${PID[UPSTREAM]}" | head -1)
            ;;
        *) die "PROFILE_SERVER must be sluice, nginx, haproxy or upstream" ;;
    esac
    lua=
    [ "$PROFILE_SCENARIO" = xff ] && lua=$HERE/xff.lua
    total=$((PROFILE_SECONDS + 6))
    log "profiling $PROFILE_SERVER ($PROFILE_SCENARIO, pid $pid) for ${PROFILE_SECONDS}s under wrk -t$THREADS -c$CONNECTIONS"
    wait_quiet
    CALLERS=$CALLERS timeout -k 5 $((total + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" \
        -d"${total}s" --latency ${lua:+-s "$lua"} "http://127.0.0.1:$port/" >"$TMP/profile-wrk.txt" 2>&1 &
    WRK_PID=$!
    PIDS+=("$WRK_PID")
    sleep 3
    perf stat -e raw_syscalls:sys_enter,context-switches,task-clock -x, -o "$TMP/perf-stat.csv" \
        -p "$pid" -- sleep "$PROFILE_SECONDS" >/dev/null 2>&1 &
    STAT_PID=$!
    PIDS+=("$STAT_PID")
    perf record -e cpu-clock --call-graph "$PROFILE_CALLGRAPH" -o "$TMP/perf.data" -p "$pid" -- sleep "$PROFILE_SECONDS" \
        >"$TMP/perf-record.log" 2>&1 || { cat "$TMP/perf-record.log" >&2; die "perf record failed"; }
    wait "$STAT_PID" || true
    wait "$WRK_PID" || true
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$TMP/profile-wrk.txt")
    echo "wrk: $rps req/s over ${total}s; the profile covers ${PROFILE_SECONDS}s of it"
    if [ -s "$TMP/perf-stat.csv" ] && [ -n "$rps" ]; then
        awk -F, -v rps="$rps" -v secs="$PROFILE_SECONDS" '
            $3 == "raw_syscalls:sys_enter" { sc = $1 }
            $3 == "context-switches" { cs = $1 }
            $3 == "task-clock" { tc = $1 }
            END {
                n = rps * secs
                printf "per request (approx., %s req/s x %ss): %.2f syscalls, %.2f context switches, %.1f us CPU; %.2f CPUs busy\n",
                    rps, secs, sc / n, cs / n, tc * 1000 / n, tc / 1000 / secs
            }' "$TMP/perf-stat.csv"
    fi
    echo
    echo "== $PROFILE_SERVER CPU time by shared object"
    perf report -i "$TMP/perf.data" --no-children --stdio --sort dso -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -15 || true
    if [ "$PROFILE_SERVER" = sluice ]; then
        echo
        echo "== sluice CPU time by component (self time of symbols, grouped by name)"
        perf report -i "$TMP/perf.data" --no-children --stdio --sort dso,sym -g none 2>/dev/null |
            grep -v '^#' | grep -v '^$' | awk "$(cat <<'AWK'
# Groups perf report lines ("pct dso [.] symbol") of a sluice profile by component.
{
    pct = $1; sub("%", "", pct); dso = $2; $1 = ""; $2 = ""; $3 = ""; sym = $0; sub(/^ +/, "", sym)
    if (dso ~ /kernel/) c = "kernel: syscalls, TCP over loopback, waking peers"
    else if (sym ~ /memmove|memcpy|memset/) c = "libc memmove/memcpy (moved futures, buffers)"
    else if (sym ~ /malloc|free|realloc|unlink_chunk|consolidate|cfree/) c = "libc malloc/free"
    else if (dso ~ /libc|vdso/) c = "libc/vdso other (syscall wrappers, clock_gettime)"
    else if (sym ~ /hyper_util::client|client::legacy|dispatch::Client|role::Client|pool::|want::|client::conn/) c = "upstream client (pool, hyper client dispatch)"
    else if (sym ~ /hyper_util/) c = "hyper-util server (auto builder)"
    else if (sym ~ /hyper::/) c = "hyper h1 (codec, dispatcher)"
    else if (sym ~ /tokio::sync/) c = "tokio channels (mpsc/oneshot/watch)"
    else if (sym ~ /tokio::time|runtime::time|Sleep|TimerEntry/) c = "tokio timers (sleep/timeout entries)"
    else if (sym ~ /tokio::/) c = "tokio scheduler and I/O driver"
    else if (sym ~ /http::header|HeaderMap|HeaderName|HeaderValue|hash_elem|sip::Hasher/) c = "http HeaderMap (incl. SipHash)"
    else if (sym ~ /http::/) c = "http Uri/Method"
    else if (sym ~ /httparse/) c = "httparse"
    else if (sym ~ /bytes::/) c = "bytes (Bytes refcounts)"
    else if (sym ~ /prometheus/) c = "prometheus"
    else if (sym ~ /fmt/) c = "core::fmt (format!, to_string)"
    else if (sym ~ /sluice::/) c = "sluice's own code (gateway, limiter, headers; inlined)"
    else if (sym ~ /futures_util/) c = "futures-util combinators"
    else c = "other"
    t[c] += pct
}
END { for (c in t) if (t[c] >= 0.05) printf "  %6.2f%%  %s\n", t[c], c }
AWK
)" | sort -rn || true
    fi
    echo
    echo "== $PROFILE_SERVER CPU time by symbol (self time, >= 0.3%)"
    perf report -i "$TMP/perf.data" --no-children --stdio --sort dso,sym -g none --percent-limit 0.3 2>/dev/null |
        grep -v '^#' | grep -v '^$' | cut -c1-160 | head -"${PROFILE_LINES:-80}" || true
    [ "${KEEP_TMP:-0}" = 1 ] && echo "call graphs: perf report -i $TMP/perf.data --no-children"
    exit 0
fi

# --- the scenarios ---------------------------------------------------------------

XFF_LUA=$HERE/xff.lua
GRPC_PATH=greet.Greeter/SayHello
for s in $SCENARIOS; do
    case $s in
        ws)
            run_scenario ws "WebSocket echo messages (ws-bench.py load -c$CONNECTIONS, 32 bytes; a message is a request)" \
                "direct|direct to the echo server|ws://127.0.0.1:${PORT[WS_ECHO]}/chat|wsload||2xx|WS_ECHO" \
                "sluice|sluice websocket|ws://127.0.0.1:${PORT[SLUICE_WS]}/chat|wsload||2xx|SLUICE_WS" \
                "sluice-limit|sluice, message limit|ws://127.0.0.1:${PORT[SLUICE_WSLIM]}/chat|wsload||2xx|SLUICE_WSLIM" \
                "nginx|nginx proxy_pass Upgrade|ws://127.0.0.1:${PORT[NGINX_WS]}/chat|wsload||2xx|NGINX_PROTO"
            ;;
        grpc)
            run_scenario grpc "gRPC unary calls (h2load -c$CONNECTIONS -m 10) to the grpcio greeter" \
                "direct|direct to the greeter|http://127.0.0.1:${PORT[GREETER]}/$GRPC_PATH|h2grpc||2xx|GREETER" \
                "sluice|sluice, h2 upstream|http://127.0.0.1:${PORT[SLUICE_GRPC]}/$GRPC_PATH|h2grpc||2xx|SLUICE_GRPC" \
                "nginx|nginx grpc_pass|http://127.0.0.1:${PORT[NGINX_GRPC]}/$GRPC_PATH|h2grpc||2xx|NGINX_PROTO"
            ;;
        h2up)
            run_scenario h2up "plain requests to an HTTP/1.1 vs an HTTP/2 (h2c) upstream" \
                "h1|sluice, HTTP/1.1 upstream|${PORT[SLUICE_H1UP]}|||2xx|SLUICE_H1UP" \
                "h2|sluice, h2 upstream|${PORT[SLUICE_H2UP]}|||2xx|SLUICE_H2UP"
            ;;
        proxied)
            run_scenario proxied "proxied: limits configured, never tripping" \
                "direct|direct to upstream|${PORT[UPSTREAM]}|||2xx|UPSTREAM" \
                "sluice|sluice|${PORT[SLUICE_LIMITED]}|||2xx|SLUICE_LIMITED" \
                "sluice-nopolicy|sluice (route, no policy)|${PORT[SLUICE_NOPOLICY]}|||2xx|SLUICE_NOPOLICY" \
                "sluice-logged|sluice, access log json|${PORT[SLUICE_LOGGED]}|||2xx|SLUICE_LOGGED" \
                "nginx|nginx limit_req|${PORT[NGINX_LIMITED]}|||2xx|NGINX" \
                "haproxy|haproxy stick-table|${PORT[HAPROXY_LIMITED]}|||2xx|HAPROXY"
            ;;
        reject)
            run_scenario reject "rejection path: every request over the limit (429), or over capacity (503)" \
                "sluice|sluice|${PORT[SLUICE_REJECT]}|||429|SLUICE_REJECT" \
                "sluice-503|sluice 503 (capacity)|${PORT[SLUICE_CAPACITY]}|||503|SLUICE_CAPACITY" \
                "sluice-403|sluice 403 (banned)|${PORT[SLUICE_BANNED]}|||403|SLUICE_BANNED" \
                "nginx|nginx limit_req|${PORT[NGINX_REJECT]}|||429|NGINX" \
                "haproxy|haproxy stick-table|${PORT[HAPROXY_REJECT]}|||429|HAPROXY"
            ;;
        tls)
            run_scenario tls "TLS keep-alive: the proxied scenario over https (rustls vs OpenSSL)" \
                "sluice|sluice (rustls)|https://localhost:${PORT[SLUICE_TLS_S]}/|||2xx|SLUICE_TLS" \
                "nginx|nginx ssl|https://localhost:${PORT[NGINX_TLS]}/|||2xx|NGINX"
            ;;
        h2)
            run_scenario h2 "HTTP/2 without TLS (h2c): h2load -c$CONNECTIONS -m 10" \
                "sluice|sluice h2c|${PORT[SLUICE_LIMITED]}|h2load||2xx|SLUICE_LIMITED" \
                "nginx|nginx h2c|${PORT[NGINX_H2]}|h2load||2xx|NGINX"
            ;;
        reload)
            run_scenario reload "the proxied scenario while the config is reloaded every second" \
                "sluice|sluice|${PORT[SLUICE_LIMITED]}|||2xx|SLUICE_LIMITED" \
                "sluice-reload|sluice, reload every 1 s|${PORT[SLUICE_RELOAD]}|||2xx|SLUICE_RELOAD"
            ;;
        status)
            run_scenario status "the proxied scenario with the status page open, refreshing every 2 s" \
                "sluice|sluice|${PORT[SLUICE_LIMITED]}|||2xx|SLUICE_LIMITED" \
                "sluice-status|sluice, status page open|${PORT[SLUICE_STATUS]}|||2xx|SLUICE_STATUS"
            ;;
        features)
            run_scenario features "this round's features, sluice against sluice (limits never refusing)" \
                "key|sluice, API key|${PORT[SLUICE_IDENT]}|||2xx|SLUICE_IDENT|x-api-key: $API_KEY" \
                "jwt|sluice, cached JWT (RS256)|${PORT[SLUICE_IDENT]}|||2xx|SLUICE_IDENT|authorization: Bearer $JWT" \
                "default|sluice, default key|${PORT[SLUICE_LIMITED]}|||2xx|SLUICE_LIMITED" \
                "keyed|sluice, key header:x-tenant|${PORT[SLUICE_KEYED]}|||2xx|SLUICE_KEYED|x-tenant: acme" \
                "shadow|sluice, shadow|${PORT[SLUICE_SHADOW]}|||2xx|SLUICE_SHADOW" \
                "shadowx|sluice, shadow, all over|${PORT[SLUICE_SHADOWX]}|||2xx|SLUICE_SHADOWX" \
                "stacked|sluice, three stacked policies|${PORT[SLUICE_STACKED]}|||2xx|SLUICE_STACKED" \
                "plain|sluice /usage|http://127.0.0.1:${PORT[SLUICE_LIMITED]}/usage|||2xx|SLUICE_LIMITED" \
                "scanner|sluice /usage, cost_after|http://127.0.0.1:${PORT[SLUICE_USAGE]}/usage|||2xx|SLUICE_USAGE"
            ;;
        xff)
            run_scenario xff "callers from X-Forwarded-For (trusted proxy): 1 caller vs $CALLERS" \
                "sluice-1|sluice, 1 caller|${PORT[SLUICE_XFF]}|$XFF_LUA|1|2xx|SLUICE_XFF" \
                "nginx-1|nginx, 1 caller|${PORT[NGINX_XFF]}|$XFF_LUA|1|2xx|NGINX" \
                "haproxy-1|haproxy, 1 caller|${PORT[HAPROXY_XFF]}|$XFF_LUA|1|2xx|HAPROXY" \
                "sluice-m|sluice, $CALLERS callers|${PORT[SLUICE_XFF]}|$XFF_LUA|$CALLERS|2xx|SLUICE_XFF" \
                "nginx-m|nginx, $CALLERS callers|${PORT[NGINX_XFF]}|$XFF_LUA|$CALLERS|2xx|NGINX" \
                "haproxy-m|haproxy, $CALLERS callers|${PORT[HAPROXY_XFF]}|$XFF_LUA|$CALLERS|2xx|HAPROXY"
            ;;
    esac
done

# --- report ----------------------------------------------------------------------

# The reload variant must really have reloaded (and never failed to).
RELOADS=
if [[ " $SCENARIOS " == *" reload "* ]]; then
    RELOADS=$(curl -s --max-time 5 "http://127.0.0.1:${PORT[ADMIN_RELOAD]}/metrics" |
        awk '/^sluice_config_reloads_total/ { print }' | tr '\n' ' ')
    log "reload variant: $RELOADS"
    [[ "$RELOADS" == *'result="ok"'* ]] || { log "UNEXPECTED: the reload variant never reloaded"; ANOMALY=1; }
    failed=$(awk '{ for (i = 1; i < NF; i++) if ($i ~ /result="error"/) print $(i + 1) }' <<<"$RELOADS")
    [ "${failed:-0}" = 0 ] || { log "UNEXPECTED: $failed reloads failed"; ANOMALY=1; }
fi

if [ "$SLUICE_BIN" = "$REPO/target/dist/sluice" ]; then
    rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ -n "$(git -C "$REPO" status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ] && rev="$rev+dirty"
    rev="$rev, target/dist/sluice"
else
    rev="SLUICE_BIN=$SLUICE_BIN"
fi
echo
echo "sluice ($rev) vs $(nginx -v 2>&1 | sed 's/.*version: //') vs HAProxy $(haproxy -v | awk 'NR==1 {print $3}'), $(wrk -v 2>&1 | awk 'NR==1 {print $1, $2}')"
echo "$NCPU CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(uname -sr); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "wrk -t$THREADS -c$CONNECTIONS, $ROUNDS round(s) x $DURATION per server, interleaved, warm-up $WARMUP; one worker each; medians over rounds"
[ "$MODE" = smoke ] && echo "SMOKE MODE: the numbers are not meaningful, only that everything ran"
if [ "$MAX_OTHERS" -gt 10 ]; then
    echo "WARNING: other processes used up to $MAX_OTHERS% of the machine's CPU during a run (column 'other CPU'): numbers are noisy"
fi

awk -F'\t' -v mode="$MODE" -v reloads="$RELOADS" '
    function median(list,    a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        if (n % 2) return a[(n + 1) / 2]
        return (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function ms(u) { return u > 0 ? sprintf("%.3f ms", u / 1000) : "n/a" }
    {
        k = $1 SUBSEP $2
        if (!(k in label)) { label[k] = $3; order[$1] = order[$1] " " $2 }
        rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7; cpu[k] = cpu[k] " " $13; ker[k] = ker[k] " " $14
        total[k] += $8; non[k] += $9
        if (!(k in oth) || $12 + 0 > oth[k] + 0) oth[k] = $12
    }
    function row(s, key,    k) {
        k = s SUBSEP key
        if (!(k in label)) return
        R[s, key] = median(rps[k]); L50[s, key] = median(p50[k]); L99[s, key] = median(p99[k]); C[s, key] = median(cpu[k])
        K[s, key] = median(ker[k])
        printf "| %-28s | %9.0f | %10s | %10s | %8s | %9s | %9s | %9s |\n", label[k], R[s, key], ms(L50[s, key]), ms(L99[s, key]), \
            sprintf("%.1f%%", total[k] ? 100 * non[k] / total[k] : 0), sprintf("%.1f us", C[s, key]), sprintf("%.1f us", K[s, key]), oth[k] "%"
    }
    function table(s, title,    n, keys, i) {
        if (!(s in order)) return
        printf "\n### %s\n\n", title
        printf "| %-28s | %9s | %10s | %10s | %8s | %9s | %9s | %9s |\n", "server", "req/s", "p50", "p99", "non-2xx", "CPU/req", \
            "kernel", "other CPU"
        printf "|%s|%s:|%s:|%s:|%s:|%s:|%s:|%s:|\n", "------------------------------", "----------", "-----------", "-----------", \
            "---------", "----------", "----------", "----------"
        n = split(order[s], keys, " ")
        for (i = 1; i <= n; i++) row(s, keys[i])
    }
    # CPU per request of a against b (1.03x: a costs 3 % more CPU a request)
    function cpuratio(name, s, a, b) {
        if (!((s, a) in C) || !((s, b) in C) || C[s, b] <= 0) return
        if (!cpuhead) { print ""; print "CPU per request, features (a / b; above 1: a costs more):"; cpuhead = 1 }
        printf "  %-52s %6.2fx  (%.1f us / %.1f us)\n", name, C[s, a] / C[s, b], C[s, a], C[s, b]
    }
    function have(s, a, b) { return ((s, a) in R) && ((s, b) in R) && R[s, b] > 0 }
    function ratio(name, s, a, b, target,    r, verdict) {
        if (!have(s, a, b)) return
        r = R[s, a] / R[s, b]
        verdict = ""
        if (target != "") verdict = (r >= target ? "  meets" : "  MISSES") sprintf(" target >= %.2f", target)
        if (mode == "smoke" && target != "") verdict = "  (smoke: not judged)"
        printf "  %-52s %6.2fx%s\n", name, r, verdict
    }
    END {
        table("proxied", "Proxied, limits never tripping")
        table("reject", "Rejection path (429; sluice 503 for a full concurrency cap, 403 for a ban)")
        table("xff", "Callers from X-Forwarded-For: 1 caller vs many")
        table("tls", "TLS keep-alive (wrk over https, TLS 1.3, ECDSA P-256)")
        table("h2", "HTTP/2 h2c (h2load -m 10; p50 column: mean)")
        table("reload", "Config reloaded every second")
        table("status", "Status page open, refreshing every 2 s")
        table("features", "Features of round three (sluice against sluice, proxied, limits never refusing)")
        table("ws", "WebSocket echo messages (a message is a request; CPU/req: per message)")
        table("grpc", "gRPC unary calls (h2load -m 10; p50 column: mean)")
        table("h2up", "HTTP/1.1 vs HTTP/2 upstream, plain requests")
        print ""
        print "Ratios of median req/s:"
        ratio("proxied: sluice / nginx", "proxied", "sluice", "nginx", 0.9)
        ratio("proxied: sluice / haproxy", "proxied", "sluice", "haproxy", 1.0)
        if (have("proxied", "sluice", "nginx"))
            printf "  %-52s %7s %s (sluice %s, nginx %s)\n", "proxied: p99 sluice <= p99 nginx", "", \
                mode == "smoke" ? " (smoke: not judged)" : (L99["proxied", "sluice"] <= L99["proxied", "nginx"] ? " meets" : " MISSES"), \
                ms(L99["proxied", "sluice"]), ms(L99["proxied", "nginx"])
        ratio("proxied: sluice / direct to upstream", "proxied", "sluice", "direct", "")
        ratio("limiter tax: sluice / sluice without policy", "proxied", "sluice", "sluice-nopolicy", 0.97)
        ratio("access log: sluice json log / sluice log off", "proxied", "sluice-logged", "sluice", 0.9)
        if ((("reject", "sluice") in R) && (("proxied", "sluice") in R)) {
            R["x", "a"] = R["reject", "sluice"]; R["x", "b"] = R["proxied", "sluice"]
            ratio("rejection: sluice 429s / sluice proxied 200s", "x", "a", "b", "")
        }
        ratio("capacity: sluice 503s / sluice 429s", "reject", "sluice-503", "sluice", 0.97)
        ratio("banned: sluice 403s / sluice 429s", "reject", "sluice-403", "sluice", 1.0)
        ratio("rejection: sluice / nginx", "reject", "sluice", "nginx", "")
        ratio("rejection: sluice / haproxy", "reject", "sluice", "haproxy", 1.0)
        ratio("xff: sluice many callers / sluice 1 caller", "xff", "sluice-m", "sluice-1", 0.9)
        ratio("xff: nginx many callers / nginx 1 caller", "xff", "nginx-m", "nginx-1", "")
        ratio("xff: haproxy many callers / haproxy 1 caller", "xff", "haproxy-m", "haproxy-1", "")
        ratio("xff many callers: sluice / nginx", "xff", "sluice-m", "nginx-m", "")
        ratio("xff many callers: sluice / haproxy", "xff", "sluice-m", "haproxy-m", "")
        ratio("tls: sluice / nginx", "tls", "sluice", "nginx", 1.0)
        ratio("h2: sluice / nginx", "h2", "sluice", "nginx", 1.0)
        ratio("reload every second: sluice / sluice without", "reload", "sluice-reload", "sluice", "")
        ratio("status page open: sluice / sluice without", "status", "sluice-status", "sluice", 0.98)
        ratio("cached JWT / API key", "features", "jwt", "key", 0.95)
        ratio("key header:x-tenant / default key", "features", "keyed", "default", 0.97)
        ratio("shadow / enforced (never refusing)", "features", "shadow", "default", 0.99)
        ratio("shadow, every request over / enforced", "features", "shadowx", "default", 0.99)
        ratio("three stacked policies / one", "features", "stacked", "default", 0.90)
        ratio("usage scanner: cost_after / same route without", "features", "scanner", "plain", 0.95)
        ratio("ws messages: sluice / nginx", "ws", "sluice", "nginx", 1.0)
        ratio("ws messages: sluice with a message limit / without", "ws", "sluice-limit", "sluice", "")
        ratio("grpc calls: sluice / nginx grpc_pass", "grpc", "sluice", "nginx", 1.0)
        ratio("plain requests: h2 upstream / HTTP/1.1 upstream", "h2up", "h2", "h1", "")
        if (reloads != "") printf "  %-52s %s\n", "reloads during the run", reloads
        if ((("proxied", "sluice") in C) && (("proxied", "nginx") in C) && C["proxied", "sluice"] > 0) {
            print ""
            print "CPU per request (lower is better), proxied:"
            r = C["proxied", "nginx"] / C["proxied", "sluice"]
            printf "  %-52s %6.2fx  %s target >= 0.90\n", "nginx CPU/req / sluice CPU/req", r, \
                mode == "smoke" ? "(smoke: not judged)" : (r >= 0.9 ? "meets" : "MISSES")
            if (("proxied", "haproxy") in C) {
                r = C["proxied", "haproxy"] / C["proxied", "sluice"]
                printf "  %-52s %6.2fx  %s target >= 1.00\n", "haproxy CPU/req / sluice CPU/req", r, \
                    mode == "smoke" ? "(smoke: not judged)" : (r >= 1.0 ? "meets" : "MISSES")
            }
            if (("proxied", "sluice-nopolicy") in C)
                printf "  %-52s %6.2fx\n", "sluice no-policy CPU/req / sluice CPU/req", C["proxied", "sluice-nopolicy"] / C["proxied", "sluice"]
            # One worker is saturated, so req/s is about 1 / CPU per request: the
            # targets need this CPU budget per request, kernel work included.
            print ""
            print "CPU per request, user and kernel, proxied:"
            printf "  %-52s %6.1f us (kernel %.1f, user %.1f)\n", "sluice", C["proxied", "sluice"], \
                K["proxied", "sluice"], C["proxied", "sluice"] - K["proxied", "sluice"]
            printf "  %-52s %6.1f us (kernel %.1f, user %.1f)\n", "nginx", C["proxied", "nginx"], \
                K["proxied", "nginx"], C["proxied", "nginx"] - K["proxied", "nginx"]
            if (("proxied", "haproxy") in C)
                printf "  %-52s %6.1f us (kernel %.1f, user %.1f)\n", "haproxy", C["proxied", "haproxy"], \
                    K["proxied", "haproxy"], C["proxied", "haproxy"] - K["proxied", "haproxy"]
            budget = C["proxied", "nginx"] / 0.9
            if ((("proxied", "haproxy") in C) && C["proxied", "haproxy"] < budget) budget = C["proxied", "haproxy"]
            printf "  %-52s %6.1f us\n", "sluice CPU/req budget (min of haproxy, nginx / 0.9)", budget
        }
        cpuratio("cached JWT / API key", "features", "jwt", "key")
        cpuratio("key header:x-tenant / default key", "features", "keyed", "default")
        cpuratio("shadow / enforced (never refusing)", "features", "shadow", "default")
        cpuratio("shadow, every request over / enforced", "features", "shadowx", "default")
        cpuratio("three stacked policies / one", "features", "stacked", "default")
        cpuratio("usage scanner: cost_after / same route without", "features", "scanner", "plain")
        cpuratio("ws: sluice / nginx (CPU per message)", "ws", "sluice", "nginx")
        cpuratio("ws: message limit / none (CPU per message)", "ws", "sluice-limit", "sluice")
        cpuratio("grpc: sluice / nginx grpc_pass (CPU per call)", "grpc", "sluice", "nginx")
        cpuratio("h2 upstream / HTTP/1.1 upstream (CPU per request)", "h2up", "h2", "h1")
    }' "$RESULTS"

if [ "${KEEP_TMP:-0}" = 1 ]; then
    echo
    echo "raw results: $RESULTS (wrk output in $TMP/wrk)"
fi

if [ $ANOMALY = 1 ]; then
    log "some runs had unexpected statuses (see UNEXPECTED above)"
    exit 2
fi
exit 0
