"""Counters (`tilelang_metal.emulator.counters`): kernel structure asserted with counts, never times."""

from __future__ import annotations

import emu_msl_kernels as K
import pytest
import torch

from tilelang_metal.emulator import COUNTER_NAMES, counters, launch_counters


def jit(func, target):
    import tilelang

    return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")


@pytest.fixture(scope="module")
def direct_gemm():
    from tilelang_metal import kernels as examples

    return jit(examples.gemm_direct_global(128, 128, 64), examples.metal4_target())


def test_default_direct_global_gemm_structure(direct_gemm):
    m = n = 128
    k, block_m, block_n, simdgroups = 64, 64, 128, 4
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    stats = counters(direct_gemm, a, b)
    t = stats.total
    assert set(t) == set(COUNTER_NAMES)
    tiles = (m // block_m) * (n // block_n)
    # every simdgroup owns a 32x64 piece of the tile = 2x2 destination tensors of 16x32
    tensors_per_simdgroup = (block_m * block_n // simdgroups) // (16 * 32)
    assert t["matmul2d_16x32x16"] == tiles * (k // 16) * simdgroups * tensors_per_simdgroup
    # no staging: each simdgroup (2x2 of 32x64 pieces) reads its own A rows and B columns from
    # global memory; C is written exactly once
    assert t["device_load_bytes"] == tiles * simdgroups * 2 * (32 * k + k * 64)
    assert t["device_store_bytes"] == 2 * m * n
    assert t["device_store_instructions"] == m * n // 4  # half4 stores
    assert t["predicated_device_loads"] == t["predicated_device_stores"] == 0  # aligned: no masking
    assert t["threadgroup_barriers"] == 0 and t["threadgroup_load_bytes"] == 0 and t["threadgroup_store_bytes"] == 0
    assert t["simdgroup_multiply_accumulate_8x8x8"] == 0
    assert sorted(stats.threadgroups) == [(0, 0, 0), (0, 1, 0)]
    per_tile = stats.threadgroups[(0, 1, 0)]
    assert per_tile["matmul2d_16x32x16"] * tiles == t["matmul2d_16x32x16"]


@pytest.mark.parametrize("target_name", ["metal4", "plain"])
def test_shared_gemm_barriers_and_threadgroup_traffic(target_name, monkeypatch):
    from tilelang_metal import kernels as examples

    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")  # keep the staging this test counts

    target = examples.metal4_target() if target_name == "metal4" else examples.plain_metal_target()
    m = n = 128
    k, bm, bn, bk = 64, 64, 64, 32
    kern = jit(examples.gemm_shared(m, n, k, bm, bn, bk), target)
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    t = counters(kern, a, b, torch.zeros(n)).total
    tiles, steps = (m // bm) * (n // bn), k // bk
    assert t["threadgroup_barriers"] == tiles * steps * 2  # before and after staging, per K step
    assert t["threadgroup_store_bytes"] == tiles * steps * 2 * (bm * bk + bk * bn)  # T.copy staging
    # 4 simdgroups in 2x2 each read a 32-row strip of A_s and a 32-column strip of B_s per K step
    assert t["threadgroup_load_bytes"] == tiles * steps * 4 * 2 * (32 * bk + bk * 32)
    assert t["device_load_bytes"] == 2 * (m * k * (n // bn) + k * n * (m // bm))
    assert t["device_store_bytes"] == 4 * m * n  # float32 C
    assert t["predicated_device_loads"] == t["predicated_device_stores"] == 0
    if target_name == "metal4":
        assert t["matmul2d_16x32x16"] == m * n * k // (16 * 32 * 16)
        assert t["simdgroup_multiply_accumulate_8x8x8"] == 0
    else:
        assert t["simdgroup_multiply_accumulate_8x8x8"] == m * n * k // (8 * 8 * 8)
        assert t["matmul2d_16x32x16"] == 0


def test_partial_tiles_have_predicated_accesses():
    from tilelang_metal import kernels as examples

    m, n, k = 100, 72, 40
    kern = jit(examples.gemm_shared(m, n, k), examples.metal4_target())
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    stats = counters(kern, a, b, torch.zeros(n))
    t = stats.total
    assert t["predicated_device_loads"] > 0  # masked staging loads (`c ? A[..] : 0`)
    assert t["predicated_device_stores"] > 0  # `if (row < M && col < N)` around the C stores
    for pos, g in stats.threadgroups.items():  # edge threadgroups guard every C store, the interior one none
        assert g["predicated_device_stores"] == (g["device_store_instructions"] if pos != (0, 0, 0) else 0), pos


def test_simd_collectives_and_predicated_stores_of_hand_written_kernel():
    groups = 3
    n = groups * 128
    tensors = [
        torch.randn(n), torch.zeros(groups * 12), torch.zeros(n), torch.zeros(n * 4),
        torch.zeros(n * 2, dtype=torch.int32), torch.zeros(groups * 4, dtype=torch.float16),
    ]
    stats = launch_counters(K.simd_collectives(), tensors, (groups, 1, 1), (128, 1, 1))
    g = stats.threadgroups[(2, 0, 0)]
    # per simdgroup: sum, max, min, half sum, 5 xor shuffles, up, down, broadcast, shuffle, any, all
    assert g["simd_collectives"] == 4 * 15
    assert g["simdgroup_barriers"] == 4
    assert g["threadgroup_barriers"] == 1
    assert g["predicated_device_stores"] == 4 * 4  # lane 0 of each simdgroup, inside `if`
    assert g["device_store_instructions"] == 128 * 4 + 16  # Butterfly, Shuf (float4), 2 Flags + the 16 above
    assert g["device_store_bytes"] == 128 * (4 + 16 + 8) + 4 * (3 * 4 + 2)
    assert g["device_load_instructions"] == 128 and g["predicated_device_loads"] == 0
    assert stats.total["simd_collectives"] == groups * 60


def test_counting_flavour_is_a_separate_build(direct_gemm):
    from tilelang_metal.emulator import compile_kernel

    src = direct_gemm.get_kernel_source()
    plain, counting = compile_kernel(src), compile_kernel(src, instrument="counters")
    assert plain.library_path != counting.library_path
    assert "on_access" not in plain.source and ".w()" not in plain.source
    assert "C.w()" in counting.source


def test_every_corpus_kernel_writes_each_output_byte_once():
    import sys
    from pathlib import Path

    import tilelang

    from tilelang_metal import kernels as examples

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from corpus_kernels import CORPUS

    for name in sorted(CORPUS):
        func, makers, _ = CORPUS[name]()
        kern = tilelang.compile(func, out_idx=[-1], target=examples.plain_metal_target(), execution_backend="emulator")
        torch.manual_seed(0)
        inputs = [make() for make in makers]
        out = kern(*inputs)
        t = counters(kern, *inputs).total
        assert t["device_store_bytes"] == out.numel() * out.element_size(), name
        if name == "guarded_tail":  # every access of the tail kernel is behind its bound check
            assert t["predicated_device_loads"] == t["device_load_instructions"] > 0
            assert t["predicated_device_stores"] == t["device_store_instructions"] > 0
        if t["threadgroup_load_bytes"] and name == "shared_transpose":
            assert t["threadgroup_barriers"] > 0


def test_narrow_device_loads_count_loads_of_two_bytes_or_less():
    """A scalar half load is narrow, a half2 / float load is not; stores never count."""
    msl = """
#include <metal_stdlib>
using namespace metal;
kernel void narrow(device const half* a [[buffer(0)]], device const float* f [[buffer(1)]],
                   device half* out [[buffer(2)]], uint t [[thread_position_in_threadgroup]]) {
  half2 pair = *(device const half2*)(a + 2 * t);
  out[t] = a[t] + pair.x + pair.y + half(f[t]);
}
"""
    a, f, out = torch.randn(64).half(), torch.randn(32), torch.zeros(32).half()
    stats = launch_counters(msl, [a, f, out], grid=(1, 1, 1), block=(32, 1, 1))
    assert stats.total["narrow_device_loads"] == 32  # a[t] only
    assert stats.total["device_load_instructions"] == 3 * 32
