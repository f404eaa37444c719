"""Modules with several `T.Kernel` blocks whose launches differ (thread count, 1-D / 2-D).

Until SplitHostDevice one prim_func holds every kernel, so each per-kernel analysis must read the
launch of the kernel its statement is in (transform/kernel_launches.py). They once read the whole
function's: a reduction in any kernel but the last used another kernel's thread index ("variables
(tx,) are used, but are not passed in as API arguments"), a 1-D kernel's reduction was refused
because another kernel was 2-D, T.gemm in a 1-D kernel was refused next to a 2-D kernel, and two
T.gemm calls into one fragment got a layout conflict next to an unrelated kernel.
"""

from __future__ import annotations

import functools
import math

import pytest
import tilelang
import tilelang.language as T
import torch
import torch.nn.functional as F

from tilelang_metal import kernels as E
from tilelang_metal.kernels.attention import flash_decoding_program
from tilelang_metal.codegen.artifact import artifact_of
from tilelang_metal.emulator import racecheck

# first kernel: row sums of a 4x64 tile on 128 threads; second: 2-D (16, 4) elementwise;
# third: column maxima of a 6x16 tile on 96 threads (three simdgroups)
R1_ROWS, R1_COLS, R1_THREADS = 4, 64, 128
EW_ROWS, EW_COLS = 9, 13
R2_ROWS, R2_COLS, R2_THREADS = 6, 16, 96


