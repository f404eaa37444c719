#!/usr/bin/env bash
# Test suite (Linux, CPU only): codegen properties, selection table, and numerics in the emulator.
#   bash scripts/test.sh            everything (what CI runs)
#   bash scripts/test.sh --quick    all but the slow tier (tests/slow, @pytest.mark.slow)
#   bash scripts/test.sh --racecheck  the numerics tier with every emulator launch under the race
#                                     checker (pytest --racecheck; .ci/run runs it after the suite)
#   bash scripts/test.sh --mlx-reference  MLX's production Metal kernels in the emulator against
#                                     torch (tests/mlx_reference; downloads the mlx-metal wheel)
# Further arguments go to pytest. Tests run in one process per CPU (pytest-xdist);
# TILELANG_METAL_TEST_WORKERS=0 runs them in this process (e.g. for pdb).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tier=()
if [[ "${1:-}" == "--quick" ]]; then
  shift
  tier=(-m "not slow")
elif [[ "${1:-}" == "--racecheck" ]]; then
  shift
  tier=(tests/numerics --racecheck)
elif [[ "${1:-}" == "--mlx-reference" ]]; then
  shift
  tier=(tests/mlx_reference)
fi
if [[ ${#tier[@]} -eq 0 || "${tier[0]}" == "-m" ]]; then
  tier+=(--ignore=tests/mlx_reference)  # its own tier: downloads MLX's kernel headers
fi
bash "$root/scripts/setup_env.sh"
cd "$root"
# Bytecode is cached even where the environment turns it off (PYTHONDONTWRITEBYTECODE, as in CI's
# container): otherwise the controller, every worker and every `python -c` a test starts compile
# tilelang_metal from source and pytest re-rewrites the asserts of all test modules (collection:
# 11.0 -> 6.8 s of CPU per process). The __pycache__ folders are gitignored.
unset PYTHONDONTWRITEBYTECODE
# worksteal: a worker that runs out takes half of the other's queue. The default (load) hands each
# worker a fixed first chunk of ~1/8 of the suite, which it must finish alone: the one holding the
# slow tier's sweeps ran 150 s after the other had nothing left (cold run, 175% of 2 CPUs).
workers=(-n "${TILELANG_METAL_TEST_WORKERS:-auto}" --dist worksteal)
if [[ "${TILELANG_METAL_TEST_WORKERS:-auto}" == "0" ]]; then
  workers=()
fi
exec "${TILELANG_METAL_VENV:-$root/.venv}/bin/python" -m pytest -q ${workers[@]+"${workers[@]}"} ${tier[@]+"${tier[@]}"} "$@"
