#!/usr/bin/env bash
# Instructions and simulated cache misses per request of sluice, nginx and HAProxy on
# every path of the comparison script, each under valgrind's callgrind with the config
# that script gives it: steady figures for where the three differ, and for what a
# feature costs, on a machine too noisy for req/s.
#
#   benches/proxy/callgrind-peers.sh             every path
#   PATHS="proxied jwt" benches/proxy/callgrind-peers.sh
#
# Paths (the server in brackets does the same job; the feature paths are sluice
# against sluice, beside the proxied and key rows they are compared with):
#   proxied  limits never tripping                      [nginx haproxy sluice]
#   reject   every request a 429                        [nginx haproxy sluice]
#   tls      proxied over TLS 1.3 keep-alive (https)    [nginx sluice]
#   h2c      proxied over HTTP/2 prior knowledge, -m 10 [nginx sluice]
#   xff      every request a new caller in X-Forwarded-For from a trusted proxy
#            (wrk with xff.lua, CALLERS [1000000] addresses; the table holds at
#            most N2 of them, as the runs are short)  [nginx haproxy sluice]
#   key      a consumer's API key                        [sluice]
#   jwt      a cached RS256 JWT (the same token every time) [sluice]
#   keyed    key = ["header:x-tenant"], the header sent  [sluice]
#   shadow   mode = "shadow", limits never tripping      [sluice]
#   shadowx  mode = "shadow", every request over the limit (a would-be 429) [sluice]
#   usage    the 86-byte /usage JSON answer, no cost_after [sluice]
#   scanner  the same with cost_after = "json:usage.total_tokens" [sluice]
#
# Each server runs twice per path, serving N1 and then N2 requests (h2load, HTTP/1.1
# unless h2c, CONNECTIONS keep-alive connections; wrk stopped after N requests for
# xff), counting from when it first answers (--instr-atstart=no, then
# callgrind_control); the figure is (count(N2) - count(N1)) / (N2 - N1), so start-up,
# the first requests and shutdown cancel out. Counts are user-space only; the caches
# are valgrind's model (--cache-sim=yes: this machine's L1 instruction and data caches
# and its last-level cache, no prefetching). Columns: instructions (Ir), L1
# instruction-cache misses (I1mr), L1 data-cache misses (D1mr + D1mw), last-level
# misses (ILmr + DLmr + DLmw).
#
# Environment: N1 [2000], N2 [12000], CONNECTIONS [32], PATHS [all of the above],
# SERVERS ["nginx haproxy sluice"], CALLERS [1000000],
# SLUICE_BIN [target/dist/sluice, built if missing], KEEP=1 keeps the callgrind
# files (callgrind_annotate shows where the instructions go).
# Needs valgrind, h2load, wrk, nginx, haproxy, curl, openssl.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
N1=${N1:-2000}
N2=${N2:-12000}
CONNECTIONS=${CONNECTIONS:-32}
PATHS=${PATHS:-proxied reject tls h2c xff key jwt keyed shadow shadowx usage scanner}
SERVERS=${SERVERS:-nginx haproxy sluice}
export CALLERS=${CALLERS:-1000000}
SLUICE_BIN=${SLUICE_BIN:-$REPO/target/dist/sluice}
if [ ! -x "$SLUICE_BIN" ]; then
    (cd "$REPO" && cargo build --profile dist --bin sluice >&2)
fi
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
UPSTREAM_PID=""
SERVER_PID=""
DIR=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null || true
    [ -n "$UPSTREAM_PID" ] && kill "$UPSTREAM_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    if [ -n "$DIR" ]; then
        if [ "${KEEP:-0}" = 1 ]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
    fi
}
trap cleanup EXIT

# The comparison script renders every server's config, picks free ports and makes the
# JWT; its smoke run (checks every server answers as expected) keeps them.
log=$(mktemp)
# (From a random block of ports: a comparison started at the same time from the
# default base could take the same free ports.)
KEEP_TMP=1 NO_BUILD=1 SLUICE_BIN="$SLUICE_BIN" SCENARIOS=proxied \
    PORT_BASE=${PORT_BASE:-$((20000 + RANDOM % 150 * 100))} \
    "$HERE/compare.sh" --smoke >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
