"""Source properties of math calls: helpers printed once per file between the includes and the
kernels, Metal names only, fast:: for float32 only, erf on half computed in float."""

# no `from __future__ import annotations`: T.prim_func evaluates the closures in its annotations

import re

import tilelang
import tilelang.language as T
from tilelang import tvm

N = 64


def _source(func) -> str:
    target = tvm.target.Target("metal")
    with tvm.transform.PassContext(), target:
        return tilelang.lower(func, target=target).kernel_source


def _kernel(dtype: str):
    @T.prim_func
    def uses(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype), D: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=N) as bx:
            for i in T.Parallel(N):
                C[i] = T.log1p(A[i]) + T.log1p(B[i]) * T.hypot(A[i], B[i])
                D[i] = T.__exp(A[i]) + T.erf(B[i]) + T.ldexp(A[i], B[i])

    return uses


def test_helpers_printed_once_before_the_kernel():
    src = _source(_kernel("float32"))
    for helper in ("__tlm_log1p", "__tlm_hypot"):
        assert len(re.findall(rf"inline T {helper}\(", src)) == 1 and src.count(f"inline half {helper}(") == 1, helper
        assert src.index(f"{helper}(") < src.index("[[kernel")
    assert src.index("using namespace metal;") < src.index("__tlm_log1p")
    assert "__tlm_nextafter" not in src  # only the helpers the kernels call
    assert "fast::exp(" in src and "metal::ldexp(" in src and "(int)(" in src
    assert not re.search(r"\b(log1pf|hypotf|ldexpf|expf|erff)\(", src)


def test_half_uses_metal_names_and_float_erf():
    src = _source(_kernel("float16"))
    assert "fast::" not in src  # Metal's fast:: variants are float-only
    assert "metal::exp(" in src
    assert "inline half __tlm_log1p(half a0) { return half(__tlm_log1p(float(a0))); }" in src
    # erf's polynomial runs on a float (the input is converted before the clamp to +-4)
    assert "min(((float)(B[" in src and "half(4.0f)" not in src
