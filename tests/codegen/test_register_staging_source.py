"""Register staging of a pipelined K loop (issue 10, item 3; TILELANG_METAL_REGISTER_STAGING): the device
loads of the next tile come before the current tile's matrix operations and their threadgroup
stores after them, with one barrier per K step; lowering only."""

from __future__ import annotations

import re

import pytest
from gemm_support import lower_source

from tilelang_metal import examples as E
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
