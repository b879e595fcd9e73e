#!/usr/bin/env bash
# Soak: sluice (release build) under 30 minutes of mixed traffic, its memory and open
# descriptors sampled every minute, then judged. Not run in CI.
#
#   benches/soak.sh                          # STORE=memory DURATION=30m
#   STORE=redis benches/soak.sh              # a private redis-server, restarted at 1/3 and 2/3;
#                                            # on_error = "deny"
#   STORE=redis ON_ERROR=local benches/soak.sh   # or "allow": exactness printed, not judged
#   DURATION=3m INTERVAL=10 benches/soak.sh  # a short run, sampled every 10 s
#
# Traffic (benches/soak/drive.py) through a small Python upstream (benches/soak/upstream.py):
# keep-alive HTTP/1.1 and one-request connections from many callers (X-Forwarded-For
# from the trusted 127.0.0.1, and source addresses 127.x.y.z), three times max_keys
# (2000) of them so the table of tracked callers churns, a few hot callers held at 429,
# HTTP/2 bursts (h2load), 1 MiB streamed responses cut by their clients before the
# answer, after the head or mid-body (FIN or RST), a config reload every 10 s
# (alternately a rewritten file and POST /admin/reload), and two registered consumers
# checked for exactness: one sends 3x a limit whose window outlives the run (exactly
# the limit must be admitted), one sends 1/s against 20/minute (no 60 s may hold more).
# With Redis, on_error = "deny" by default: a request Redis cannot decide (down, or no
# answer within the store's timeout) gets 503 with the store-down problem body, the one
# configured 5xx, counted apart; the exactness consumers keep sending throughout.
# ON_ERROR=local or allow decides such requests without Redis (per replica, or not at
# all), so the exactness checks are then printed but not judged, and no 5xx is expected.
#
# Verdict (exit 1 if any fails): RSS flat (median of the last third of the samples
# <= 1.10x the median of the second third; the first third is warm-up, a single spike
# cannot fail the run), fds likewise within FD_SLACK, tracked callers <= max_keys,
# both exactness checks, no 5xx but the configured 503 store down, client errors
# under 0.1 %, no failed reload.
set -euo pipefail
cd "$(dirname "$0")/.."

STORE=${STORE:-memory}
DURATION=${DURATION:-30m}
INTERVAL=${INTERVAL:-60}
ON_ERROR=${ON_ERROR:-deny}
case "$STORE" in memory|redis) ;; *) echo "STORE must be memory or redis" >&2; exit 2 ;; esac
case "$ON_ERROR" in deny|local|allow) ;; *) echo "ON_ERROR must be deny, local or allow" >&2; exit 2 ;; esac
case "$DURATION" in
    *m) seconds=$(( ${DURATION%m} * 60 )) ;;
    *s) seconds=${DURATION%s} ;;
    *h) seconds=$(( ${DURATION%h} * 3600 )) ;;
    *) seconds=$DURATION ;;
esac

for tool in h2load curl python3; do
    command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq nghttp2-client curl >/dev/null; }
done
[ "$STORE" = redis ] && ! command -v redis-server >/dev/null && apt-get install -y -qq redis-server >/dev/null
[ "${NO_BUILD:-0}" = 1 ] || cargo build --profile dist -q
BIN=${SLUICE_BIN:-target/dist/sluice}

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ -f "$tmp/redis.pid" ]; then kill "$(cat "$tmp/redis.pid")" 2>/dev/null || true; fi
    [ "${KEEP_TMP:-0}" = 1 ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export SOAK_STORE=$STORE SOAK_ON_ERROR=$ON_ERROR SOAK_DURATION=$seconds SOAK_INTERVAL=$INTERVAL
export SOAK_MAX_KEYS=${MAX_KEYS:-2000} SOAK_CALLERS=${CALLERS:-6000} SOAK_RATE=${RATE:-1}
export SOAK_FD_SLACK=${FD_SLACK:-16} SOAK_CONFIG=$tmp/gateway.toml
SOAK_PORT=$(free_port); SOAK_ADMIN=$(free_port); SOAK_UPSTREAM=$(free_port)
export SOAK_PORT SOAK_ADMIN SOAK_UPSTREAM

if [ "$STORE" = redis ]; then
    SOAK_REDIS_PORT=$(free_port)
    # Saved on shutdown and loaded on start: a restart keeps the counters.
    SOAK_REDIS_START="redis-server --port $SOAK_REDIS_PORT --bind 127.0.0.1 --save '' \
--appendonly no --dir $tmp --dbfilename soak.rdb --pidfile $tmp/redis.pid --daemonize yes"
    export SOAK_REDIS_PORT SOAK_REDIS_START
    eval "$SOAK_REDIS_START" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$SOAK_REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

python3 benches/soak/upstream.py "$SOAK_UPSTREAM" 2>"$tmp/upstream.log" &
pids+=($!)
python3 benches/soak/drive.py config
SLUICE_LOG=warn "$BIN" run -c "$SOAK_CONFIG" 2>"$tmp/sluice.log" &
SOAK_PID=$!
pids+=("$SOAK_PID")
export SOAK_PID
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$SOAK_ADMIN/readyz" && break; sleep 0.1; done
curl -sf -o /dev/null "http://127.0.0.1:$SOAK_ADMIN/readyz" \
    || { echo "sluice did not become ready:" >&2; cat "$tmp/sluice.log" >&2; exit 1; }

echo "soak: store $STORE$([ "$STORE" = redis ] && echo " (on_error = $ON_ERROR)"), $DURATION, sluice pid $SOAK_PID on 127.0.0.1:$SOAK_PORT, $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
status=0
python3 benches/soak/drive.py run || status=$?
kill -0 "$SOAK_PID" 2>/dev/null || { echo "sluice exited during the run" >&2; status=1; }
if grep -qiE 'panic|error' "$tmp/sluice.log"; then
    echo "sluice's log (warnings and errors, first 20 lines):"
    head -20 "$tmp/sluice.log"
fi
exit $status