DIR=$(awk '/^kept / {print $2}' "$log" | tail -1)
rm -f "$log"
[ -f "$DIR/ports.env" ] || { echo "the comparison script kept no configs" >&2; exit 1; }
declare -A PORT
while IFS='=' read -r name port; do PORT[$name]=$port; done <"$DIR/ports.env"
JWT=$(cat "$DIR/jwt.token")
API_KEY=bench-key-0123456789

nginx -p "$DIR" -c "$DIR/upstream-nginx.conf" >/dev/null 2>&1 &
UPSTREAM_PID=$!

# wrk ended after N responses (exit status 3 if one was not a 200), every request
# from a new X-Forwarded-For caller. (wrk.thread:stop() would leave wrk waiting for
# the rest of -d.)
cat >"$DIR/xff-n.lua" <<LUA
dofile("$HERE/xff.lua")
local want = tonumber(os.getenv("REQUESTS"))
local seen, bad = 0, 0
function response(status)
  if status ~= 200 then bad = bad + 1 end
  seen = seen + 1
  if seen >= want then os.exit(bad == 0 and 0 or 3) end
end
LUA

# path server -> "sluice-config|url|client|header" (client: h1, h2 or xff)
target() {
    local p=$1 s=$2 up=${1^^}
    [ "$p" = proxied ] && up=LIMITED
    case "$s:$p" in
        nginx:proxied | nginx:reject | nginx:xff) echo "|http://127.0.0.1:${PORT[NGINX_$up]}/|h1|" ;;
        haproxy:proxied | haproxy:reject | haproxy:xff) echo "|http://127.0.0.1:${PORT[HAPROXY_$up]}/|h1|" ;;
        nginx:tls) echo "|https://localhost:${PORT[NGINX_TLS]}/|h1|" ;;
        nginx:h2c) echo "|http://127.0.0.1:${PORT[NGINX_H2]}/|h2|" ;;
        sluice:proxied) echo "limited|http://127.0.0.1:${PORT[SLUICE_LIMITED]}/|h1|" ;;
        sluice:reject) echo "reject|http://127.0.0.1:${PORT[SLUICE_REJECT]}/|h1|" ;;
        sluice:tls) echo "tls|https://localhost:${PORT[SLUICE_TLS_S]}/|h1|" ;;
        sluice:h2c) echo "limited|http://127.0.0.1:${PORT[SLUICE_LIMITED]}/|h2|" ;;
        sluice:xff) echo "xff|http://127.0.0.1:${PORT[SLUICE_XFF]}/|xff|" ;;
        sluice:key) echo "ident|http://127.0.0.1:${PORT[SLUICE_IDENT]}/|h1|x-api-key: $API_KEY" ;;
        sluice:jwt) echo "ident|http://127.0.0.1:${PORT[SLUICE_IDENT]}/|h1|authorization: Bearer $JWT" ;;
        sluice:keyed) echo "keyed|http://127.0.0.1:${PORT[SLUICE_KEYED]}/|h1|x-tenant: acme" ;;
        sluice:shadow | sluice:shadowx) echo "$p|http://127.0.0.1:${PORT[SLUICE_$up]}/|h1|" ;;
        sluice:usage) echo "limited|http://127.0.0.1:${PORT[SLUICE_LIMITED]}/usage|h1|" ;;
        sluice:scanner) echo "usage|http://127.0.0.1:${PORT[SLUICE_USAGE]}/usage|h1|" ;;
        *) echo "" ;; # no such row
    esac
}

# Inside counts (a subshell): stops its server, says why, and fails.
fail() {
    echo "$*" >&2
    [ -n "$SERVER_PID" ] && kill -KILL "$SERVER_PID" 2>/dev/null || true
    exit 1
}

