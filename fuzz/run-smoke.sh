#!/usr/bin/env bash
# Smoke-run every fuzz target for a bounded time (default 20 s each). Used by CI.
# Needs cargo-fuzz; the sanitizer is off because only the stable toolchain is available,
# RUSTC_BOOTSTRAP lets cargo-fuzz pass its unstable flags. `seeds/TARGET` (checked in) holds
# well-formed inputs that start the fuzzer past the parsers' first refusals; `corpus/TARGET`
# is where the fuzzer keeps what it finds.
set -euo pipefail
cd "$(dirname "$0")"
secs="${FUZZ_SECONDS:-20}"
export RUSTC_BOOTSTRAP=1
for t in frame record handshake jsonrpc binary_output binary_write stream websocket; do
    mkdir -p "corpus/$t"
    dirs=("corpus/$t")
    if [ -d "seeds/$t" ]; then dirs+=("seeds/$t"); fi
    cargo fuzz run --sanitizer none "$t" "${dirs[@]}" -- -max_total_time="$secs" -rss_limit_mb=2048
done
