#!/usr/bin/env bash
# Long fuzzing (README "Fuzzing"): every target, one after another, for FUZZ_SECONDS each
# (default 3600) or until FUZZ_RUNS executions (whichever comes first), starting from the
# checked-in seeds (seeds/TARGET, real traffic: `soak capture`) and the corpus kept from
# earlier runs (corpus/TARGET). One summary line per target: executions, rate, corpus size,
# crashes. A crash leaves its input in artifacts/TARGET/ and makes the script exit 1 after the
# other targets ran; copy it into seeds/TARGET/ (the smoke run in CI then replays it) and add a
# focused regression test for the bug.
#
#   FUZZ_SECONDS=3600 bash fuzz/run-long.sh                      # an hour per target
#   FUZZ_RUNS=10000000 FUZZ_TARGETS="record stream" bash fuzz/run-long.sh
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked --version 0.13.2`); the sanitizer is
# off and RUSTC_BOOTSTRAP lets cargo-fuzz pass its unstable flags to the stable toolchain
# (fuzz/run-smoke.sh does the same). FUZZ_JOBS > 1 runs that many fuzzing processes per target.
set -euo pipefail
cd "$(dirname "$0")"
secs="${FUZZ_SECONDS:-3600}"
runs="${FUZZ_RUNS:--1}"
jobs="${FUZZ_JOBS:-1}"
targets="${FUZZ_TARGETS:-frame record handshake jsonrpc binary_output binary_write stream websocket}"
export RUSTC_BOOTSTRAP=1
mkdir -p logs
failed=()
summary=()
for t in $targets; do
    mkdir -p "corpus/$t"
    dirs=("corpus/$t")
    if [ -d "seeds/$t" ]; then dirs+=("seeds/$t"); fi
    log="logs/$t.log"
    start=$(date +%s)
    args=(-max_total_time="$secs" -runs="$runs" -print_final_stats=1 -rss_limit_mb=2048)
    if [ "$jobs" -gt 1 ]; then args+=(-fork="$jobs" -ignore_crashes=0); fi
    set +e
    cargo fuzz run --sanitizer none "$t" "${dirs[@]}" -- "${args[@]}" >"$log" 2>&1
    code=$?
    set -e
    took=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | awk '{s+=$1} END {print s+0}')
    corpus=$(find "corpus/$t" -type f | wc -l)
    # libFuzzer's own rate: `took` also counts building the target.
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | awk '{s+=$1} END {print s+0}')
    if [ "$code" -ne 0 ]; then
        artifact=$(grep -o 'Test unit written to [^ ]*' "$log" | tail -n 1 | sed 's/Test unit written to //')
        line="fuzz: $t: CRASH after $execs executions in ${took} s: ${artifact:-see $log}"
        failed+=("$t")
    else
        line="fuzz: $t: $execs executions in ${took} s with the build ($rate/s), corpus $corpus inputs, no crash"
    fi
    echo "$line"
    summary+=("$line")
done
printf '%s\n' "${summary[@]}" > logs/summary.txt
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
