#!/usr/bin/env bash
# The package as a user installs it: build the sdist and the wheel, install the wheel into a fresh
# virtual environment, and run the demo and a test subset against the installed copy (not this
# checkout). Then build the native emulator runtime with CMake and run its self-test.
#   bash scripts/check_package.sh [WORKDIR]     (default: a new temporary directory)
# CI (.ci/run) runs it after the suite; budget 10 minutes on the 2-core machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
bash "$root/scripts/setup_env.sh"
dev="${TILELANG_METAL_VENV:-$root/.venv}/bin/python"
start=$SECONDS

echo "== build: sdist and wheel into $work/dist"
rm -rf "$work/dist"
"$dev" -m build --sdist --wheel --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/tilelang_metal-*.whl)
sdist=$(ls "$work"/dist/tilelang_metal-*.tar.gz)
version=$("$dev" -c "import sys; sys.path.insert(0, '$root'); from tilelang_metal.version import __version__; print(__version__)")
case "$(basename "$wheel")" in
  "tilelang_metal-$version-"*) ;;
  *) echo "wheel $(basename "$wheel") does not carry the version $version of tilelang_metal/version.py" >&2; exit 1 ;;
esac
# the emulator's shim headers and runtime sources are package data: without them nothing runs
"$dev" - "$wheel" "$sdist" <<'EOF'
import sys, tarfile, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("tilelang_metal/emulator/shim/metal_stdlib", "tilelang_metal/emulator/runtime/runtime.cpp", "tilelang_metal/emulator/runtime/fiber.cpp"):
    assert need in names, f"the wheel lacks {need}"
members = tarfile.open(sys.argv[2]).getnames()
assert any(m.endswith("tilelang_metal/emulator/shim/metal_stdlib") for m in members), "the sdist lacks the shim"
print(f"wheel: {len(names)} files; sdist: {len(members)} members")
EOF

echo "== install the wheel into a fresh virtual environment"
rm -rf "$work/venv"
"${PYTHON:-python3}" -m venv "$work/venv"
constraints=()
if [ "$(uname -s)" = "Linux" ]; then
  constraints=(-c "$root/constraints/linux-cpu.txt")
fi
"$work/venv/bin/python" -m pip install -q ${constraints[@]+"${constraints[@]}"} "$wheel[test]" >"$work/install.log" 2>&1 || { tail -n 30 "$work/install.log"; exit 1; }

echo "== demo and tests from the installed package (run outside the checkout)"
rm -rf "$work/run" && mkdir -p "$work/run"
cp -r "$root/tests" "$work/run/tests"  # tests/conftest.py puts its parent first on sys.path: no tilelang_metal there
cd "$work/run"
export TILELANG_METAL_EMULATOR_CACHE="$work/emulator-cache"
"$work/venv/bin/python" - <<'EOF'
import tilelang_metal, tilelang_metal.emulator.toolchain as t
assert "site-packages" in tilelang_metal.__file__, tilelang_metal.__file__
assert (t.SHIM_DIR / "metal_stdlib").is_file() and "site-packages" in str(t.SHIM_DIR)
print("installed:", tilelang_metal.__version__, tilelang_metal.__file__)
EOF
"$work/venv/bin/python" -m tilelang_metal demo >"$work/demo.log" 2>&1 || { tail -n 30 "$work/demo.log"; exit 1; }
tail -n 3 "$work/demo.log"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/unit/test_activation.py tests/emulator/test_execution.py tests/numerics/test_zero_trip_sync.py \
  tests/numerics/test_jit.py

echo "== native runtime with CMake and its self-test"
cmake -S "$root" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 || { tail -n 30 "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" -j 2 >>"$work/cmake.log" 2>&1 || { tail -n 30 "$work/cmake.log"; exit 1; }
ctest --test-dir "$work/cmake" --output-on-failure
echo "package check passed in $((SECONDS - start)) s"
