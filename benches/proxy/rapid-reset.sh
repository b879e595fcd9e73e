#!/usr/bin/env bash
# A well-behaved client's latency while other clients flood sluice with HTTP/2 rapid
# resets (HEADERS then RST_STREAM, reconnecting whenever sluice closes or refuses
# them; each from a loopback address of its own, since sluice refuses a flooder's
# address for a while): the good client's p50/p99 alone and under attack, and how
# many flood requests reached the upstream.
#
#   benches/proxy/rapid-reset.sh
#
# Environment (see benches/rapid_reset.rs): SECONDS [10], ATTACKERS [2],
# GOOD_CONNECTIONS [4], UPSTREAM_MS [2], BATCH [50], RATE [0], SLUICE_BIN (default: build
# target/dist/sluice), NO_BUILD=1 (use the existing binary).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
if [ -z "${SLUICE_BIN:-}" ]; then
    if [ "${NO_BUILD:-0}" != 1 ]; then
        cargo build --profile dist --bin sluice >&2
    fi
    export SLUICE_BIN=$REPO/target/dist/sluice
fi
ulimit -n 40000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cargo bench --bench rapid_reset
