"""Integer floor division / modulo never reach the printer (issue 32, item B2).

tilelang's Simplify after LowerIntrin writes new ones: a causal mask over a 64x64 accumulator
(`i < j` at each lane's coordinates, gated-delta-net's chunk output kernel) stopped with `CodegenError:
integer floordiv reached the printer unlowered: lane_id % 8 // 4`. `LowerFloorDivisions` writes them
with MSL's operators first thing in the codegen hook."""

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.host import tir
from tilelang_metal.transform.floor_division import lower_function

S, D, BLOCK = 128, 32, 64


def _masked_scores():
    """Per diagonal block: tril(Q K^T), the mask applied to the accumulator fragment."""

    @T.prim_func
    def main(Q: T.Tensor((S, D), "float16"), K: T.Tensor((S, D), "float16"), A: T.Tensor((S, S), "float32")):
        with T.Kernel(S // BLOCK, threads=128) as bx:
            Q_s = T.alloc_shared((BLOCK, D), "float16")
            K_s = T.alloc_shared((BLOCK, D), "float16")
            scores = T.alloc_fragment((BLOCK, BLOCK), "float32")
            T.copy(Q[bx * BLOCK, 0], Q_s)
            T.copy(K[bx * BLOCK, 0], K_s)
            T.gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(BLOCK, BLOCK):
                with T.If(i < j):
                    with T.Then():
                        scores[i, j] = 0
            T.copy(scores, A[bx * BLOCK, bx * BLOCK])

    return main


@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_causal_mask_on_an_accumulator_fragment(which):
    target = E.metal4_target() if which == "metal4" else E.plain_metal_target()
    kern = tilelang.compile(_masked_scores(), target=target, execution_backend="emulator")
    torch.manual_seed(5)
    q = torch.randn(S, D, dtype=torch.float16)
    k = torch.randn(S, D, dtype=torch.float16)
    out = torch.full((S, S), float("nan"))
    kern(q, k, out)
    for block in range(S // BLOCK):
        rows = slice(block * BLOCK, (block + 1) * BLOCK)
        torch.testing.assert_close(out[rows, rows], torch.tril(q[rows].float() @ k[rows].float().T), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("divisor", [1, 3, -3, 4, -4, 7])
def test_lowered_floor_division_and_modulo_equal_python_for_every_sign(divisor):
    """Each form of the lowering (shift / mask, truncating where both signs are known, the corrected
    truncation otherwise) evaluated at constants: equal to Python's floor // and %."""
    x = tir.Var("x", "int32")
    exprs = [tir.FloorDiv(x, tir.IntImm("int32", divisor)), tir.FloorMod(x, tir.IntImm("int32", divisor))]
    lowered = [lower_function(tir.PrimFunc([x], tir.Evaluate(e))).body.value for e in exprs]
    assert not any(isinstance(e, (tir.FloorDiv, tir.FloorMod)) for e in lowered)
    for value in range(-10, 11):
        got = [_evaluate(e, {x: value}) for e in lowered]
        assert got == [value // divisor, value % divisor], (value, divisor, lowered)


def _truncating_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _evaluate(e, env):
    """The value of an int32 expression as C (and MSL) compute it: truncating / and %, arithmetic >>."""
    if isinstance(e, tir.IntImm):
        return int(e.value)
    if isinstance(e, tir.Var):
        return env[e]
    if isinstance(e, tir.Select):
        return _evaluate(e.true_value if _evaluate(e.condition, env) else e.false_value, env)
    if isinstance(e, tir.Call):
        a, b = (_evaluate(arg, env) for arg in e.args)
        return {"tirx.shift_right": lambda: a >> b, "tirx.bitwise_and": lambda: a & b}[str(e.op.name)]()
    a, b = _evaluate(e.a, env), _evaluate(e.b, env)
    ops = {
        tir.Add: lambda: a + b, tir.Sub: lambda: a - b, tir.Div: lambda: _truncating_div(a, b),
        tir.Mod: lambda: a - _truncating_div(a, b) * b, tir.And: lambda: a and b, tir.NE: lambda: a != b, tir.LT: lambda: a < b,
    }
    return int(ops[type(e)]())
