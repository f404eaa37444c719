"""The foreign memory counts (compile_msl's traced counters flavour) checked against the plugin's
counters on the plugin's own kernels: the same MSL, launched with the same buffers, once as a plugin
kernel (source marks on the printer's statement shapes) and once as foreign MSL (every load and store
traced by address). Every memory counter, barrier and matrix instruction must agree; where a kind of
access is counted differently the difference is documented (docs/emulator.md, Foreign MSL) and tested
in tests/emulator/test_foreign_memory.py."""

from __future__ import annotations

import re

import pytest
import tilelang
import torch

from tilelang_metal import kernels
from tilelang_metal.emulator import compile_msl, launch_counters
from tilelang_metal.emulator.foreign import memory_counts_unavailable
from tilelang_metal.emulator.foreign.launcher import _FOREIGN_COUNTERS, MEMORY_COUNTERS
from tilelang_metal.emulator.instrument import _adapter, _launches

_WHY = memory_counts_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


def _case(name: str):
    h = torch.float16
    if name == "direct-metal4":  # MPP cooperative tensors loaded straight from device memory
        return kernels.gemm_direct_global(128, 128, 64), kernels.metal4_target(), (torch.randn(128, 64, dtype=h), torch.randn(64, 128, dtype=h))
    if name == "direct-plain":  # simdgroup_load / simdgroup_store of 8x8 matrices from device memory
        return kernels.gemm_direct_global(64, 64, 32), kernels.plain_metal_target(), (torch.randn(64, 32, dtype=h), torch.randn(32, 64, dtype=h))
    if name == "shared-metal4":  # staged through threadgroup memory, barriers
        return kernels.gemm_shared(128, 128, 64, 64, 64, 32), kernels.metal4_target(), (torch.randn(128, 64, dtype=h), torch.randn(64, 128, dtype=h), torch.zeros(128))
    if name == "shared-plain":
        return kernels.gemm_shared(128, 128, 64, 64, 64, 32), kernels.plain_metal_target(), (torch.randn(128, 64, dtype=h), torch.randn(64, 128, dtype=h), torch.zeros(128))
    if name == "ragged":  # tiles that do not divide: masked loads, guarded stores
        return kernels.gemm_shared(100, 72, 40), kernels.metal4_target(), (torch.randn(100, 40, dtype=h), torch.randn(40, 72, dtype=h), torch.zeros(72))
    if name == "row-sum":  # simd collectives and a threadgroup reduction, rows of 100 packed over 128 threads
        return kernels.row_sum(37, 100), kernels.plain_metal_target(), (torch.randn(37, 100),)
    if name == "simd-row-sum":  # one simdgroup per row of 300: vector loads and a simd sum, no threadgroup memory
        return kernels.row_sum(37, 300), kernels.plain_metal_target(), (torch.randn(37, 300),)
    if name == "softmax":
        return kernels.softmax(37, 300), kernels.plain_metal_target(), (torch.randn(37, 300),)
    raise AssertionError(name)


# The GPU-level counts group a simdgroup's lanes by program point and occurrence. Foreign MSL is
# traced at -O0, where a fully unrolled loop of the source stays one program point: a store guarded
# by a lane-dependent `if` inside it (softmax's ragged last row) then puts lanes' different
# iterations in one group, so the foreign count of segments is higher than the plugin's (whose build
# unrolls the loop: one program point per iteration). docs/emulator.md, "GPU-level counts".
DIVERGENT_LOOP_CASES = ("softmax",)
DIVERGENT_STORES_IN_ROLLED_LOOP = ("device_transactions",)

CASES = ("direct-metal4", "direct-plain", "shared-metal4", "shared-plain", "ragged", "row-sum", "simd-row-sum", "softmax")


@pytest.mark.parametrize("case", CASES)
def test_plugin_kernel_traced_as_foreign_msl_counts_the_same(case, monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")  # keep the threadgroup staging of gemm_shared
    torch.manual_seed(0)
    program, target, args = _case(case)
    kern = tilelang.compile(program, out_idx=[-1], target=target, execution_backend="emulator")
    compared = []

    def one(msl, values, grid, block):
        name = re.search(r"\bvoid\s+(\w+)\s*\(", msl).group(1)
        plugin = launch_counters(msl, [v.clone() if isinstance(v, torch.Tensor) else v for v in values], grid, block).total
        foreign = compile_msl(msl, name).counters([v.clone() if isinstance(v, torch.Tensor) else v for v in values], grid, block)
        names = MEMORY_COUNTERS + _FOREIGN_COUNTERS
        differs = DIVERGENT_STORES_IN_ROLLED_LOOP if case in DIVERGENT_LOOP_CASES else ()
        assert {k: foreign[k] for k in names if k not in differs} == {k: plugin[k] for k in names if k not in differs}
        for k in differs:  # the lanes' occurrences misalign in the foreign build: more groups, never fewer segments
            assert foreign[k] > plugin[k], (k, foreign[k], plugin[k])
        compared.append(plugin)

    _launches(_adapter(kern, "counters"), args, one)
    assert compared and all(c["device_load_bytes"] > 0 and c["device_store_bytes"] > 0 for c in compared)
    if case.startswith(("shared", "ragged", "row", "softmax")):
        assert any(c["threadgroup_load_bytes"] > 0 for c in compared)
