#!/usr/bin/env bash
# Build the Debian packages `execrelay` (the exec server and client) and `execrelay-relay`
# (the relay) with dpkg-deb, into target/debian/ (or $DEB_OUT):
#
#   bash deploy/debian/build.sh            # cargo build --release, then both .deb files
#   DEB_SKIP_BUILD=1 bash deploy/debian/build.sh   # package the release binaries already built
#
# Each package holds its binary (debug info stripped, symbols kept for backtraces), its
# systemd unit (deploy/systemd/), its configuration under /etc/execrelay/ (conffiles: an
# upgrade never overwrites an operator's edits), the operator's guide and the alert rules
# under /usr/share/doc/, and maintainer scripts (deploy/debian/PACKAGE/) that create the
# service's system user. A plain dpkg-deb, not cargo-deb: it needs nothing but dpkg and
# binutils, which every Debian machine has, and installs in no time in CI (cargo-deb would
# be compiled from source on every fresh machine).
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${DEB_OUT:-target/debian}"
arch="$(dpkg --print-architecture)"

if [ "${DEB_SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release --locked -p execrelay --bin execrelay -p execrelay-relay --bin execrelay-relay
fi

version_of() { sed -n 's/^version = "\(.*\)"$/\1/p' "$1" | head -n 1; }

# The newest glibc symbol version a binary needs: its `libc6 (>= …)` dependency.
glibc_of() {
    objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -V | tail -n 1
}

# package NAME BINARY VERSION SUMMARY DESCRIPTION CONFFILE…  (each CONFFILE is SRC:DEST, SRC
# in deploy/, DEST under /etc/execrelay/)
package() {
    local name="$1" bin="$2" version="$3" summary="$4" description="$5"
    shift 5
    local root="$out/$name"
    rm -rf "$root"
    install -D -m 0755 "target/release/$bin" "$root/usr/bin/$bin"
    strip --strip-debug "$root/usr/bin/$bin"
    install -D -m 0644 "deploy/systemd/$name.service" "$root/lib/systemd/system/$name.service"
    install -D -m 0644 deploy/README.md "$root/usr/share/doc/$name/operators.md"
    install -D -m 0644 deploy/alerts.yml "$root/usr/share/doc/$name/alerts.yml"
    install -d -m 0755 "$root/DEBIAN"
    cat > "$root/usr/share/doc/$name/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: execrelay

Files: *
License: MIT OR Apache-2.0
COPYRIGHT
    : > "$root/DEBIAN/conffiles"
    local conf src dest
    for conf in "$@"; do
        src="${conf%%:*}"
        dest="/etc/execrelay/${conf#*:}"
        install -D -m 0644 "deploy/$src" "$root$dest"
        echo "$dest" >> "$root/DEBIAN/conffiles"
    done
    install -m 0755 "deploy/debian/$name/postinst" "deploy/debian/$name/prerm" \
        "deploy/debian/$name/postrm" "$root/DEBIAN/"
    cat > "$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: execrelay developers <execrelay@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= $(glibc_of "$root/usr/bin/$bin")), passwd
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Description: $summary
$(printf '%s\n' "$description" | fold -s -w 78 | sed 's/ *$//; s/^/ /')
CONTROL
    dpkg-deb --root-owner-group --build "$root" "$out/${name}_${version}_${arch}.deb" >/dev/null
    echo "$out/${name}_${version}_${arch}.deb"
}

mkdir -p "$out"
package execrelay execrelay "$(version_of Cargo.toml)" \
    "process-execution server and client, reached directly or through a relay" \
    "execrelay runs processes on a host for authorized clients over end-to-end encrypted streams (JSON-RPC over Noise), directly or through an execrelay relay when the host accepts no inbound connection. This package holds the execrelay binary (server, client and key tool) and the execrelay.service unit, not enabled: configure /etc/execrelay/server.toml first." \
    server.toml:server.toml authorized_keys:authorized_keys
package execrelay-relay execrelay-relay "$(version_of relay/Cargo.toml)" \
    "relay between execrelay clients and exec servers behind NAT" \
    "The execrelay relay routes end-to-end encrypted streams between clients and exec servers that accept no inbound connection; it reads frame headers only and holds no stream key. This package holds the execrelay-relay binary and the execrelay-relay.service unit, not enabled: configure /etc/execrelay/relay.toml and its TLS certificate first." \
    relay.toml:relay.toml environments:environments
