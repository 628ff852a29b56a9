#!/usr/bin/env bash
# The chaos soak (README "Soak"): a relay, two exec servers registered with it (each also on a
# direct listener), every link through a seeded fault-injecting proxy, clients keeping 200
# processes running through them, the relay restarted, links cut and stalled; a stall detector
# with both ends' flow-control state; at the end, every process's output, exit notice, status
# and reason checked, and the hosts checked for children, sessions, RSS and descriptors left
# behind. One summary line per check; exits non-zero on any loss, stall or leak.
#
#   DURATION=600 SEED=7 bash benches/soak.sh        # ten minutes, seed 7
#   SEED=7 DURATION=600 bash benches/soak.sh        # the same faults again (a replay)
#
# DURATION   seconds of load (default 600); draining and the checks take about a minute more
# SEED       every decision of the run: workload, each connection's faults, relay restarts
# PROFILE    release (default) or debug: which build of execrelay and execrelay-relay to run
# FAULT      a fault a debug build injects (src/faults.rs: lose-ready-push, release-past-limit);
#            the soak must then FAIL with a stall, and this script succeeds only if it does
# OUT        where logs go (default target/soak/seedSEED-TIME): faults.log (every fault and
#            failure with its time), server-*.log, relay.log, clients.log, summary.json
# Anything after the script's arguments goes to `soak run` (see `--help`), e.g.
#   bash benches/soak.sh --clients 40 --per-client 5 --relay-restart-s 30
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${DURATION:-600}"
seed="${SEED:-1}"
profile="${PROFILE:-release}"
extra=()
if [ -n "${FAULT:-}" ]; then
    # Fault injection exists in debug builds only; the servers report the stall and go on.
    profile=debug
    extra+=(--server-env "EXECRELAY_DEBUG_FAULTS=$FAULT" --server-env EXECRELAY_STALL_ABORT=0
        --stall-bound-s 10 --drain-s 15 --ttl-ms 8000)
fi
build=(cargo build --locked --quiet -p execrelay --bin execrelay -p execrelay-relay --bin execrelay-relay)
if [ "$profile" = release ]; then build+=(--release); fi
"${build[@]}"
out="${OUT:-target/soak/seed$seed-$(date +%s)}"
mkdir -p "$out"
set +e
cargo bench --locked --quiet --bench soak -- run --duration-s "$duration" --seed "$seed" \
    --bin-dir "target/$profile" --out-dir "$out" --summary-json "$out/summary.json" \
    "${extra[@]}" "$@" 2>"$out/soak.stderr" | tee "$out/soak.out"
code="${PIPESTATUS[0]}"
set -e
if [ -n "${FAULT:-}" ]; then
    if [ "$code" = 1 ] && grep -q '^soak: check stalls .* FAIL' "$out/soak.out"; then
        echo "soak: the injected fault ($FAULT) was caught as a stall, as it must be"
        exit 0
    fi
    echo "soak: the injected fault ($FAULT) was NOT caught (exit $code): the stall detector is blind" >&2
    exit 1
fi
exit "$code"
