#!/usr/bin/env bash
# What the usage scanner (cost_after = "json:usage.total_tokens") costs a release
# sluice: streaming throughput and proxied requests per second, the same route with
# and without cost_after, side by side.
#
#   benches/proxy/usage-scanner.sh BINARY
#
# The shared nginx upstream (upstream-nginx.conf.in) serves three answers: /big.json, one JSON document of SIZE_MB
# megabytes (a long text field, the usage at its very end), /big.sse, an event stream
# of the same size (small delta events as LLM APIs stream them, a usage event, then
# [DONE]), and /usage, an 83-byte JSON answer with a usage field. Two sluice
# processes (one worker thread each) proxy them, "plain" without cost_after and
# "scanner" with it. Each of ROUNDS rounds, in alternating order: curl downloads each
# big answer once through each sluice (MB/s, curl's average download speed), and
# h2load sends REQUESTS keep-alive requests for /usage over CONNS connections (req/s).
# Printed: the median of each figure and the ratio scanner / plain of the medians.
# Environment: SIZE_MB [100], ROUNDS [9], REQUESTS [20000], CONNS [8].
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: usage-scanner.sh BINARY" >&2; exit 2; }
BIN=$1
SIZE_MB=${SIZE_MB:-100}
ROUNDS=${ROUNDS:-9}
REQUESTS=${REQUESTS:-20000}
CONNS=${CONNS:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-config.sh
. "$HERE/bench-config.sh"
bench_workspace
UP=$(free_port)
declare -A PORT=([plain]=$(free_port) [scanner]=$(free_port))
# The answers (static files: nginx spends next to nothing on them).
python3 - "$TMP" "$SIZE_MB" <<'EOF'
import sys
tmp, size = sys.argv[1], int(sys.argv[2]) << 20
tail = ',"usage":{"prompt_tokens":3,"total_tokens":7}}'
with open(f"{tmp}/big.json", "w") as f:
    head = '{"id":"cmpl-1","choices":[{"text":"'
    f.write(head + "lorem ipsum dolor sit amet " * ((size - len(head) - len(tail)) // 27))
    f.write('"}]' + tail)
event = 'data: {"id":"cmpl-1","choices":[{"index":0,"delta":{"content":" lorem ipsum"}}]}\n\n'
with open(f"{tmp}/big.sse", "w") as f:
    f.write(event * (size // len(event)))
    f.write('data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"total_tokens":7}}\n\n')
    f.write("data: [DONE]\n\n")
EOF
# nginx's workers (another user) read them through the directory.
chmod 755 "$TMP"
chmod 644 "$TMP"/big.*
start_upstream

sluice_bench_config "${PORT[plain]}" "$(free_port)" "$NEVER" >"$TMP/plain.toml"
sluice_bench_config "${PORT[scanner]}" "$(free_port)" "$NEVER" "" "" \
    'cost_after = "json:usage.total_tokens"' >"$TMP/scanner.toml"
for v in plain scanner; do
    SLUICE_LOG=error "$BIN" run -c "$TMP/$v.toml" >"$TMP/$v.log" 2>&1 &
    PIDS+=($!)
done
for v in plain scanner; do
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:${PORT[$v]}/usage" && break
        sleep 0.1
    done
done
# Every byte must arrive, with or without the scanner.
for v in plain scanner; do
    for f in big.json big.sse; do
        got=$(curl -s "http://127.0.0.1:${PORT[$v]}/$f" | cksum)
        [ "$got" = "$(cksum <"$TMP/$f")" ] || { echo "$v /$f: body differs" >&2; exit 1; }
    done
done

# variant what -> one figure
measure() {
    case "$2" in
        json | sse)
            curl -s -o /dev/null -w '%{speed_download}\n' "http://127.0.0.1:${PORT[$1]}/big.$2" |
                awk '{printf "%.1f\n", $1 / 1048576}'
            ;;
        rps)
            h2load --h1 -n "$REQUESTS" -c "$CONNS" "http://127.0.0.1:${PORT[$1]}/usage" |
                awk '/^finished in/ {gsub(",", "", $4); print $4}'
            ;;
    esac
}

for r in $(seq "$ROUNDS"); do
    order="plain scanner"
    [ $((r % 2)) = 0 ] && order="scanner plain"
    for what in json sse rps; do
        for v in $order; do
            echo "$v $what $(measure "$v" "$what")" >>"$TMP/figures"
        done
    done
done

median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "SIZE_MB=$SIZE_MB ROUNDS=$ROUNDS REQUESTS=$REQUESTS CONNS=$CONNS $BIN"
for what in json sse rps; do
    p=$(awk -v w=$what '$1 == "plain" && $2 == w {print $3}' "$TMP/figures" | median)
    s=$(awk -v w=$what '$1 == "scanner" && $2 == w {print $3}' "$TMP/figures" | median)
    unit="MB/s"
    [ $what = rps ] && unit="req/s"
    awk -v w=$what -v p="$p" -v s="$s" -v u="$unit" \
        'BEGIN { printf "%-4s plain %10.1f %-5s  scanner %10.1f %-5s  ratio %.3fx\n", w, p, u, s, u, s / p }'
done
