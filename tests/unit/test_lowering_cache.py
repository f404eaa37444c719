"""The lowering cache (tilelang_metal/lowering_cache.py): a second lowering of the same kernel under
the same options loads the stored module, and the kernel it gives runs; anything that changes the
lowering (options, pass configs, a patched pass, a substituted instruction) or observes it lowers
afresh; damaged entries and refusals never reach a caller."""

import dataclasses

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.target import isa
from tilelang_metal import lowering_cache, pipeline
from tilelang_metal import kernels as K
from tilelang_metal.errors import GemmLoweringError
from tilelang_metal.gemm import recorded_plans


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_LOWERING_CACHE", str(tmp_path))
    return tmp_path


def _entries(root) -> list:
    return sorted(p for p in root.rglob("*.json.z"))


def _delta(before: dict) -> dict:
    now = lowering_cache.stats()
    return {k: now[k] - before[k] for k in now}


def _source(func, target=None, pass_configs=None) -> str:
    if pass_configs is not None:
        return tilelang.compile(func, target=target or K.metal4_target(), execution_backend="emulator",
                                pass_configs=pass_configs).get_kernel_source()
    return tilelang.lower(func, target=target or K.metal4_target()).kernel_source


def test_second_lowering_is_a_hit_and_its_kernel_runs(cache_dir):
    func = K.gemm_direct_global(37, 70, 48, out_dtype="float32")
    before = lowering_cache.stats()
    first = tilelang.compile(func, out_idx=[-1], target=K.metal4_target(), execution_backend="emulator")
    assert _delta(before) == {"hits": 0, "misses": 1, "bypassed": 0} and len(_entries(cache_dir)) == 1
    second = tilelang.compile(K.gemm_direct_global(37, 70, 48, out_dtype="float32"), out_idx=[-1], target=K.metal4_target(),
                              execution_backend="emulator")
    assert _delta(before) == {"hits": 1, "misses": 1, "bypassed": 0}
    assert second.get_kernel_source() == first.get_kernel_source()
    torch.manual_seed(0)
    a, b = torch.randn(37, 48).half(), torch.randn(48, 70).half()
    torch.testing.assert_close(second(a, b), a.float() @ b.float(), rtol=1e-3, atol=1e-3)


def _dynamic_scale(dtype: str = "float32"):
    n = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((n, 4), dtype), Y: T.Tensor((n, 4), dtype)):
        with T.Kernel(T.ceildiv(n, 32), threads=128) as bx:
            for i, j in T.Parallel(32, 4):
                if bx * 32 + i < n:
                    Y[bx * 32 + i, j] = X[bx * 32 + i, j] * 2.0 + 1.0

    return main


@pytest.fixture(scope="module")
def shape_variable_entries(tmp_path_factory):
    """One cache for every size below: the sizes share one dynamic kernel, lowered once."""
    return tmp_path_factory.mktemp("shape-variables")


@pytest.mark.parametrize("rows", [0, 1, 33, 70])
def test_a_hit_keeps_the_callers_shape_variables(shape_variable_entries, monkeypatch, rows):
    """The host code of a stored module names the caller's own parameters and shape variables
    (the adapter binds arguments to them by identity), at every dynamic size."""
    monkeypatch.setenv("TILELANG_METAL_LOWERING_CACHE", str(shape_variable_entries))
    tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    before = lowering_cache.stats()
    kernel = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    assert _delta(before)["hits"] == 1
    x = torch.randn(rows, 4)
    torch.testing.assert_close(kernel(x), x * 2 + 1)


def test_a_hit_skips_tvms_python_json_upgrade(cache_dir, monkeypatch):
    """An entry is read by TVM's loader alone: `tvm.ir.load_json` first re-encodes the whole text in
    Python (`json_compact.upgrade_json`, most of a hit's time), a no-op on what this TVM wrote."""
    from tvm.ir import json_compact

    first = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")

    def refuse(text):
        raise AssertionError("the entry went through json_compact.upgrade_json")

    monkeypatch.setattr(json_compact, "upgrade_json", refuse)
    before = lowering_cache.stats()
    kernel = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    assert _delta(before) == {"hits": 1, "misses": 0, "bypassed": 0}
    assert kernel.get_kernel_source() == first.get_kernel_source()
    x = torch.randn(33, 4)
    torch.testing.assert_close(kernel(x), x * 2 + 1)


def test_options_and_pass_configs_are_part_of_the_key(cache_dir, monkeypatch):
    func = K.gemm_direct_global(64, 128, 32)
    base = _source(func)
    monkeypatch.setenv("TILELANG_METAL_RELAXED_PRECISION", "0")
    exact = _source(func)
    assert exact != base and len(_entries(cache_dir)) == 2
    monkeypatch.delenv("TILELANG_METAL_RELAXED_PRECISION")
    before = lowering_cache.stats()
    assert _source(func, pass_configs={"tilelang_metal.relaxed_precision": "off"}) == exact  # the same options
    assert _delta(before)["hits"] == 1
    _source(func, pass_configs={"tl.disable_vectorize_256": True})  # one of tilelang's own: a new key
    assert len(_entries(cache_dir)) == 3
    before = lowering_cache.stats()
    assert _source(func) == base and _delta(before)["hits"] == 1


