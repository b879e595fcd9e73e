#!/usr/bin/env bash
# The flash sale of DESIGN.md through sluice and through nginx (limit_req +
# limit_conn), in one run: a shop upstream taking 50 ms an order, POST /orders limited
# to 2 000 a second in total, 200 in flight and 1 a second / 5 a minute per customer;
# CALLERS customers send two orders each, all at once, ROUNDS times.
#
#   benches/proxy/flash-sale.sh           full run (CALLERS=3000, ROUNDS=3)
#   benches/proxy/flash-sale.sh --smoke   CALLERS=300, ROUNDS=1: checks that it runs
#
# Prints per gateway: goodput (orders reaching the shop per second of burst), p50/p99
# of admitted (200) and refused (429/503) answers, the shop's peak in-flight, and the
# orders over the limits (arrived while 200 were in the works, or made a one-second
# window exceed 2 000): 0 for sluice. See benches/flash_sale.rs for both configs.
#
# Environment: CALLERS, ROUNDS, SKIP (sluice|nginx), SLUICE_BIN (default: build
# target/dist/sluice), NO_BUILD=1 (use the existing binary), VERBOSE=1 (statuses
# of every round).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

case "${1:-}" in
    "") ;;
    --smoke)
        export CALLERS=${CALLERS:-300} ROUNDS=${ROUNDS:-1}
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: $0 [--smoke | --help]" >&2
        exit 64
        ;;
esac

PATH=$PATH:/usr/sbin:/sbin
if ! command -v nginx >/dev/null; then
    echo "installing nginx with apt-get" >&2
    SUDO=
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nginx >&2
fi

cd "$REPO"
if [ -z "${SLUICE_BIN:-}" ]; then
    if [ "${NO_BUILD:-0}" != 1 ]; then
        cargo build --profile dist --bin sluice >&2
    fi
    export SLUICE_BIN=$REPO/target/dist/sluice
fi
# Thousands of connections at once, on both sides of each gateway.
ulimit -n 40000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NGINX=$(command -v nginx) cargo bench --bench flash_sale