@functools.lru_cache(maxsize=None)
def reductions_around_a_2d_kernel():
    @T.prim_func
    def main(
        A: T.Tensor((R1_ROWS, R1_COLS), "float32"),
        RowSum: T.Tensor((R1_ROWS,), "float32"),
        X: T.Tensor((EW_ROWS, EW_COLS), "float32"),
        Y: T.Tensor((EW_ROWS, EW_COLS), "float32"),
        B: T.Tensor((R2_ROWS, R2_COLS), "float32"),
        ColMax: T.Tensor((R2_COLS,), "float32"),
    ):
        with T.Kernel(1, threads=R1_THREADS):
            a = T.alloc_fragment((R1_ROWS, R1_COLS), "float32")
            r = T.alloc_fragment((R1_ROWS,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, r, dim=1)
            T.copy(r, RowSum)
        with T.Kernel(T.ceildiv(EW_ROWS, 4), threads=(16, 4)) as bx:
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            if bx * 4 + ty < EW_ROWS and tx < EW_COLS:
                Y[bx * 4 + ty, tx] = X[bx * 4 + ty, tx] * 3.0 - 1.0
        with T.Kernel(1, threads=R2_THREADS):
            b = T.alloc_fragment((R2_ROWS, R2_COLS), "float32")
            c = T.alloc_fragment((R2_COLS,), "float32")
            T.copy(B, b)
            T.reduce_max(b, c, dim=0)
            T.copy(c, ColMax)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_reductions_in_first_and_last_kernel_around_a_2d_kernel_match_torch():
    kernel = reductions_around_a_2d_kernel()
    g = torch.Generator().manual_seed(11)
    a = torch.randn(R1_ROWS, R1_COLS, generator=g)
    x = torch.randn(EW_ROWS, EW_COLS, generator=g)
    b = torch.randn(R2_ROWS, R2_COLS, generator=g)
    b[3, 5] = float("inf")  # reaches the column maximum unchanged
    row_sum, y, col_max = torch.empty(R1_ROWS), torch.empty(EW_ROWS, EW_COLS), torch.empty(R2_COLS)
    racecheck(kernel, a, row_sum, x, y, b, col_max)
    torch.testing.assert_close(row_sum, a.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, x * 3.0 - 1.0)
    torch.testing.assert_close(col_max, b.amax(0))
    source = kernel.get_kernel_source()
    assert "max_total_threads_per_threadgroup(128)" in source and "max_total_threads_per_threadgroup(96)" in source


# ----------------------------------------------------------------------------- tile ops on 2-D / 3-D launches
# tilelang partitions tile ops over threadIdx.x only: before LinearizeThreadLaunch every y row of a
# threads=(16, 8) kernel redid the tile (a read-modify-write ran 8 times). Such kernels now run as one
# linear index; a kernel without tile ops keeps its launch.
ML_ROWS, ML_COLS = 8, 16


@functools.lru_cache(maxsize=None)
def copies_and_parallel_loops_on_multidim_launches():
    @T.prim_func
    def main(
        A: T.Tensor((ML_ROWS, ML_COLS), "float32"),
        B: T.Tensor((ML_ROWS, ML_COLS), "float32"),
        W: T.Tensor((ML_ROWS, ML_COLS), "float32"),
        X: T.Tensor((4, 32), "float32"),
        Y: T.Tensor((4, 32), "float32"),
        E_in: T.Tensor((ML_ROWS, ML_COLS), "float32"),
        E_out: T.Tensor((ML_ROWS, ML_COLS), "float32"),
    ):
        with T.Kernel(1, threads=(16, 8)):
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            s = T.alloc_shared((ML_ROWS, ML_COLS), "float32")
            T.copy(A, s)
            for i, j in T.Parallel(ML_ROWS, ML_COLS):
                B[i, j] = B[i, j] + s[i, j]  # read-modify-write: exactly once per element
            W[ty, tx] = A[ty, tx] * 2.0 + T.cast(ty, "float32")  # the user's own y index still means y
        with T.Kernel(1, threads=(8, 4, 2)):
            f = T.alloc_fragment((4, 32), "float32")
            T.copy(X, f)
            for i, j in T.Parallel(4, 32):
                f[i, j] = f[i, j] * 3.0 - 1.0
            T.copy(f, Y)
        with T.Kernel(2, threads=(16, 4)) as bx:  # explicit indices only: launched as written
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            E_out[bx * 4 + ty, tx] = E_in[bx * 4 + ty, tx] - 0.5

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_copy_and_parallel_on_2d_and_3d_launches_cover_each_element_once():
    kernel = copies_and_parallel_loops_on_multidim_launches()
    g = torch.Generator().manual_seed(3)
    a, b, x, e_in = (torch.randn(*shape, generator=g) for shape in ((ML_ROWS, ML_COLS), (ML_ROWS, ML_COLS), (4, 32), (ML_ROWS, ML_COLS)))
    want_b = b + a
    w, y, e_out = torch.empty(ML_ROWS, ML_COLS), torch.empty(4, 32), torch.empty(ML_ROWS, ML_COLS)
    racecheck(kernel, a, b, w, x, y, e_in, e_out)
    torch.testing.assert_close(b, want_b)
    torch.testing.assert_close(w, a * 2.0 + torch.arange(ML_ROWS, dtype=torch.float32)[:, None])
    torch.testing.assert_close(y, x * 3.0 - 1.0)
    torch.testing.assert_close(e_out, e_in - 0.5)
    blocks = [tuple(record.block) for record in artifact_of(kernel.get_kernel_source()).kernels]
    assert blocks == [(128, 1, 1), (64, 1, 1), (16, 4, 1)]  # the kernel without tile ops keeps its 2-D launch


@functools.lru_cache(maxsize=None)
def reduction_and_gemm_on_multidim_launches():
    @T.prim_func
    def main(
        A: T.Tensor((4, 32), "float32"),
        R: T.Tensor((4,), "float32"),
        P: T.Tensor((32, 32), "float16"),
        Q: T.Tensor((32, 32), "float16"),
        C: T.Tensor((32, 32), "float32"),
    ):
        with T.Kernel(1, threads=(32, 2, 2)):
            a = T.alloc_fragment((4, 32), "float32")
            r = T.alloc_fragment((4,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, r, dim=1)
            T.copy(r, R)
        with T.Kernel(1, threads=(32, 4)):
            c = T.alloc_fragment((32, 32), "float32")
            T.clear(c)
            T.gemm(P, Q, c)
            for i, j in T.Parallel(32, 32):
                c[i, j] = c[i, j] + 1.0
            T.copy(c, C)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_reduction_and_gemm_on_multidim_launches_match_torch():
    """Refused before (T.reduce_* and T.gemm need a 1-D launch); the linear launch serves both."""
    kernel = reduction_and_gemm_on_multidim_launches()
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4, 32, generator=g)
    p, q = (torch.randn(32, 32, generator=g).half() for _ in range(2))
    r, c = torch.empty(4), torch.empty(32, 32)
    racecheck(kernel, a, r, p, q, c)
    torch.testing.assert_close(r, a.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, p.float() @ q.float() + 1.0, atol=0.01 * math.sqrt(32), rtol=0)


# ----------------------------------------------------------------------------- GEMM next to other kernels
GEMM_M = GEMM_N = 64
GEMM_K1, GEMM_K2 = 64, 8  # K2 = 8 cannot use cooperative tensors: both calls share the simdgroup path


@functools.lru_cache(maxsize=None)
def two_gemms_next_to_a_2d_kernel(target_name: str):
    @T.prim_func
    def main(
        X: T.Tensor((EW_ROWS, EW_COLS), "float32"),
        Y: T.Tensor((EW_ROWS, EW_COLS), "float32"),
        A: T.Tensor((GEMM_M, GEMM_K1), "float16"),
        B: T.Tensor((GEMM_K1, GEMM_N), "float16"),
        A2: T.Tensor((GEMM_M, GEMM_K2), "float16"),
        B2: T.Tensor((GEMM_K2, GEMM_N), "float16"),
        C: T.Tensor((GEMM_M, GEMM_N), "float32"),
    ):
        with T.Kernel(T.ceildiv(EW_ROWS, 4), threads=(16, 4)) as bx:  # unrelated 2-D kernel first
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            if bx * 4 + ty < EW_ROWS and tx < EW_COLS:
                Y[bx * 4 + ty, tx] = X[bx * 4 + ty, tx] + 0.5
        with T.Kernel(1, 1, threads=128) as (bx, by):
            C_f = T.alloc_fragment((GEMM_M, GEMM_N), "float32")
            T.clear(C_f)
            T.gemm(A, B, C_f)
            T.gemm(A2, B2, C_f)
            T.copy(C_f, C)

    target = E.metal4_target() if target_name == "metal4" else E.plain_metal_target()
    return tilelang.compile(main, out_idx=[-1], target=target, execution_backend="emulator")


@pytest.mark.parametrize("target_name", ["metal4", pytest.param("metal", marks=pytest.mark.slow)])
def test_two_gemms_into_one_fragment_next_to_an_unrelated_2d_kernel(target_name):
    kernel = two_gemms_next_to_a_2d_kernel(target_name)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(EW_ROWS, EW_COLS, generator=g)
    a, b = torch.randn(GEMM_M, GEMM_K1, generator=g).half(), torch.randn(GEMM_K1, GEMM_N, generator=g).half()
    a2, b2 = torch.randn(GEMM_M, GEMM_K2, generator=g).half(), torch.randn(GEMM_K2, GEMM_N, generator=g).half()
    y = torch.empty(EW_ROWS, EW_COLS)
    c = kernel(x, y, a, b, a2, b2)
    torch.testing.assert_close(y, x + 0.5)
    ref = a.float() @ b.float() + a2.float() @ b2.float()
    torch.testing.assert_close(c, ref, atol=0.01 * math.sqrt(GEMM_K1 + GEMM_K2), rtol=0)
    assert "simdgroup_multiply_accumulate" in kernel.get_kernel_source()


# ----------------------------------------------------------------------------- flash decoding, head_dim 128
def test_flash_decoding_at_head_dim_128_matches_sdpa():
    """The combine kernel runs head_dim (128) threads, the split kernel 64 with its reductions."""
    batch, heads, kv_heads, seq, dim, num_split = 1, 4, 2, 37, 128, 2
    program = flash_decoding_program(batch, heads, kv_heads, seq, dim, num_split=num_split, block_h=16, block_n=32, threads=64)
    kernel = tilelang.compile(program, out_idx=[3, 4, 5], target=E.plain_metal_target(), execution_backend="emulator")
    torch.manual_seed(seq)
    q = torch.randn(batch, heads, dim).half()
    k, v = (torch.randn(batch, seq, kv_heads, dim).half() for _ in range(2))
    _, _, out = kernel(q, k, v)
    group = heads // kv_heads
    kk, vv = (t.transpose(1, 2).repeat_interleave(group, 1).float() for t in (k, v))
    ref = F.scaled_dot_product_attention(q.float()[:, :, None], kk, vv)[:, :, 0]
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=4e-3)


def test_gemm_kernel_followed_by_a_2d_kernel_lowers():
    """The 2-D launch of a later kernel is not the GEMM kernel's (LinearizeThreadLaunch reads its own)."""

    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float32"), Y: T.Tensor((8, 16), "float32")):
        with T.Kernel(1, threads=128):
            T.gemm(A, B, C, clear_accum=True)
        with T.Kernel(2, threads=(16, 4)) as bx:
            tx, ty = T.get_thread_binding(0), T.get_thread_binding(1)
            Y[bx * 4 + ty, tx] = C[bx * 4 + ty, tx]

    source = tilelang.lower(main, target=E.metal4_target()).kernel_source
    assert source.count("[[kernel") == 2