def test_a_patched_pass_is_never_cached_nor_stored(cache_dir, monkeypatch):
    func = K.gemm_shared(64, 64, 32)
    plain = _source(func)
    calls = []
    real = pipeline.SyncWhileLoops
    with monkeypatch.context() as patch:  # its own context: undoing it keeps cache_dir's setting
        patch.setattr(pipeline, "SyncWhileLoops", lambda mod: calls.append(1) or real(mod))
        assert lowering_cache.patched() == "tilelang_metal.pipeline.SyncWhileLoops"
        before = lowering_cache.stats()
        assert _source(func) == plain
        assert calls, "the patched pass did not run"
        assert _delta(before) == {"hits": 0, "misses": 0, "bypassed": 1}, _delta(before)
        assert len(_entries(cache_dir)) == 1, _entries(cache_dir)
    assert lowering_cache.patched() is None
    before = lowering_cache.stats()
    _source(func)
    assert _delta(before)["hits"] == 1


def test_a_substituted_instruction_lowers_afresh(cache_dir):
    inst = isa.REGISTRY.named(isa.SIMDGROUP_8x8x8.name)
    stand_in = dataclasses.replace(inst)  # equal, but another object: the registry is not as written
    func = K.gemm_direct_global(64, 64, 32)
    _source(func, K.plain_metal_target())
    with isa.REGISTRY.substituted(stand_in):
        assert lowering_cache.patched() == "isa.REGISTRY"
        before = lowering_cache.stats()
        _source(func, K.plain_metal_target())
        assert _delta(before)["bypassed"] == 1


def test_observed_lowerings_run_the_passes(cache_dir):
    func = K.gemm_direct_global(64, 128, 32)
    _source(func)
    with recorded_plans() as plans:
        before = lowering_cache.stats()
        _source(func)
    assert plans and _delta(before)["bypassed"] == 1


def test_a_damaged_entry_is_lowered_again(cache_dir):
    func = K.gemm_direct_global(64, 128, 32)
    good = _source(func)
    (entry,) = _entries(cache_dir)
    entry.write_bytes(b"not an entry")
    before = lowering_cache.stats()
    assert _source(func) == good and _delta(before)["misses"] == 1
    before = lowering_cache.stats()
    assert _source(func) == good and _delta(before)["hits"] == 1


def _gemm_on_100_threads():
    """A GEMM the lowering refuses (kernels.gemm_direct_global refuses threads=100 itself, before lowering)."""

    @T.prim_func
    def main(A: T.Tensor((64, 32), "float16"), B: T.Tensor((32, 128), "float16"), C: T.Tensor((64, 128), "float16")):
        with T.Kernel(1, 1, threads=100) as (bx, by):
            T.gemm(A[0:64, 0:32], B[0:32, 0:128], C[0:64, 0:128], clear_accum=True)

    return main


def test_refusals_are_raised_every_time_and_never_stored(cache_dir):
    for _ in range(2):
        with pytest.raises(GemmLoweringError, match="threads=100 is not a multiple of 32"):
            _source(_gemm_on_100_threads())
    assert _entries(cache_dir) == []


def test_only_the_latest_source_versions_are_kept(cache_dir):
    """Entries live under the hash of the plugin's sources; an edited checkout's first lowering
    deletes all but the most recently used versions, so the directory does not grow with each edit."""
    import os

    for age, name in enumerate(["v_newest", "v_newer", "v_old", "v_oldest"]):
        (cache_dir / name / "ab").mkdir(parents=True)
        (cache_dir / name / "ab" / "x.json.z").write_bytes(b"stale")
        os.utime(cache_dir / name, (1_000_000 - age * 1000, 1_000_000 - age * 1000))
    _source(K.gemm_direct_global(64, 128, 32))
    kept = sorted(d.name for d in cache_dir.iterdir())
    assert kept == sorted(["v_newest", "v_newer", lowering_cache.source_fingerprint()]), kept
    assert lowering_cache.KEPT_VERSIONS == 3


def test_an_unwritable_cache_never_fails_a_compile(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    func = K.gemm_direct_global(64, 128, 32)
    monkeypatch.delenv("TILELANG_METAL_LOWERING_CACHE", raising=False)
    uncached = _source(func)
    monkeypatch.setenv("TILELANG_METAL_LOWERING_CACHE", str(blocker))
    before = lowering_cache.stats()
    assert _source(func) == uncached
    assert _delta(before)["misses"] == 1


def test_off_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("TILELANG_METAL_LOWERING_CACHE", raising=False)
    before = lowering_cache.stats()
    _source(K.gemm_direct_global(64, 128, 32))
    assert _delta(before) == {"hits": 0, "misses": 0, "bypassed": 0}


def test_device_preparation_is_cached_and_prints_the_same_kernel(cache_dir):
    """tilelang's passes between the host/device split and the codegen (Simplify: seconds on an
    attention kernel) run once per kernel: a second compile loads their module, whose MSL and
    results are those of the passes run afresh (an observed compile runs every pass)."""
    before = lowering_cache.preparation_stats()
    first = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    second = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    now = lowering_cache.preparation_stats()
    assert {k: now[k] - before[k] for k in now} == {"hits": 1, "misses": 1, "bypassed": 0}
    assert len(list(cache_dir.rglob("*.device.z"))) == 1
    with recorded_plans():
        afresh = tilelang.compile(_dynamic_scale(), out_idx=[-1], target="metal", execution_backend="emulator")
    assert lowering_cache.preparation_stats()["bypassed"] == now["bypassed"] + 1
    assert second.get_kernel_source() == first.get_kernel_source() == afresh.get_kernel_source()
    x = torch.randn(45, 4)
    torch.testing.assert_close(second(x), x * 2 + 1)
