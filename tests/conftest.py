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

_produced: list[str] = []
_checked: set[str] = set()


def _record_sources_and_builds() -> None:
    """Activate the plugin and record every MSL source made and every source built (the
    `_every_msl_source_compiles` fixture checks the rest), then take the lowering cache's baseline."""
    import tilelang_metal  # noqa: F401  (activates the plugin for the whole run)
    from tilelang_metal import emulator
    from tilelang_metal import lowering_cache
    from tilelang_metal.codegen import build as codegen_build

    original_generate = codegen_build.generate_msl
    original_compile = emulator.compile_kernel

    def recording_generate(mod, *args, **kwargs):
        source = original_generate(mod, *args, **kwargs)
        _produced.append(source)
        return source

    def recording_compile(msl, **kwargs):
        kernel = original_compile(msl, **kwargs)
        _checked.add(hashlib.sha256(msl.encode()).hexdigest())  # a full build implies the syntax check
        return kernel

    codegen_build.generate_msl = recording_generate
    emulator.compile_kernel = recording_compile
    lowering_cache.take_baseline()  # with the recording wrappers above, the code every test starts from


def _is_xdist_controller(config: pytest.Config) -> bool:
    """True in the pytest-xdist process that only hands tests to its workers (it collects and runs
    nothing): xdist's own conditions for starting workers (`-n N` sets `dist` and `tx`)."""
    if hasattr(config, "workerinput"):
        return False
    return (
        config.getoption("dist", "no") != "no"
        and bool(config.getoption("tx", None))
        and not config.getoption("collectonly")
    )


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
    # Before any test module is imported (collection comes after). Not in xdist's controller: it
    # would import tilelang, TVM and torch for nothing (~4 s of CPU per run).
    if _is_xdist_controller(config):
        return
    _record_sources_and_builds()
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
