#!/usr/bin/env bash
# Test suite (Linux, CPU only): codegen properties, selection table, and numerics in the emulator.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "${TILELANG_METAL_VENV:-$root/.venv}/bin/python" -m pytest -q "$@"
