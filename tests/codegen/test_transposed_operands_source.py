"""Transposed GEMM operands on the MSL: the matmul2d descriptor's transpose flags, and K loops that
read A and B in their storage order (vector loads, no element-wide device reads)."""

from __future__ import annotations

import pytest
from gemm_support import k_loops, lower_source, scalar_device_loads

from tilelang_metal import kernels as E
from tilelang_metal.target.isa import MATMUL2D_16x32x16, REGISTRY

LAYOUTS = {"nt": (False, True), "tn": (True, False), "tt": (True, True)}


def _source(target: str, dataflow: str, dtype: str, layout: str, M=128, N=256, K=64, **kw) -> str:
    trans_A, trans_B = LAYOUTS[layout]
    t = E.metal4_target() if target == "metal4" else E.plain_metal_target()
    if dataflow == "direct":
        func = E.gemm_direct_global(M, N, K, dtype=dtype, trans_A=trans_A, trans_B=trans_B, **kw)
    else:
        func = E.gemm_shared(M, N, K, dtype=dtype, trans_A=trans_A, trans_B=trans_B, **kw)
    return lower_source(func, t)


def _check_k_loops(source: str) -> None:
    loops = k_loops(source)
    assert loops, "no K loop with matrix operations in the MSL"
    for loop in loops:
        scalars = scalar_device_loads(source, loop)
        assert not scalars, f"scalar device loads in the K loop: {scalars[:4]} ({len(scalars)})"


def _descriptor_flags(source: str) -> set:
    import re

    return set(re.findall(r"matmul2d_descriptor\(16, 32, 16, (true|false), (true|false),", source))


def test_transposed_variants_hold_the_stored_matrices():
    nt = MATMUL2D_16x32x16.transposed(False, True)
    tn = MATMUL2D_16x32x16.transposed(True, False)
    assert (nt.right.rows, nt.right.cols, tn.left.rows, tn.left.cols) == (32, 16, 16, 16)
    assert nt.counter == tn.counter == MATMUL2D_16x32x16.counter  # counted as the one instruction
    assert REGISTRY.resolve(nt.key) == nt and REGISTRY.resolve(MATMUL2D_16x32x16.key) is MATMUL2D_16x32x16
    # lane 3 holds rows (N) 1, 9, 17, 25 of the stored N x K right input, K columns 4..7 (lane_layouts.md 2b)
    assert [(nt.right.row(3, e), nt.right.col(3, e)) for e in (0, 3, 4, 8, 12)] == [(1, 4), (1, 7), (9, 4), (17, 4), (25, 4)]
    with pytest.raises(ValueError, match="already a transposed variant"):
        nt.transposed(True, True)
    with pytest.raises(KeyError, match="n/t"):
        REGISTRY.resolve(MATMUL2D_16x32x16.name + ":x")


def test_nt_direct_global_metal4_reads_b_as_stored():
    source = _source("metal4", "direct", "float16", "nt")
    assert _descriptor_flags(source) == {("false", "true")}
    _check_k_loops(source)


@pytest.mark.slow
@pytest.mark.parametrize("layout,dtype", [("nt", "float16"), ("nt", "bfloat16"), ("tn", "float16"), ("tn", "bfloat16"), ("tt", "float16")])
@pytest.mark.parametrize("dataflow", ["direct", "shared", "shared-staged"])
@pytest.mark.parametrize("target", ["metal4", "metal"])
def test_transposed_k_loops_have_no_scalar_device_loads(monkeypatch, target, dataflow, dtype, layout):
    if dataflow == "shared-staged":  # T.gemm reads the staged tiles from threadgroup memory
        monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")
    source = _source(target, dataflow.split("-")[0], dtype, layout)
    if target == "metal4":
        trans_A, trans_B = LAYOUTS[layout]
        assert _descriptor_flags(source) == {(str(trans_A).lower(), str(trans_B).lower())}
    else:
        assert "simdgroup_load(" in source and ", true);" in source  # the transposed simdgroup_load
    _check_k_loops(source)
