#!/usr/bin/env bash
# Create (once) the project virtualenv in .venv and install the package with its test extra.
# On Linux the CPU build of torch is pinned through constraints/linux-cpu.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TILELANG_METAL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
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
  "$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install --quiet "${constraints[@]}" -e "$root[test]"
  echo "$want" > "$stamp"
fi
