#!/usr/bin/env bash
# The execrelay client conformance kit.
#
#   conformance/run.sh ADAPTER_CMD [ARGS…]
#
# Starts real servers (ws://, noise+ws://, a relay with an exec server registered with it)
# and a fault-injecting proxy, runs every scenario against the client behind ADAPTER_CMD,
# prints one line per scenario and `N passed, M failed`, and writes a JSON report.
# Environment: CONFORMANCE_REPORT (default conformance-report.json), CONFORMANCE_ONLY
# (comma-separated scenario names), CONFORMANCE_NAME (the client's name in the report),
# EXECRELAY_BIN / EXECRELAY_RELAY_BIN (the server binaries; default target/release, then
# target/debug of this repository). Needs python3 (standard library only).
# Exit status: 0 all passed, 1 some failed, 2 the kit could not run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "$#" -eq 0 ]; then
    echo "usage: $0 ADAPTER_CMD [ARGS…]   (e.g. $0 python3 $here/adapters/python/adapter.py)" >&2
    exit 2
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "conformance: python3 is needed to run the kit (Debian: apt-get install python3)" >&2
    exit 2
fi
adapter="$(printf '%q ' "$@")"
args=(--adapter "$adapter" --report "${CONFORMANCE_REPORT:-conformance-report.json}")
[ -n "${CONFORMANCE_ONLY:-}" ] && args+=(--only "$CONFORMANCE_ONLY")
[ -n "${CONFORMANCE_NAME:-}" ] && args+=(--name "$CONFORMANCE_NAME")
exec python3 "$here/runner.py" "${args[@]}"
