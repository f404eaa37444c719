"""`while` loops that stage data in threadgroup memory (transform/while_loop_sync.py): tilelang's
ThreadSync orders `for` iterations but not `while` iterations, so the plugin ends such a body with a
threadgroup barrier. Checked on the MSL and with the race checker (which reports the race without
the barrier), and numerically against torch."""

import re

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck


def _row_blocks_kernel(rows: int, cols: int, block: int, threads: int = 32):
    """Each threadgroup walks its rows block by block in a `while` loop: the block is staged in
    threadgroup memory by one thread order and read back reversed (a thread reads another thread's
    element), so the next iteration's staging overwrites what slower threads still read."""

    @T.prim_func
    def main(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, cols), "float32")):
        with T.Kernel(1, threads=threads) as _:
            tile = T.alloc_shared((block, cols), "float32")
            r = T.alloc_var("int32")
            r = 0
            while r < rows:
                for i, j in T.Parallel(block, cols):
                    tile[i, j] = X[r + i, j]
                for i, j in T.Parallel(block, cols):
                    Y[r + i, j] = tile[block - 1 - i, cols - 1 - j] * 2.0
                r = r + block

    return main


@pytest.fixture(scope="module")
def kernel():
    return tilelang.compile(_row_blocks_kernel(12, 32, 4), target=E.plain_metal_target(), execution_backend="emulator")


def test_while_body_ends_with_a_threadgroup_barrier(kernel):
    source = kernel.get_kernel_source()
    body = source[source.index("while ("):]
    closing = body[: body.index("\n  }\n")]  # the while body (two-space indent inside the kernel)
    assert re.search(r"threadgroup_barrier\(mem_flags::mem_threadgroup\);\s*$", closing), closing


def test_reversed_blocks_match_torch_under_the_race_checker(kernel):
    x = torch.randn(12, 32)
    y = torch.full((12, 32), float("nan"))
    racecheck(kernel, x, y)  # raises EmulatorRaceError on an unordered write-after-read
    want = x.reshape(3, 4, 32).flip(1).flip(2).reshape(12, 32) * 2
    torch.testing.assert_close(y, want)
