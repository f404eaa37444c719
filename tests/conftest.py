"""Suite-wide fixtures.

Tiers (directories): unit/ (no emulator runs), codegen/ (MSL source properties), numerics/ (kernels
run in the emulator), emulator/ (the emulator itself), slow/ (marked `slow`; `scripts/test.sh
--quick` skips them). Shared helpers (`gemm_support.py`, `corpus_kernels.py`) live here, importable
from every tier (this conftest puts tests/ on sys.path).

Every MSL source any test makes goes through the emulator's `check_source` (C++ syntax and types
against the MSL shim) when that test ends, so no test can produce MSL that would not compile.
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for _path in (TESTS, ROOT):  # ROOT first: this checkout's tilelang_metal; TESTS: the shared helpers
    if _path not in sys.path:
        sys.path.insert(0, _path)

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
# The emulator's build cache is shared by every checkout and process of a machine (~/.cache): the
# suite keeps its own, in this checkout, so its cold / warm times and its evictions are its own.
os.environ.setdefault("TILELANG_METAL_EMULATOR_CACHE", os.path.join(ROOT, ".emulator-cache"))
# Lowered modules too (tilelang_metal/lowering_cache.py): a second run loads what the first lowered;
# a test that swaps a plugin function or an instruction lowers afresh (the key holds their identity).
os.environ.setdefault("TILELANG_METAL_LOWERING_CACHE", os.path.join(ROOT, ".lowering-cache"))

import tilelang_metal  # noqa: E402,F401  (activates the plugin for the whole suite)
from tilelang_metal.codegen import build as codegen_build  # noqa: E402

_produced: list[str] = []
_checked: set[str] = set()
_original_generate = codegen_build.generate_msl


def _recording_generate(mod, *args, **kwargs):
    source = _original_generate(mod, *args, **kwargs)
    _produced.append(source)
    return source


codegen_build.generate_msl = _recording_generate

from tilelang_metal import emulator as _emulator  # noqa: E402

_original_compile = _emulator.compile_kernel


def _recording_compile(msl, **kwargs):
    kernel = _original_compile(msl, **kwargs)
    _checked.add(hashlib.sha256(msl.encode()).hexdigest())  # a full build implies the syntax check
    return kernel


_emulator.compile_kernel = _recording_compile

from tilelang_metal import lowering_cache as _lowering_cache  # noqa: E402

_lowering_cache.take_baseline()  # with the recording wrappers above, the code every test starts from


SLOW_TIER = os.path.join(TESTS, "slow")


def pytest_addoption(parser):
    parser.addoption(
        "--racecheck",
        action="store_true",
        help="run every emulator launch of a JIT kernel under tilelang_metal.emulator.racecheck (2 schedules)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "no_source_check: the test makes MSL that is meant not to compile")
    config.addinivalue_line("markers", "mlx_reference: MLX's Metal kernels in the emulator (tests/mlx_reference; scripts/test.sh --mlx-reference)")
    config.addinivalue_line("markers", "plain_schedule: checks what one plain launch prints; left out of the --racecheck tier (two schedules print twice)")
    config.addinivalue_line("markers", "slow: long-running sweeps and large shapes (tests/slow; skipped by scripts/test.sh --quick)")
    if config.getoption("--racecheck"):
        from tilelang_metal.emulator import racecheck
        from tilelang_metal.execution.emulator_adapter import EmulatorKernelAdapter

        def make_runner(self):
            return lambda *args: racecheck(self, *args, seeds=(0, 1))

        EmulatorKernelAdapter.make_runner = make_runner


def pytest_collection_modifyitems(config, items):
    # everything in tests/slow belongs to the slow tier, marked or not
    racecheck_tier = config.getoption("--racecheck")
    for item in items:
        if str(item.path).startswith(SLOW_TIER + os.sep) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if racecheck_tier and item.get_closest_marker("plain_schedule"):
            item.add_marker(pytest.mark.skip(reason="checks one plain launch's output; the --racecheck tier runs two schedules"))
    # The slow tier's long sweeps run first: pytest-xdist hands out the last tests in chunks a worker
    # cannot share, so a sweep collected last (tests/slow is) kept one worker busy while the other
    # idled (a cold run at 168% of 2 CPUs instead of 182%). Stable: the order within a tier stays.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _every_msl_source_compiles(request):
    start = len(_produced)
    yield
    if request.node.get_closest_marker("no_source_check"):
        return
    from tilelang_metal.emulator import check_source

    for source in _produced[start:]:
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest in _checked:
            continue
        check_source(source)
        _checked.add(digest)


@pytest.fixture
def metal4():
    from tilelang_metal.kernels import metal4_target

    return metal4_target()


@pytest.fixture
def plain_metal():
    from tilelang_metal.kernels import plain_metal_target

    return plain_metal_target()
