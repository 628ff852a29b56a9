#!/usr/bin/env bash
# The deployment checks of CI, run by .ci/run after the test suite (they need root and
# Debian packages, so they are not part of `cargo test`):
#
# 1. build the Debian packages (deploy/debian/build.sh), install them with `dpkg -i`, run
#    `execrelay --version` and `execrelay-relay --version` from /usr/bin, check that the
#    service users exist and that each unit's first start makes its key (`keygen
#    --if-missing`, twice: the second keeps it);
# 2. check the installed systemd units with `systemd-analyze verify` (it works without systemd
#    as PID 1: it loads the unit files offline); any warning fails;
# 3. check the alert rules with `promtool check rules` and their unit tests with `promtool
#    test rules`.
#
# The packages are purged at the end, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
command -v objdump >/dev/null 2>&1 || need+=(binutils)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

echo "== alert rules"
promtool check rules deploy/alerts.yml
promtool test rules deploy/alerts_test.yml

echo "== Debian packages"
mapfile -t debs < <(bash deploy/debian/build.sh)
for deb in "${debs[@]}"; do
    dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\):/  \1:/p'
done
trap 'dpkg --purge execrelay execrelay-relay >/dev/null 2>&1 || true' EXIT
dpkg -i "${debs[@]}"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
relay_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' relay/Cargo.toml | head -n 1)"
test "$(/usr/bin/execrelay --version)" = "execrelay $version"
test "$(/usr/bin/execrelay-relay --version)" = "execrelay-relay $relay_version"
/usr/bin/execrelay --version
/usr/bin/execrelay-relay --version
getent passwd execrelay >/dev/null
getent passwd execrelay-relay >/dev/null
for f in server.toml authorized_keys relay.toml environments; do
    test -f "/etc/execrelay/$f"
done

state="$(mktemp -d)"
trap 'rm -rf "$state"; dpkg --purge execrelay execrelay-relay >/dev/null 2>&1 || true' EXIT
chown execrelay-relay "$state"
runuser -u execrelay-relay -- /usr/bin/execrelay-relay keygen --if-missing -o "$state/relay.key" >/dev/null
first="$(cat "$state/relay.key.pub")"
runuser -u execrelay-relay -- /usr/bin/execrelay-relay keygen --if-missing -o "$state/relay.key" 2>/dev/null
test "$first" = "$(cat "$state/relay.key.pub")"
test "$(stat -c %a "$state/relay.key")" = 600

echo "== systemd units"
units=(/lib/systemd/system/execrelay.service /lib/systemd/system/execrelay-relay.service)
if ! out="$(systemd-analyze verify "${units[@]}" 2>&1)" || [ -n "$out" ]; then
    echo "systemd-analyze verify: ${out:-failed}" >&2
    exit 1
fi
echo "  systemd-analyze verify: ${units[*]}: clean"
