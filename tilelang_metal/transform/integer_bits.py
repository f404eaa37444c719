"""Integer bit operations in address expressions, for proofs.

After tilelang's LowerIntrin, `x // 2^k` and `x % 2^k` are printed as shifts and masks, which the
TVM analyzer does not reason about. These helpers turn them back into floor division / modulo
(exact for two's complement integers) so proofs of alignment or layout go through, and fold
constant bit operations after a substitution.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..host import vocab

_BIT_CALLS = (vocab.TIRX_SHIFT_RIGHT, vocab.TIRX_SHIFT_LEFT, vocab.TIRX_BITWISE_AND, vocab.TIRX_BITWISE_OR, vocab.TIRX_BITWISE_XOR)


def _map_calls(e: Any, rewrite: Any) -> Any:
    def post(node: Any) -> Any:
        return rewrite(node) if isinstance(node, tir.Call) else None

    return tvm.tirx.stmt_functor.ir_transform(tir.Evaluate(e), None, post, [vocab.TIRX_CALL]).value


def _power_of_two(e: Any) -> int | None:
    if isinstance(e, tir.IntImm) and int(e.value) > 0 and int(e.value) & (int(e.value) - 1) == 0:
        return int(e.value)
    return None


def bits_as_arithmetic(e: Any) -> Any:
    """`x >> k` -> x // 2^k, `x << k` -> x * 2^k, `x & (2^k - 1)` -> x % 2^k (exact for two's
    complement integers, floor semantics)."""

    def rewrite(call: Any) -> Any:
        name = str(getattr(call.op, "name", ""))
        if len(call.args) != 2 or not isinstance(call.args[1], tir.IntImm):
            return None
        x, k = call.args[0], int(call.args[1].value)
        if name == vocab.TIRX_SHIFT_RIGHT and 0 <= k < 31:
            return tir.floordiv(x, tir.const(1 << k, x.dtype))
        if name == vocab.TIRX_SHIFT_LEFT and 0 <= k < 31:
            return x * tir.const(1 << k, x.dtype)
        if name == vocab.TIRX_BITWISE_AND and _power_of_two(tir.const(k + 1, "int64")) is not None:
            return tir.floormod(x, tir.const(k + 1, x.dtype))
        return None

    return _map_calls(e, rewrite)


def fold_constant_bits(e: Any) -> Any:
    def rewrite(call: Any) -> Any:
        name = str(getattr(call.op, "name", ""))
        if name not in _BIT_CALLS or not all(isinstance(a, tir.IntImm) for a in call.args):
            return None
        a, b = (int(x.value) for x in call.args)
        value = {
            vocab.TIRX_SHIFT_RIGHT: lambda: a >> b,
            vocab.TIRX_SHIFT_LEFT: lambda: a << b,
            vocab.TIRX_BITWISE_AND: lambda: a & b,
            vocab.TIRX_BITWISE_OR: lambda: a | b,
            vocab.TIRX_BITWISE_XOR: lambda: a ^ b,
        }[name]()
        return tir.const(value, call.dtype)

    return _map_calls(e, rewrite)


def has_division(e: Any) -> bool:
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, (tir.FloorDiv, tir.FloorMod, tir.Div, tir.Mod)) or (
            isinstance(node, tir.Call) and str(getattr(node.op, "name", "")) in _BIT_CALLS
        ):
            found = True

    tir.stmt_functor.post_order_visit(e, visit)
    return found
