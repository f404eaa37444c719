#!/usr/bin/env bash
# Main job: lower the default Metal GEMM, print its MSL, execute it and compare with torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
exec "${TILELANG_METAL_VENV:-$root/.venv}/bin/python" -m tilelang_metal demo "$@"
