#!/usr/bin/env bash
# The Python package's benchmark (benches/python_sdk.py): run("true") latency and output
# MB/s from Python, beside the Rust client and OpenSSH driven from Python, in one run.
#   bash benches/python_sdk.sh                          # 1 GiB, 300 latency runs
#   BENCH_BYTES=268435456 bash benches/python_sdk.sh    # quicker
# Needs root (the throwaway sshd of benches/ssh_baseline.sh) and python3 with venv; builds
# the release binaries and the Rust conformance adapter, and a virtual environment with the
# package under target/python-bench-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet --workspace --bins
cargo build --release --locked --quiet --example conformance-adapter
venv=target/python-bench-venv
if [ ! -x "$venv/bin/python3" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r clients/python/tests/requirements.txt
fi
build=target/python-bench-build
rm -rf "$build" && mkdir -p "$build" && cp -r clients/python/. "$build"/
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$build"
export EXECRELAY_BIN="$PWD/target/release/execrelay" EXECRELAY_RELAY_BIN="$PWD/target/release/execrelay-relay"
export RUST_ADAPTER="$PWD/target/release/examples/conformance-adapter"
SSH_BASELINE_EXEC="$venv/bin/python3 benches/python_sdk.py" bash benches/ssh_baseline.sh
