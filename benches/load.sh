#!/usr/bin/env bash
# The load benchmark (README "Load through one relay"): one relay, one exec server registered
# with it, 50 clients through the relay keeping 1,000 processes running for DURATION seconds,
# and the latency of `process/terminate`, of a small run on a connection (`process/start` to
# its exit notice) and of `execrelay run -- true`, p50/p99 on the idle server and under the
# load, side by side. No faults: this measures latency under load, not resilience.
#
#   bash benches/load.sh                        # ten minutes, 50 clients x 20 processes
#   DURATION=60 CLIENTS=10 PER_CLIENT=10 bash benches/load.sh   # a short look
#
# DURATION    seconds of load (default 600)
# CLIENTS     clients, each a key, a link and a session of its own (default 50)
# PER_CLIENT  processes each client keeps running (default 20)
# PACE        output of each loaded process, bytes per second (default 8192)
# SEED        the seed of the processes' lifetimes (default 1)
# OUT         where logs go (default target/load/TIME)
# Anything after the script's arguments goes to `soak load` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --quiet --release -p execrelay --bin execrelay -p execrelay-relay --bin execrelay-relay
out="${OUT:-target/load/$(date +%s)}"
mkdir -p "$out"
cargo bench --locked --quiet --bench soak -- load \
    --duration-s "${DURATION:-600}" --clients "${CLIENTS:-50}" --per-client "${PER_CLIENT:-20}" \
    --pace "${PACE:-8192}" --seed "${SEED:-1}" --bin-dir target/release --out-dir "$out" "$@"
