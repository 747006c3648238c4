#!/usr/bin/env bash
# One command: set up pyxis-hook and run the embedded demo (fake 4-GPU host, driver tree, container).
# As root it installs what it needs from Debian (gcc, busybox-static, runc) and starts the container.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    for p in gcc libc6-dev busybox-static runc; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
    done
    if [ ${#need[@]} -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
fi
PY="${PYTHON:-python3}"
$PY -m pip install -q --disable-pip-version-check -e .
exec $PY demo/run.py "$@"
