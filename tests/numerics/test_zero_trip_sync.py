"""Barriers hold when a loop runs zero times or a branch is not taken (SyncSkippedBodies).

TileLang's ThreadSync treats a loop or branch that holds a barrier as a barrier. A `T.Pipelined` loop
with a dynamic trip count puts its only barrier in the steady-state loop, which runs zero times when
the trip count is 1: the epilogue then read the prologue's stage of threadgroup memory before other
threads wrote it (NaN in TileLang's stream-K example on plain metal, reported by racecheck as an
uninitialized read). Every kernel here runs under racecheck.
"""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.kernels import metal4_target

TARGETS = {"metal": lambda: "metal", "metal4": metal4_target}


@functools.lru_cache(maxsize=None)
def dynamic_pipeline(target: str, stages: int, staging: str, M: int = 16, N: int = 32, K: int = 64, bk: int = 16):
    """C = A[:, :steps*bk] @ B[:, :steps*bk]^T, the K loop pipelined over a runtime trip count."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32"), steps: T.int32):
        with T.Kernel(1, threads=64):
            a_s = T.alloc_shared((M, bk), "float16")
            b_s = T.alloc_shared((N, bk), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            T.clear(acc)
            for k in T.Pipelined(steps, num_stages=stages):
                T.copy(A[0, k * bk], a_s)
                T.copy(B[0, k * bk], b_s)
                T.gemm(a_s, b_s, acc, transpose_B=True)
            T.copy(acc, C)

    with pytest.MonkeyPatch.context() as patch:  # read at lowering; restored afterwards
        patch.setenv("TILELANG_METAL_REGISTER_STAGING", staging)
        return tilelang.compile(main, target=TARGETS[target](), execution_backend="emulator")


@pytest.mark.parametrize("target, stages, staging", [("metal", 2, "0"), ("metal", 3, "0"), ("metal", 2, "1"), ("metal4", 2, "0")])
def test_dynamic_trip_counts_zero_to_three(target, stages, staging):
    kernel = dynamic_pipeline(target, stages, staging)
    gen = torch.Generator().manual_seed(stages)
    a = torch.randn(16, 64, generator=gen).half()
    b = torch.randn(32, 64, generator=gen).half()
    for steps in (0, 1, 2, 3):
        c = torch.full((16, 32), float("nan"))
        racecheck(kernel, a, b, c, steps)  # raises on an uninitialized read or a race
        kernel(a, b, c, steps)
        want = a[:, : steps * 16].float() @ b[:, : steps * 16].float().T
        torch.testing.assert_close(c, want, rtol=1e-3, atol=1e-3, msg=f"steps={steps}")


def test_guard_barrier_sits_on_the_skip_path_only():
    source = dynamic_pipeline("metal", 2, "0").get_kernel_source()
    # the steady-state loop runs `steps - 1` times; the added barrier runs when it does not run at all
    assert "if ((steps <= 1)) {\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n  }" in source


@functools.lru_cache(maxsize=None)
def streamk(M: int, N: int, K: int, programs: int, bm: int, bn: int, bk: int, stages: int):
    """TileLang's stream-K GEMM in its example's form (C = A @ B^T, a `while` loop over tile pieces, a
    pipelined K loop of `piece_end - start` steps): pieces of one K step run the pipeline with a
    steady-state loop of zero iterations."""
    tiles_n = -(-N // bn)
    steps = -(-K // bk)
    total = -(-M // bm) * tiles_n * steps
    share, extra = divmod(total, programs)

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(programs, threads=64) as pid:
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bn, bk), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            start = T.alloc_var("int32")
            stop = T.alloc_var("int32")
            start = pid * share + T.min(pid, extra)
            last = (pid + 1) * share + T.min(pid + 1, extra)
            while start < last:
                stop = T.min(start + steps - start % steps, last)
                tile = start // steps
                T.clear(acc)
                for k in T.Pipelined(stop - start, num_stages=stages):
                    T.copy(A[(tile // tiles_n) * bm, (start % steps + k) * bk], a_s)
                    T.copy(B[(tile % tiles_n) * bn, (start % steps + k) * bk], b_s)
                    T.gemm(a_s, b_s, acc, transpose_B=True)
                T.atomic_add(C[(tile // tiles_n) * bm, (tile % tiles_n) * bn], acc)
                start = stop

    return tilelang.compile(main, target="metal", execution_backend="emulator"), total


def test_streamk_example_with_two_stages_matches_torch():
    M, N, K = 32, 64, 80  # 2 x 2 tiles of 5 K steps: 20 iterations over 7 threadgroups (3, 3, 3, 3, 3, 3, 2)
    kernel, total = streamk(M, N, K, programs=7, bm=16, bn=32, bk=16, stages=2)
    assert total == 20
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(N, K, generator=gen).half()
    c = torch.zeros(M, N)
    racecheck(kernel, a, b, c)
    c.zero_()
    kernel(a, b, c)
    assert not torch.isnan(c).any()
    torch.testing.assert_close(c, a.float() @ b.float().T, rtol=1e-3, atol=1e-3)