# server path requests -> "Ir I1 D1 LL" of the run
counts() {
    local server=$1 path=$2 n=$3 config url client header
    IFS='|' read -r config url client header <<<"$(target "$path" "$server")"
    local out="$DIR/callgrind.out.$server.$path.$n"
    local vg=(valgrind --tool=callgrind --cache-sim=yes --instr-atstart=no --callgrind-out-file="$out")
    case "$server" in
        sluice)
            SLUICE_LOG=error "${vg[@]}" "$SLUICE_BIN" run -c "$DIR/sluice-$config.toml" \
                >"$DIR/valgrind.log" 2>&1 &
            ;;
        nginx)
            "${vg[@]}" nginx -p "$DIR" -c "$DIR/nginx.conf" -g "master_process off;" \
                >"$DIR/valgrind.log" 2>&1 &
            ;;
        haproxy) "${vg[@]}" haproxy -db -f "$DIR/haproxy.cfg" >"$DIR/valgrind.log" 2>&1 & ;;
    esac
    SERVER_PID=$!
    local ready=0 curl_args=(-sk -o /dev/null --max-time 5)
    [ "$client" = h2 ] && curl_args+=(--http2-prior-knowledge)
    for _ in $(seq 600); do
        if curl "${curl_args[@]}" "$url"; then
            ready=1
            break
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    [ $ready = 1 ] || { cat "$DIR/valgrind.log" >&2; fail "$server ($path) did not answer on $url"; }
    callgrind_control --instr=on "$SERVER_PID" >/dev/null 2>&1
    local hargs=()
    [ -n "$header" ] && hargs=(-H "$header")
    case "$client" in
        h1) h2load --h1 -n "$n" -c "$CONNECTIONS" "${hargs[@]}" "$url" >"$DIR/client.log" 2>&1 ;;
        h2) h2load -n "$n" -c "$CONNECTIONS" -m 10 "${hargs[@]}" "$url" >"$DIR/client.log" 2>&1 ;;
        xff) REQUESTS=$n timeout 1800 wrk -t1 -c"$CONNECTIONS" -d1800s --timeout 30s \
            -s "$DIR/xff-n.lua" "$url" >"$DIR/client.log" 2>&1 ;;
    esac || { cat "$DIR/client.log" >&2; fail "the client failed against $server ($path)"; }
    # Every request answered, with the status the path is for.
    local want=2xx
    [ "$path" = reject ] && want=4xx
    if [ "$client" != xff ]; then # (the Lua script checks its statuses)
        awk -v want=$want '/^status codes:/ {
                got = (want == "2xx") ? $3 : $7
                if (got + 0 == 0 || ($3 + $5 + $7 + $9) - got > 10) bad = 1; seen = 1 }
            END { exit !(seen && !bad) }' "$DIR/client.log" ||
            { cat "$DIR/client.log" >&2; fail "$server ($path): not all $want"; }
    fi
    kill -INT "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" || true
    SERVER_PID=""
    awk '/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
        /^(summary|totals):/ && !done {
            done = 1
            printf "%d %d %d %d\n", $col["Ir"], $col["I1mr"], $col["D1mr"] + $col["D1mw"],
                $col["ILmr"] + $col["DLmr"] + $col["DLmw"] }' "$out"
    [ "${KEEP:-0}" = 1 ] || rm -f "$out"
}

echo "per request, (count at N2 = $N2 - count at N1 = $N1) / $((N2 - N1)); $CONNECTIONS connections"
printf '%-8s %-8s %13s %11s %11s %10s\n' path server instructions "L1i misses" "L1d misses" "LL misses"
for path in $PATHS; do
    for server in $SERVERS; do
        [ -n "$(target "$path" "$server")" ] || continue
        a=$(counts "$server" "$path" "$N1") || exit 1
        b=$(counts "$server" "$path" "$N2") || exit 1
        read -r a_ir a_i1 a_d1 a_ll <<<"$a"
        read -r b_ir b_i1 b_d1 b_ll <<<"$b"
        awk -v p="$path" -v s="$server" -v n=$((N2 - N1)) -v ir=$((b_ir - a_ir)) \
            -v i1=$((b_i1 - a_i1)) -v d1=$((b_d1 - a_d1)) -v ll=$((b_ll - a_ll)) \
            'BEGIN { printf "%-8s %-8s %13.0f %11.0f %11.0f %10.1f\n", p, s, ir / n, i1 / n, d1 / n, ll / n }'
    done
done
