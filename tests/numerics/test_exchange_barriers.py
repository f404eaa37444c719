"""The threadgroup exchanges the plugin lowers itself (T.reduce across simdgroups, T.finalize_reducer,
T.cumsum staged through shared memory) carry their own barriers when a kernel turns tilelang's
ThreadSync off (`tl.disable_thread_storage_sync`, set by kernels that place their own
`T.sync_threads`, e.g. TileLang's bitonic top-k indexer). Before, their scratch was written and the
peers' entries read with no barrier between: the column sums of a 32x16 GEMM accumulator came out
wrong and the race checker reported it. With ThreadSync on, the barriers stay ThreadSync's alone."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import MetalLoweringError
from tilelang_metal.emulator import counters, racecheck

M, N, K, THREADS = 32, 16, 16, 128
NO_THREAD_SYNC = {"tl.disable_thread_storage_sync": True}


@functools.lru_cache(maxsize=None)
def exchanges(thread_sync: bool):
    """Rows / Cols: sums of a 32x16 GEMM accumulator along each axis (rows meet across two
    simdgroups, columns across two others); ColMax: a reducer over all 128 threads (simd_max, then
    one slot per simdgroup); Scan: a fragment cumsum (tilelang stages it through shared memory)."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "float16"),
        B: T.Tensor((K, N), "float16"),
        X: T.Tensor((M, N), "float32"),
        Rows: T.Tensor((M,), "float32"),
        Cols: T.Tensor((N,), "float32"),
        ColMax: T.Tensor((N,), "float32"),
        Scan: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(1, threads=THREADS):
            c = T.alloc_fragment((M, N), "float32")
            rows = T.alloc_fragment((M,), "float32")
            cols = T.alloc_fragment((N,), "float32")
            T.clear(c)
            T.gemm(A, B, c)
            T.reduce_sum(c, rows, dim=1)
            T.reduce_sum(c, cols, dim=0)
            T.copy(rows, Rows)
            T.copy(cols, Cols)
            acc = T.alloc_reducer((N,), "float32", op="max")
            col_max = T.alloc_fragment((N,), "float32")
            T.reducer_init(acc, float("-inf"))
            for i, j in T.Parallel(M, N):
                T.reducer_update(acc[j], X[i, j])
            T.finalize_reducer(acc, col_max)
            T.copy(col_max, ColMax)
            s = T.alloc_fragment((M, N), "float32")
            T.copy(X, s)
            T.cumsum(s, dim=1)
            T.copy(s, Scan)

    configs = {} if thread_sync else NO_THREAD_SYNC
    return tilelang.compile(main, target="metal", execution_backend="emulator", pass_configs=configs)


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).half()
    b = torch.randn(K, N, generator=g).half()
    x = torch.randn(M, N, generator=g) * 4.0
    return a, b, x


def _reference(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    c = a.float() @ b.float()
    return [c.sum(1), c.sum(0), x.amax(0), x.cumsum(1)]


@pytest.mark.parametrize("thread_sync", [True, False], ids=["thread_sync", "no_thread_sync"])
def test_exchanges_match_torch_with_and_without_thread_sync(thread_sync):
    kernel = exchanges(thread_sync)
    a, b, x = _inputs(11)
    outs = [torch.empty(M), torch.empty(N), torch.empty(N), torch.empty(M, N)]
    racecheck(kernel, a, b, x, *outs)
    for _ in range(2):  # the schedule changes between runs: a missing barrier shows in some of them
        kernel(a, b, x, *outs)
        for got, want in zip(outs, _reference(a, b, x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_thread_sync_on_keeps_its_barriers():
    """With ThreadSync on, the lowering adds none of its own: the kernel runs the 8 barriers it ran
    before this change (no doubling); with ThreadSync off it runs its own, one per exchange step
    plus a fence on each side of every op, merged where two meet."""
    a, b, x = _inputs(12)
    outs = [torch.empty(M), torch.empty(N), torch.empty(N), torch.empty(M, N)]
    on = counters(exchanges(True), a, b, x, *outs).total["threadgroup_barriers"]
    source = exchanges(True).get_kernel_source()
    assert on == source.count("threadgroup_barrier(") == 8
    off = exchanges(False).get_kernel_source()
    assert off.count("threadgroup_barrier(") == 10


def test_reduction_under_a_thread_dependent_branch_without_thread_sync_is_refused():
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Cols: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            x = T.alloc_fragment((M, N), "float32")
            cols = T.alloc_fragment((N,), "float32")
            T.copy(X, x)
            if tx < 64:
                T.reduce_sum(x, cols, dim=0)
            T.copy(cols, Cols)

    with pytest.raises(MetalLoweringError, match=r"T\.reduce under `if tx < 64` .* Move the T\.reduce out of that loop or branch") as err:
        tilelang.compile(main, target="metal", execution_backend="emulator", pass_configs=NO_THREAD_SYNC)
    assert "\n" not in str(err.value)


@functools.lru_cache(maxsize=None)
def column_max_in_a_loop(rows: int = 64, cols: int = 8, steps: int = 3):
    """Out[j] = sum over s of max_i A[s, i, j] with ThreadSync off: each step's reduction reuses its
    scratch, so the next publish must wait for the last gather (the fence before the op)."""

    @T.prim_func
    def main(A: T.Tensor((steps, rows, cols), "float32"), Out: T.Tensor((cols,), "float32")):
        with T.Kernel(1, threads=THREADS):
            a = T.alloc_fragment((rows, cols), "float32")
            col = T.alloc_fragment((cols,), "float32")
            acc = T.alloc_fragment((cols,), "float32")
            T.fill(acc, 0.0)
            for s in T.serial(steps):
                T.copy(A[s, :, :], a)
                T.reduce_max(a, col, dim=0)
                for j in T.Parallel(cols):
                    acc[j] += col[j]
            T.copy(acc, Out)

    return tilelang.compile(main, target="metal", execution_backend="emulator", pass_configs=NO_THREAD_SYNC)


def test_reduction_in_a_loop_without_thread_sync_reuses_its_scratch_safely():
    kernel = column_max_in_a_loop()
    a = torch.randn(3, 64, 8, generator=torch.Generator().manual_seed(13))
    out = torch.empty(8)
    racecheck(kernel, a, out)
    torch.testing.assert_close(out, a.amax(1).sum(0))
