"""Numerics of hand-written contract-shaped kernels against torch (float32 references)."""

from __future__ import annotations

import emu_msl_kernels as K
import pytest
import torch

from tilelang_metal.emulator import compile_kernel

DTYPES = {"half": torch.float16, "float": torch.float32, "bfloat": torch.bfloat16}


def test_elementwise_add_half4():
    k = compile_kernel(K.add_half4())
    a = torch.randn(8 * 512, dtype=torch.float16)
    b = torch.randn(8 * 512, dtype=torch.float16)
    c = torch.full_like(a, float("nan"))
    k.launch([a, b, c], grid=(8, 1, 1), block=(128, 1, 1))
    torch.testing.assert_close(c.float(), (a.float() + b.float()).half().float(), rtol=0, atol=0)


def test_unchecked_build_gives_same_result():
    k = compile_kernel(K.add_half4(), checked=False)
    assert not k.checked
    a = torch.randn(4 * 512, dtype=torch.float16)
    b = torch.randn(4 * 512, dtype=torch.float16)
    c = torch.zeros_like(a)
    k.launch([a, b, c], grid=(4, 1, 1), block=(128, 1, 1))
    assert torch.equal(c, a + b)


def test_threadgroup_memory_and_barrier_reverse_tile():
    k = compile_kernel(K.reverse_tile())
    a = torch.randn(6 * 128)
    b = torch.full_like(a, float("nan"))
    k.launch([a, b], grid=(6, 1, 1), block=(128, 1, 1))
    assert torch.equal(b.view(6, 128), a.view(6, 128).flip(1))


