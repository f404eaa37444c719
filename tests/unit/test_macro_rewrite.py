"""tilelang's library macros (`T.reduce_*` defines one per call) are rewritten once per process
(host/frontend.py): later calls reuse the rewrite with their own closure values, and the prim_func
is the one tilelang's own rewrite gives."""

import tilelang
import tilelang.language as T
import torch
from tilelang.language.eager import ast as eager_ast
from tilelang.language.eager import builder, utils


def _row_and_column_reductions(rows: int, cols: int):
    @T.prim_func
    def main(A: T.Tensor((rows, cols), "float32"), R: T.Tensor((rows,), "float32"), C: T.Tensor((cols,), "float32")):
        with T.Kernel(1, threads=64):
            a = T.alloc_fragment((rows, cols), "float32")
            r = T.alloc_fragment((rows,), "float32")
            c = T.alloc_fragment((cols,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, r, dim=1)
            T.reduce_max(a, c, dim=0)
            T.copy(r, R)
            T.copy(c, C)

    return main


def test_library_macros_are_rewritten_once(monkeypatch):
    _row_and_column_reductions(16, 16)  # the first rewrite of the reduction macro is kept
    parsed = []
    real_get_ast = utils.get_ast
    monkeypatch.setattr(utils, "get_ast", lambda func: parsed.append(func.__qualname__) or real_get_ast(func))
    _row_and_column_reductions(16, 32)
    assert parsed == ["_row_and_column_reductions.<locals>.main"]  # the kernel itself, no macro


def test_the_prim_func_is_tilelangs_own_and_runs():
    cached = _row_and_column_reductions(8, 32)
    original = builder.mutate
    builder.mutate = eager_ast.mutate  # tilelang's rewrite, every time
    try:
        plain = _row_and_column_reductions(8, 32)
    finally:
        builder.mutate = original
    assert cached.script() == plain.script()
    kernel = tilelang.compile(cached, out_idx=[1, 2], target="metal", execution_backend="emulator")
    a = torch.randn(8, 32)
    rows, cols = kernel(a)
    torch.testing.assert_close(rows, a.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cols, a.amax(0))
