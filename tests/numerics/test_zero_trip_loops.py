"""Loops whose trip count is 0 for some threads and 1 for others (a grid-stride loop over a short
range): tilelang's Simplify folded their extent to 1, so every thread ran the body once and read
past its range as zeros (a silent wrong number). `GuardPossiblyEmptyLoops` runs such loops under
`if (extent > 0)`. Numerics against a Python loop under the race checker, and the pass on
hand-built TIR: which loops it guards and which it leaves."""

from __future__ import annotations

import pytest
import tilelang.language as T
import torch
from gemm_support import compile_emulated

from tilelang_metal.emulator import racecheck
from tilelang_metal.host import tir, tvm
from tilelang_metal.transform.zero_trip_loops import guard_function

BLOCKS, THREADS, SIMD = 4, 128, 32


def _grid_stride_sum(n: int, span: int, step: int):
    """Out[b, t] = sum of X[k] + 1 over k = b * span + t // 32, stepping by `step`, below min((b + 1) * span, n)."""

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Out: T.Tensor((BLOCKS * THREADS,), "float32")):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            tx = T.get_thread_binding()
            acc = T.alloc_var("float32")
            acc = 0
            for k in T.serial(bx * span + tx // SIMD, T.min(bx * span + span, n), step):
                acc += X[k] + 1
            Out[bx * THREADS + tx] = acc

    return main


def _reference(x: torch.Tensor, n: int, span: int, step: int) -> torch.Tensor:
    out = torch.zeros(BLOCKS, THREADS)
    for b in range(BLOCKS):
        for t in range(THREADS):
            for k in range(b * span + t // SIMD, min(b * span + span, n), step):
                out[b, t] += x[k] + 1
    return out.flatten()


@pytest.mark.parametrize("n, span, step", [(3, 1, 4), (5, 1, 4), (8, 5, 4), (6, 2, 4), (5, 1, 2)])
def test_grid_stride_loops_with_trip_counts_of_zero_and_one(plain_metal, n, span, step):
    """(3, 1, 4) gave every thread one iteration (off by 3.0); the others (trip counts 0, 1 and 2,
    other steps) were right before and must stay so."""
    kernel = compile_emulated(_grid_stride_sum(n, span, step), plain_metal)
    x = torch.arange(1, n + 1, dtype=torch.float32)
    assert torch.equal(racecheck(kernel, x), _reference(x, n, span, step))


def _pipelined_block_sums(stages: int, rows: int = 100, block: int = 64, dim: int = 16):
    """Out[bx] = column sums of X's first min(rows, 64 * ceil((bx + 1) * 32 / 64)) rows, block by
    block in T.Pipelined: a block-dependent trip count of 1 or 2 (causal attention's key blocks)."""

    @T.prim_func
    def main(X: T.Tensor((rows, dim), "float32"), Out: T.Tensor((BLOCKS, 16, dim), "float32")):
        with T.Kernel(BLOCKS, threads=32) as bx:
            tile = T.alloc_shared((block, dim), "float32")
            ones = T.alloc_fragment((16, block), "float32")
            acc = T.alloc_fragment((16, dim), "float32")
            T.fill(ones, 1.0)
            T.clear(acc)
            for kb in T.Pipelined(T.min(T.ceildiv(rows, block), T.ceildiv((bx + 1) * 32, block)), num_stages=stages):
                T.copy(X[kb * block : (kb + 1) * block, :], tile)
                T.gemm(ones, tile, acc)
            T.copy(acc, Out[bx, :, :])

    return main


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
@pytest.mark.parametrize("stages", [1, 2])
def test_pipelined_loops_with_trip_counts_of_one_and_two(target_name, stages):
    """After InjectSoftwarePipeline the body loop runs the trip count minus the prologue, 0 or 1
    times; Simplify folded it to 1, so blocks 0 and 1 summed 100 (stages 1) or 128 rows, not 64."""
    from tilelang_metal.kernels import metal4_target, plain_metal_target

    target = metal4_target() if target_name == "metal4" else plain_metal_target()
    kernel = compile_emulated(_pipelined_block_sums(stages), target)
    x = torch.ones(100, 16)
    assert racecheck(kernel, x)[:, 0, 0].tolist() == [64.0, 64.0, 100.0, 100.0]


def _launched(body, bx, tx):
    """`body` under a 4-block launch of 128 threads, as MaterializeKernelLaunch leaves it."""
    inner = tir.AttrStmt(tir.IterVar(tvm.ir.Range(0, THREADS), tx, tir.IterVar.ThreadIndex, "threadIdx.x"), "thread_extent", THREADS, body)
    return tir.AttrStmt(tir.IterVar(tvm.ir.Range(0, BLOCKS), bx, tir.IterVar.ThreadIndex, "blockIdx.x"), "thread_extent", BLOCKS, inner)


def _loops_guarded(extent_of, *params) -> list[bool]:
    bx, tx, k = tir.Var("bx", "int32"), tir.Var("tx", "int32"), tir.Var("k", "int32")
    work = tir.Evaluate(tir.call_extern("int32", "work", k))
    loop = tir.For(k, 0, extent_of(bx, tx), tir.ForKind.SERIAL, work)
    out = guard_function(tir.PrimFunc(list(params), _launched(loop, bx, tx))).body.body.body
    return isinstance(out, tir.IfThenElse) and isinstance(out.then_case, tir.For) and tvm.arith.Analyzer().can_prove(
        out.condition == (out.then_case.extent > 0)
    )


def test_the_pass_guards_launch_bounded_extents_that_can_be_zero():
    assert _loops_guarded(lambda bx, tx: tir.floordiv(tir.min(1, 3 - bx) + 3 - tir.floordiv(tx, 32), 4))
    assert _loops_guarded(lambda bx, tx: 2 - bx)  # 2, 1, 0, -1


def test_the_pass_leaves_constant_positive_and_runtime_extents():
    n = tir.Var("n", "int32")
    assert not _loops_guarded(lambda bx, tx: tir.const(4, "int32"))
    assert not _loops_guarded(lambda bx, tx: bx + 1)  # at least one trip
    assert not _loops_guarded(lambda bx, tx: tir.floordiv(n - bx, 4), n)  # a runtime size: unbounded, not folded
