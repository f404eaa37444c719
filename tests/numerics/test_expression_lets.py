"""Expression-level `let` (from `T.clamp` and from `//`, `%` by a divisor not known to be positive)
is substituted before printing: Python floor semantics for every sign of dividend and divisor, clamp
in float32 / float16, and a guarded load stays under its guard."""

# no `from __future__ import annotations`: T.prim_func evaluates the closures in its annotations

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.transform.expression_lets import inline_expression_lets
from tilelang_metal.host import tir
from tilelang_metal.errors import CodegenError

N = 96


def division_kernel(dtype: str):
    @T.prim_func
    def div_mod(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), Q: T.Tensor((N,), dtype), R: T.Tensor((N,), dtype), Qc: T.Tensor((N,), dtype), Rc: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=N) as bx:
            for i in T.Parallel(N):
                Q[i] = A[i] // B[i]
                R[i] = A[i] % B[i]
                Qc[i] = A[i] // -7  # a negative constant divisor
                Rc[i] = A[i] % -7

    return div_mod


@pytest.fixture(scope="module")
def division():
    return tilelang.compile(division_kernel("int32"), target="metal", execution_backend="emulator")


def test_floor_division_and_modulo_follow_python(division):
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-1000, 1000, (N,), generator=g, dtype=torch.int32)
    b = torch.randint(1, 13, (N,), generator=g, dtype=torch.int32) * torch.where(torch.arange(N) % 2 == 0, 1, -1).int()
    a[:6] = torch.tensor([-7, 7, -6, 6, 0, -1], dtype=torch.int32)  # exact multiples and zero
    b[:6] = torch.tensor([7, -7, -3, -3, -5, 4], dtype=torch.int32)
    outs = [torch.zeros(N, dtype=torch.int32) for _ in range(4)]
    division(a, b, *outs)
    q, r, qc, rc = outs
    assert torch.equal(q, torch.div(a, b, rounding_mode="floor"))
    assert torch.equal(r, torch.remainder(a, b))
    assert torch.equal(qc, torch.div(a, -7, rounding_mode="floor"))
    assert torch.equal(rc, torch.remainder(a, -7))
    assert all(x // y == int(qq) and x % y == int(rr) for x, y, qq, rr in zip(a.tolist(), b.tolist(), q, r))
    assert "let" not in division.get_kernel_source()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_clamp_with_runtime_bounds(dtype):
    @T.prim_func
    def clamp(X: T.Tensor((N,), dtype), Lo: T.Tensor((N,), dtype), Hi: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype), Yc: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=N) as bx:
            for i in T.Parallel(N):
                Y[i] = T.clamp(X[i] * 2, Lo[i], Hi[i])
                Yc[i] = T.clamp(X[i], -0.5, 0.75)

    kernel = tilelang.compile(clamp, target="metal", execution_backend="emulator")
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(N, generator=g) * 2).to(dt)
    lo = (-torch.rand(N, generator=g)).to(dt)
    hi = torch.rand(N, generator=g).to(dt)
    y, yc = torch.zeros(N, dtype=dt), torch.zeros(N, dtype=dt)
    kernel(x, lo, hi, y, yc)
    assert torch.equal(y, torch.minimum(torch.maximum(x * 2, lo), hi))
    assert torch.equal(yc, x.clamp(-0.5, 0.75))


def test_guarded_load_stays_under_its_guard():
    """`let v = B[j] in if_then_else(j < n, v, 0)` must not read B[j] when j >= n: substitution
    keeps the load inside the branch (the emulator's checked buffers fault on an out-of-bounds read)."""

    @T.prim_func
    def guarded(A: T.Tensor((N,), "int32"), B: T.Tensor((N - 5,), "int32"), C: T.Tensor((N,), "int32")):
        with T.Kernel(1, threads=N) as bx:
            for i in T.Parallel(N):
                C[i] = T.if_then_else(i < N - 5, B[T.min(i, N - 6)] // A[i], -1)

    kernel = tilelang.compile(guarded, target="metal", execution_backend="emulator")
    a = torch.tensor([(-3 if i % 2 else 4) for i in range(N)], dtype=torch.int32)
    b = torch.arange(N - 5, dtype=torch.int32) - 40
    c = torch.zeros(N, dtype=torch.int32)
    kernel(a, b, c)
    expected = torch.full((N,), -1, dtype=torch.int32)
    expected[: N - 5] = torch.div(b, a[: N - 5], rounding_mode="floor")
    assert torch.equal(c, expected)


def test_let_under_a_select_branch_is_substituted_in_place():
    x = tir.Var("x", "int32")
    v = tir.Var("v", "int32")
    buf = tir.decl_buffer((8,), "int32", name="B")
    load = tir.BufferLoad(buf, [x])
    guarded = tir.Select(x < 8, tir.Let(v, load, v * v + v), tir.const(0, "int32"))
    func = tir.PrimFunc([x, buf.data], tir.Evaluate(guarded))
    out = inline_expression_lets(func).body.value
    assert isinstance(out, tir.Select) and "let" not in str(out)
    assert "B[x]" not in str(out.condition) and str(out.true_value).count("B[x]") == 3


def test_side_effect_value_used_twice_is_refused():
    v = tir.Var("v", "float32")
    draw = tir.call_extern("float32", "rng_draw")  # extern calls may update state
    func = tir.PrimFunc([], tir.Evaluate(tir.Let(v, draw, v + v)))
    with pytest.raises(CodegenError, match="side effects"):
        inline_expression_lets(func)
