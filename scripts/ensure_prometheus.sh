#!/usr/bin/env bash
# Install the system tools that the operations tests run for real, when they are missing:
#   prometheus + promtool (Debian package "prometheus"), systemd-analyze ("systemd"), shellcheck, curl (the
#   sidecar's shell-job tests).
# Idempotent and quick when everything is present; `make test` calls it before pytest.
set -euo pipefail

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v curl >/dev/null 2>&1 || missing+=(curl)

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
# De-duplicate (prometheus may be listed twice).
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_prometheus: missing ${packages[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure_prometheus: missing ${packages[*]}; run as root or install them by hand" >&2
        exit 1
    fi
    sudo=(sudo)
fi
echo "ensure_prometheus: installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
# --no-install-recommends keeps the prometheus package from pulling in exporters and a web UI build.
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# Debian's postinst may start the packaged prometheus service where an init system runs; the tests
# start their own server on a free loopback port, so a running one does no harm.
