"""Shuffles whose segment width is a kernel argument (legalize/segmented_shuffles.py builds the segment
arithmetic on the runtime value): every width from 1 to 32 against CUDA's semantics."""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tests.numerics.test_warp_ops import down_ref, index_ref, up_ref, xor_ref

THREADS = 64


@functools.lru_cache(maxsize=None)
def runtime_width_kernel():
    @T.prim_func
    def main(A: T.Tensor((THREADS,), "float32"), O: T.Tensor((4, THREADS), "float32"), w: T.int32):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            v = A[tx]
            O[0, tx] = T.shfl_xor(v, 5, width=w)
            O[1, tx] = T.shfl_down(v, 3, width=w)
            O[2, tx] = T.shfl_up(v, 2, width=w)
            O[3, tx] = T.shfl_sync(v, 13, width=w)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_runtime_width_matches_cuda_semantics(width):
    a = torch.randn(THREADS, generator=torch.Generator().manual_seed(width))
    a[7] = float("nan")  # a NaN travels like any value
    out = torch.full((4, THREADS), -1.0)
    runtime_width_kernel()(a, out, width)
    expected = [xor_ref(a, 5, width), down_ref(a, 3, width), up_ref(a, 2, width), index_ref(a, lambda lane: 13, width)]
    for row, ref in zip(out, expected):
        torch.testing.assert_close(row, ref, rtol=0, atol=0, equal_nan=True)
