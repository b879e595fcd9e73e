#!/usr/bin/env bash
# Throughput of a caller identified by a cached JWT against the same caller by API
# key: the release binary, a direct-response route with limits that never trip, the
# access log off, wrk -t1 -c32, ROUNDS interleaved rounds of DURATION each; prints
# each round and the ratio of the medians (target: JWT >= 0.95x the API key).
#
#   benches/proxy/jwt-vs-key.sh          DURATION=5s ROUNDS=3
set -euo pipefail

cd "$(dirname "$0")/../.."
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
cargo build --release --quiet --bin sluice
SLUICE=$PWD/target/release/sluice
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); admin=$(free_port)
secret=an-hmac-secret-of-at-least-32-bytes-for-bench
# An RS256 token would verify once too: the cache makes the algorithm irrelevant here.
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/rsa.key" 2> /dev/null
openssl pkey -pubout -in "$work/rsa.key" -out "$work/rsa.pem"
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
header=$(printf '{"alg":"RS256","typ":"JWT"}' | b64url)
payload=$(printf '{"sub":"bench","exp":4000000000}' | b64url)
signature=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$work/rsa.key" -binary | b64url)
token="$header.$payload.$signature"
cat > "$work/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[admin]
listen = "127.0.0.1:$admin"
[log]
access = "off"
[identity.jwt]
keys = ["rsa.pem"]
[policies.p]
anonymous = { per_minute = 10 }
registered = { per_second = 1_000_000_000 }
[[consumers]]
name = "keyed"
key = "bench-key-0123456789"
[[routes]]
name = "api"
path_prefix = "/"
respond = { status = 200, body = "ok" }
policy = "p"
TOML
"$SLUICE" -c "$work/gateway.toml" run > /dev/null 2>&1 &
pid=$!
until curl -fs "http://127.0.0.1:$admin/readyz" > /dev/null; do sleep 0.05; done
for h in "x-api-key: bench-key-0123456789" "authorization: Bearer $token"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "$h" "http://127.0.0.1:$port/")
    [ "$code" = 200 ] || { echo "warm-up answered $code for ${h%%:*}"; exit 1; }
done
rps() { wrk -t1 -c32 -d"$DURATION" -H "$1" "http://127.0.0.1:$port/" | awk '/Requests\/sec/ {print int($2)}'; }
key=(); jwt=()
for round in $(seq "$ROUNDS"); do
    key+=("$(rps "x-api-key: bench-key-0123456789")")
    jwt+=("$(rps "authorization: Bearer $token")")
    echo "round $round: api key ${key[-1]} req/s, cached JWT ${jwt[-1]} req/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mk=$(median "${key[@]}"); mj=$(median "${jwt[@]}")
echo "median: api key $mk, cached JWT $mj, ratio $(awk -v a="$mj" -v b="$mk" 'BEGIN {printf "%.2f", a/b}')x"
