#!/usr/bin/env bash
# Prepare a Debian/Ubuntu host (as root) for llamaforge: Docker engine, debootstrap, the build toolchain for the
# local executor, and llamaforge itself. Safe to re-run.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-host.sh: run as root (it installs packages and starts dockerd)" >&2
    exit 1
fi

need=()
for tool in dockerd:docker.io debootstrap:debootstrap git:git cmake:cmake ninja:ninja-build ccache:ccache cc:gcc \
    ip:iproute2 openssl:openssl systemd-analyze:systemd; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    (dockerd >/var/log/llamaforge-dockerd.log 2>&1 &)
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "setup-host.sh: dockerd did not start; see /var/log/llamaforge-dockerd.log" >&2; exit 1; }
fi

python3 -m pip install -q -e "$(dirname "$0")/..[test]"
