#!/usr/bin/env bash
# Create (once) the project virtualenv in .venv and install the package with its test, mlx and bench
# extras (bench: matplotlib, which the benchmark dry-run test needs for its chart).
# On Linux the CPU builds of torch and MLX are pinned through constraints/linux-cpu.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TILELANG_METAL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
# The emulator builds kernels ~1.5x faster with clang 19 than with g++ (config.PREFERRED_CXX). A system
# package is installed only when asked (TILELANG_METAL_INSTALL_CLANG=1, as .ci/run does); otherwise
# this says once how to get it and the emulator uses g++.
if ! command -v clang++-19 >/dev/null 2>&1; then
  if [ "${TILELANG_METAL_INSTALL_CLANG:-0}" = "1" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing clang-19 for the emulator (asked by TILELANG_METAL_INSTALL_CLANG=1) ..." >&2
    if ! { apt-get install -y -qq clang-19 || { apt-get update -qq && apt-get install -y -qq clang-19; }; } >/tmp/tilelang_metal-clang.log 2>&1; then
      echo "clang-19 could not be installed (see /tmp/tilelang_metal-clang.log); the emulator uses g++" >&2
    fi
  elif [ ! -f "$venv/.tilelang_metal-installed" ]; then
    echo "note: the emulator uses g++; clang-19 builds its kernels ~1.5x faster (apt-get install clang-19, or TILELANG_METAL_INSTALL_CLANG=1)" >&2
  fi
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.tilelang_metal-installed"
want="$(cat "$root/pyproject.toml" "$root/constraints/linux-cpu.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  constraints=()
  if [ "$(uname -s)" = "Linux" ]; then
    constraints=(-c "$root/constraints/linux-cpu.txt")
  fi
  log="$venv/install.log"
  echo "setting up $venv (log: $log) ..." >&2
  # ${arr[@]+...}: an empty array under `set -u` is an error in macOS's bash 3.2
  # pip's progress goes to the terminal (a first install takes minutes) and to the log
  if ! "$venv/bin/python" -m pip install --progress-bar on ${constraints[@]+"${constraints[@]}"} -e "$root[test,mlx,bench]" 2>&1 | tee "$log" >&2; then
    echo "installation failed; see $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