def test_simd_collectives():
    k = compile_kernel(K.simd_collectives())
    groups = 3
    n = groups * 128
    x = torch.randn(n) * 2
    red = torch.zeros(groups * 4 * 3)
    butterfly = torch.zeros(n)
    shuf = torch.zeros(n * 4)
    flags = torch.zeros(n * 2, dtype=torch.int32)
    half_sum = torch.zeros(groups * 4, dtype=torch.float16)
    k.launch([x, red, butterfly, shuf, flags, half_sum], grid=(groups, 1, 1), block=(128, 1, 1))

    xs = x.view(-1, 32)  # one row per simdgroup
    red = red.view(-1, 3)
    torch.testing.assert_close(red[:, 0], xs.sum(1), rtol=1e-5, atol=1e-5)
    assert torch.equal(red[:, 1], xs.max(1).values)
    assert torch.equal(red[:, 2], xs.min(1).values)
    torch.testing.assert_close(butterfly.view(-1, 32), xs.sum(1, keepdim=True).expand(-1, 32), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(half_sum.float(), xs.half().float().sum(1), rtol=5e-3, atol=2e-2)

    shuf = shuf.view(-1, 32, 4)
    lane = torch.arange(32)
    up = torch.where(lane >= 1, (lane - 1).clamp(min=0), lane)
    down = torch.where(lane + 3 < 32, (lane + 3).clamp(max=31), lane)
    assert torch.equal(shuf[:, :, 0], xs[:, up])
    assert torch.equal(shuf[:, :, 1], xs[:, down])
    assert torch.equal(shuf[:, :, 2], xs[:, 5:6].expand(-1, 32))
    assert torch.equal(shuf[:, :, 3], xs.flip(1))

    flags = flags.view(-1, 32, 2)
    assert torch.equal(flags[:, :, 0], (xs > 2).any(1, keepdim=True).expand(-1, 32).int())
    assert torch.equal(flags[:, :, 1], torch.ones_like(flags[:, :, 1]))


@pytest.mark.parametrize("elem", ["half", "float"])
def test_simdgroup_8x8_gemm(elem):
    k = compile_kernel(K.simdgroup_gemm(elem))
    a = torch.randn(64, 64).to(DTYPES[elem])
    b = torch.randn(64, 64).to(DTYPES[elem])
    c = torch.full((64, 64), float("nan"))
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "elem,transpose_b,store",
    [("bfloat", False, "simdgroup_store"), ("half", True, "simdgroup_store"), ("float", False, "thread_elements")],
)
def test_simdgroup_8x8_gemm_variants(elem, transpose_b, store):
    """bfloat fragments, transposed loads, and stores through thread_elements() with the documented layout."""
    k = compile_kernel(K.simdgroup_gemm(elem, transpose_b=transpose_b, store=store))
    a = torch.randn(64, 64).to(DTYPES[elem])
    b = torch.randn(64, 64).to(DTYPES[elem])
    c = torch.full((64, 64), float("nan"))
    k.launch([a, b.t().contiguous() if transpose_b else b, c], grid=(2, 2, 1), block=(128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("store", ["multidim", "formula"])
@pytest.mark.parametrize("elem", ["half", "bfloat", "float"])
def test_mpp_cooperative_tensor_gemm(elem, store):
    k = compile_kernel(K.mpp_gemm(elem, store=store))
    a = torch.randn(64, 64).to(DTYPES[elem])
    b = torch.randn(64, 128).to(DTYPES[elem])
    c = torch.full((64, 128), float("nan"))
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


def test_mpp_multiply_mode_overwrites_destination():
    """mode::multiply ignores the (uninitialised, NaN-poisoned) destination."""
    k = compile_kernel(K.mpp_gemm("half", K=16, mode="multiply"))
    a = torch.randn(64, 16, dtype=torch.float16)
    b = torch.randn(16, 128, dtype=torch.float16)
    c = torch.full((64, 128), float("nan"))
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


def test_mpp_accumulate_into_uninitialised_destination_is_nan():
    """Accumulating into a destination that was never written reads the poison (NaN)."""
    src = K.mpp_gemm("half", K=16).replace("    C_ct0[e] = 0.000000e+00f;\n", "")
    k = compile_kernel(src)
    a = torch.randn(64, 16, dtype=torch.float16)
    b = torch.randn(16, 128, dtype=torch.float16)
    c = torch.zeros(64, 128)
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    assert c.isnan().all()


@pytest.mark.parametrize(
    "mutation",
    [
        # swap the roles of lane bits 0 and 1 in the column / row formulas
        ("ct_col", "((int)__lane & 1)", "(((int)__lane >> 1) & 1)"),
        # forget the +8 row offset of elements 4..7
        ("ct_row", "(8 * ((e >> 2) & 1))", "0"),
    ],
)
def test_wrong_lane_mapping_fails_numerically(mutation):
    """A kernel whose operand fill disagrees with the shim's layout must produce wrong numbers."""
    which, old, new = mutation
    row, col = K.CT_ROW, K.CT_COL
    if which == "ct_row":
        row = row.replace(old, new)
    else:
        col = col.replace(old, new)
    assert (row, col) != (K.CT_ROW, K.CT_COL)
    k = compile_kernel(K.mpp_gemm("float", store="formula", ct_row=row, ct_col=col))
    a = torch.randn(64, 64)
    b = torch.randn(64, 128)
    c = torch.zeros(64, 128)
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    assert not torch.allclose(c, a @ b, rtol=1e-3, atol=1e-3)


def test_benchmark_kernel_small():
    """The benchmark's 64x128-tile kernel (vector loads, 2x2 tensors per simdgroup) on a small problem."""
    k = compile_kernel(K.mpp_gemm_bench(128, 256, 64))
    a = torch.randn(128, 64, dtype=torch.float16)
    b = torch.randn(64, 256, dtype=torch.float16)
    c = torch.full((128, 256), float("nan"))
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_worker_count_does_not_change_results(workers):
    k = compile_kernel(K.mpp_gemm("half"))
    a = torch.randn(64, 64, dtype=torch.float16)
    b = torch.randn(64, 128, dtype=torch.float16)
    c = torch.zeros(64, 128)
    k.launch([a, b, c], grid=(2, 2, 1), block=(128, 1, 1), workers=workers)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)
