"""Register staging of a pipelined K loop (issue 10, item 3; TILELANG_METAL_REGISTER_STAGING): the device
loads of the next tile come before the current tile's matrix operations and their threadgroup
stores after them, with one barrier per K step; lowering only."""

from __future__ import annotations

import re

import pytest
from gemm_support import lower_source

from tilelang_metal import kernels as E
from tilelang_metal.transform.shared_staging import keep_shared_staging

MMA = {"metal": "simdgroup_multiply_accumulate(", "metal4": "__ct_op.run("}
DEVICE_LOAD = re.compile(r"= \*\(const device \w+\*\)")
STAGED_STORE = re.compile(r"\*\(threadgroup \w+\*\)\([AB]_s \+ .*= \*\(thread \w+\*\)\(staged_")


def _source(which: str, stages: int, M=128, N=128, K=80, block=64) -> str:
    func = E.gemm_shared(M, N, K, block, block, 16, num_stages=stages, out_dtype="float16")
    target = E.metal4_target() if which == "metal4" else E.plain_metal_target()
    return lower_source(keep_shared_staging(func), target)


def _k_loop(source: str) -> str:
    """The body of the pipelined K loop (the first `for (int ko` loop), braces matched."""
    start = source.index("for (int ko")
    depth, i = 0, source.index("{", start)
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[i : j + 1]
    raise AssertionError("unbalanced K loop")


@pytest.mark.parametrize("which, stages", [("metal", 2), ("metal4", 2), ("metal", 3), ("metal4", 3)])
def test_next_tile_loads_before_the_mmas_and_stores_after(which, stages):
    loop = _k_loop(_source(which, stages))
    mma = loop.index(MMA[which])
    loads = [m.start() for m in DEVICE_LOAD.finditer(loop)]
    stores = [m.start() for m in STAGED_STORE.finditer(loop)]
    assert loads and stores, loop
    assert max(loads) < mma < min(stores)  # every device load issued before the first MMA, every store after the last
    assert loop.rindex(MMA[which]) < min(stores)
    assert loop.count("threadgroup_barrier(") == 1  # one per K step (was two: before the copies and before the MMAs)
    assert "uint4*)(staged_" in loop if which == "metal4" else True  # 16-byte moves kept on both sides


def test_switch_off_keeps_load_and_store_together(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_REGISTER_STAGING", "0")
    loop = _k_loop(_source("metal", 2))
    assert "staged_" not in loop
    assert loop.index("= *(const device") < loop.index(MMA["metal"])
    assert loop.count("threadgroup_barrier(") == 2


def test_unpipelined_loop_is_left_alone():
    # num_stages=0: the copy writes what the MMAs read in the same step, so its stores cannot move
    loop = _k_loop(_source("metal", 0))
    assert "staged_" not in loop


def test_staged_buffer_updated_in_place_is_refused_in_one_line():
    """A staged tile scaled in place after its T.copy: tilelang's pipeline planner cannot pipeline
    it; the error is one line naming the buffer and the fix, not a multi-line internal check."""
    import tilelang
    import tilelang.language as T

    from tilelang_metal.errors import MetalLoweringError

    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((32, 16), "float16")
            B_s = T.alloc_shared((16, 32), "float16")
            acc = T.alloc_fragment((32, 32), "float32")
            T.clear(acc)
            for ko in T.Pipelined(4, num_stages=2):
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                for i, j in T.Parallel(16, 32):
                    B_s[i, j] = B_s[i, j] * T.float16(2)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * 32, bx * 32])

    with pytest.raises(MetalLoweringError, match=r"shared buffer B_s is written by two statements.*num_stages=0") as info:
        tilelang.lower(main, target=E.plain_metal_target())
    assert "\n" not in str(info.value)
