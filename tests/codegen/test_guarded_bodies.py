"""GEMM bodies guarded by construction skip tilelang's LegalizeSafeMemoryAccess
(transform/guarded_bodies.py): the MSL is the one the pass gives when it sees everything, and a body
whose in-bounds proof needs the launch grid or the loop ranges is proven in context or left to it."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as K
from tilelang_metal import pipeline
from tilelang_metal.emulator import racecheck
from tilelang_metal.transform import guarded_bodies


def _compile(func, target, *, skip_guarded: bool, hidden: list | None = None):
    real = guarded_bodies.legalize_unguarded

    def legalize(mod, safe_memory_pass):
        def counting(m):
            if hidden is not None:
                hidden.append(sum(1 for _ in _placeholders(m)))
            return safe_memory_pass(m)

        return real(mod, counting, skip_guarded=skip_guarded)

    original = pipeline.legalize_unguarded
    pipeline.legalize_unguarded = legalize
    try:
        return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")
    finally:
        pipeline.legalize_unguarded = original


def _placeholders(mod):
    from tilelang_metal.core.ir_attrs import find_nodes

    for func in mod.functions.values():
        for node in find_nodes(func.body, ["tirx.AttrStmt"]):
            if node.attr_key == guarded_bodies.GUARDED_BY_CONSTRUCTION:
                yield node


CASES = {
    "direct ragged": lambda: K.gemm_direct_global(37, 70, 48),
    "direct aligned": lambda: K.gemm_direct_global(64, 128, 64),
    "direct ragged transposed": lambda: K.gemm_direct_global(45, 70, 48, trans_A=True, trans_B=True),
    "shared ragged": lambda: K.gemm_shared(100, 72, 64),
}


QUICK = {("direct ragged", "metal"), ("shared ragged", "metal4"), ("direct aligned", "metal4")}


@pytest.mark.parametrize(
    "case,target_name",
    [pytest.param(c, t, marks=() if (c, t) in QUICK else pytest.mark.slow) for c in sorted(CASES) for t in ("metal4", "metal")],
)
def test_skipped_bodies_give_the_msl_of_the_full_pass(case, target_name):
    target = K.metal4_target() if target_name == "metal4" else K.plain_metal_target()
    hidden: list[int] = []
    fast = _compile(CASES[case](), target, skip_guarded=True, hidden=hidden)
    full = _compile(CASES[case](), target, skip_guarded=False)
    assert hidden and hidden[0] >= 1, "the GEMM body was not proven guarded: the pass still walks it"
    assert fast.get_kernel_source() == full.get_kernel_source()


def _overlaunched(m: int, n: int, k: int, extra: int):
    """A direct-global GEMM launched with `extra` threadgroup columns past the matrix: its tile starts
    are multiples of the tile in aligned extents, which the GEMM lowering takes as inside."""

    @T.prim_func
    def main(A: T.Tensor((m, k), "float16"), B: T.Tensor((k, n), "float16"), C: T.Tensor((m, n), "float16")):
        with T.Kernel(T.ceildiv(n, 128) + extra, T.ceildiv(m, 64), threads=128) as (bx, by):
            T.gemm(A[by * 64 : (by + 1) * 64, 0:k], B[0:k, bx * 128 : (bx + 1) * 128], C[by * 64 : (by + 1) * 64, bx * 128 : (bx + 1) * 128], clear_accum=True)

    return main


@functools.lru_cache(maxsize=None)
def _overlaunched_kernel(extra: int, target_name: str = "metal"):
    hidden: list[int] = []
    target = K.metal4_target() if target_name == "metal4" else K.plain_metal_target()
    kernel = _compile(_overlaunched(64, 128, 32, extra), target, skip_guarded=True, hidden=hidden)
    return kernel, hidden[0]


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
def test_a_grid_past_the_matrix_skips_the_gemm_there(target_name):
    """Found with this pass: tilelang's LegalizeSafeMemoryAccess left the vector loads of B and the
    stores of C unguarded in the threadgroup column past the matrix (out of bounds on the GPU)."""
    exact, exact_hidden = _overlaunched_kernel(0, target_name)
    over, over_hidden = _overlaunched_kernel(1, target_name)
    assert exact_hidden == 1 and over_hidden == 1
    assert "if (" not in exact.get_kernel_source()  # the exact grid proves every tile start: no branch
    assert "if (" in over.get_kernel_source()
    a, b = torch.randn(64, 32).half(), torch.randn(32, 128).half()
    torch.testing.assert_close(over(a, b).float(), a.float() @ b.float(), rtol=2e-3, atol=2e-3)
    racecheck(over, a, b)  # the extra threadgroup column reads and writes nothing outside A, B and C
