"""Power-of-two divisions through tilelang's pre-codegen LowerIntrin + Simplify
(transform/power_of_two_division.py), on hand-built TIR: a runtime length guard like the ones of a
ragged attention tile."""

from __future__ import annotations


from tilelang_metal.host import tir, tvm
from tilelang_metal.transform.power_of_two_division import RestorePowerOfTwoDivisions, ShieldPowerOfTwoDivisions

THREADS = 128


def guarded_kernel():
    """out[i] = in[(tx // 16) * n + tx % 8] when that row is < n, with n a tensor dimension;
    plus off[...] = (s - 5) // 4 and (s - 5) % 8 of a scalar s that may be negative."""
    a_ptr = tir.Var("A", tvm.ir.PointerType(tvm.ir.PrimType("float32")))
    b_ptr = tir.Var("B", tvm.ir.PointerType(tvm.ir.PrimType("int32")))
    n, s = tir.Var("n", "int32"), tir.Var("s", "int32")
    a = tir.decl_buffer((4096,), "float32", "A", data=a_ptr)
    b = tir.decl_buffer((4096,), "int32", "B", data=b_ptr)
    tx = tir.Var("tx", "int32")
    row = tir.floordiv(tx, 16) * 4 + tir.floordiv(tir.floormod(tx, 8), 2)
    tiles = tir.floordiv(n + 31, 32)
    guarded = tir.BufferStore(a, tvm.tirx.if_then_else(row < n, tir.BufferLoad(a, [row * n + tir.floormod(tx, 8)]), tir.FloatImm("float32", 0.0)), [tx])
    signed = tir.BufferStore(b, tir.floordiv(s - 5, 4) + tir.floormod(s - 5, 8) + tiles, [tx])
    body = tir.SeqStmt([guarded, signed])
    launch = tir.IterVar(tvm.ir.Range(0, THREADS), tx, tir.IterVar.ThreadIndex, "threadIdx.x")
    func = tir.PrimFunc([a_ptr, b_ptr, n, s], tir.AttrStmt(launch, "thread_extent", THREADS, body))
    return tvm.IRModule({"k": func.with_attr("thread_extent", {"threadIdx.x": THREADS}).with_attr("target", tvm.target.Target("metal"))})


def nodes(mod, kind) -> list:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(mod["k"].body, lambda node: found.append(node) if isinstance(node, kind) else None)
    return found


def evaluate(expr, values: dict) -> int:
    """The integer value of `expr` (the arithmetic LowerIntrin + Simplify leave) at `values`, by name."""
    if isinstance(expr, tir.IntImm):
        return int(expr.value)
    if isinstance(expr, tir.Var):
        return values[expr.name]
    if isinstance(expr, tir.Call):
        a, b = (evaluate(arg, values) for arg in expr.args)
        return {"tirx.shift_right": lambda: a >> b, "tirx.bitwise_and": lambda: a & b}[expr.op.name]()
    a, b = evaluate(expr.a, values), evaluate(expr.b, values)
    if isinstance(expr, tir.Div):
        return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    if isinstance(expr, tir.Mod):
        return a - b * (abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1))
    return {tir.Add: a + b, tir.Sub: a - b, tir.Mul: a * b, tir.FloorDiv: a // b if b else 0, tir.FloorMod: a % b if b else 0}[type(expr)]


def lower_intrin_simplify(mod):
    import tilelang

    return tvm.tirx.transform.Simplify()(tilelang.transform.LowerIntrin()(mod))


def test_non_negative_divisions_reach_simplify_as_integer_division():
    """Lane-derived rows and the tile count of the tensor dimension n become truncating division
    (Z3 reads it as integer arithmetic; LowerIntrin's shifts made each failed proof ~20x slower);
    the scalar s may be negative, so its floor division and modulo keep the stock lowering."""
    shielded = ShieldPowerOfTwoDivisions(guarded_kernel(), {"n"})
    divisions = [(type(d).__name__, str(d.a)) for d in nodes(shielded, (tir.Div, tir.Mod))]
    floors = sorted(str(d.a) for d in nodes(shielded, (tir.FloorDiv, tir.FloorMod)))
    assert set(divisions) == {("Div", "tx"), ("Div", "T.truncmod(tx, 8)"), ("Mod", "tx"), ("Div", "n + 31")}, divisions
    assert floors == ["s - 5", "s - 5"]


def test_an_unknown_scalar_is_not_taken_for_a_dimension():
    """Without n among the tensor dimensions, (n + 31) // 32 may be of a negative n: kept."""
    shielded = ShieldPowerOfTwoDivisions(guarded_kernel(), set())
    assert "n + 31" in [str(d.a) for d in nodes(shielded, tir.FloorDiv)]


def test_codegen_sees_the_shifts_and_masks_of_the_stock_lowering():
    """Restored after LowerIntrin + Simplify: the guarded load is the stock kernel's node for node;
    the store mixing kept and restored divisions may order its terms differently, with the same
    values for negative, zero and positive s and n."""
    stock = lower_intrin_simplify(guarded_kernel())
    restored = RestorePowerOfTwoDivisions(lower_intrin_simplify(ShieldPowerOfTwoDivisions(guarded_kernel(), {"n"})))
    assert not nodes(restored, (tir.Div, tir.Mod))
    (stock_load, stock_signed), (load, signed) = (nodes(m, tir.BufferStore) for m in (stock, restored))
    assert tvm.ir.structural_equal(load, stock_load, map_free_vars=True), (load, stock_load)
    for values in ({"s": -13, "n": 0, "tx": 5}, {"s": -2, "n": 7, "tx": 127}, {"s": 0, "n": 1, "tx": 0}, {"s": 41, "n": 96, "tx": 33}):
        assert evaluate(signed.value, values) == evaluate(stock_signed.value, values), values
