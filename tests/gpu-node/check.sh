#!/usr/bin/env bash
# pyxis-hook on a real NVIDIA GPU node: inject the real driver into a small rootfs, query the GPUs.
# Needs root, python3, util-linux; pyelftools importable or carried in ./site (see README.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -d "$here/site" ]; then export PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}"; fi
exec timeout 120 "${PYTHON:-python3}" "$here/check.py" "$@"
