#!/usr/bin/env bash
# Install the plain TCP proxies the relay benchmark measures beside the relay (benches/relay.rs):
# HAProxy (TCP mode, with and without splice) and socat. apt only when one is missing; a
# service the package would start is blocked for the duration of the install (the benchmark
# starts its own, on 127.0.0.1, and stops it).
set -euo pipefail
log() { echo "[tcp-proxies] $*" >&2; }
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v socat >/dev/null 2>&1 || missing+=(socat)
[ "${#missing[@]}" -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || { log "not root: cannot install ${missing[*]}; those baselines are skipped"; exit 0; }
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    created_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
log "installing: ${missing[*]}"
rc=0
if ! apt-get install -y -q "${missing[@]}" >&2; then
    log "apt-get install failed; running apt-get update and retrying"
    { apt-get update -q >&2 && apt-get install -y -q "${missing[@]}" >&2; } || rc=$?
fi
[ "$created_policy" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
[ "$rc" -eq 0 ] || log "could not install ${missing[*]}; those baselines are skipped"
exit 0
