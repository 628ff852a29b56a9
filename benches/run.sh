#!/usr/bin/env bash
# The benchmark, with its baselines measured in the same run (benchmarks.md).
#   bash benches/run.sh            # 1 GiB per throughput run, 1000 exec-latency runs
#   BENCH_BYTES=268435456 bash benches/run.sh   # quicker (the relay alone: RELAY_BENCH_BYTES, 2 GiB)
# Prints KEY VALUE lines; ratios compare against OpenSSH measured moments before.
set -euo pipefail
cd "$(dirname "$0")/.."
# --workspace: the relay's binary too (the relay section of the benchmark).
cargo build --release --locked --quiet --workspace
base=$(mktemp)
trap 'rm -f "$base"' EXIT
echo "== OpenSSH and raw pipe baselines (benches/ssh_baseline.sh)" >&2
bash benches/ssh_baseline.sh | tee "$base"
echo "== execrelay (benches/bench.rs)" >&2
SSH_BASELINE_FILE="$base" cargo bench --locked --quiet --bench bench
echo "== the relay alone, beside HAProxy and socat (benches/relay.rs)" >&2
bash benches/tcp_proxies.sh
cargo build --release --locked --quiet -p execrelay-relay --bin execrelay-relay
# The relay's CPU is read from /proc in 10 ms ticks: at 256 MiB it is about 0.16 s, so one
# tick moves the HAProxy ratio by 0.1. It moves RELAY_BENCH_BYTES (default 2 GiB, about 10 s
# in all), whatever BENCH_BYTES the rest of the run uses.
BENCH_BYTES="${RELAY_BENCH_BYTES:-2147483648}" cargo bench --locked --quiet --bench relay
echo "== relays in a cluster: direct, through HAProxy, misrouted (benches/cluster.rs)" >&2
cargo bench --locked --quiet --bench cluster
echo "== the links' WebSocket framing beside tungstenite and fastwebsockets (io/benches/ws_codec.rs)" >&2
cargo bench --locked --quiet -p execrelay-io --bench ws_codec
