"""Remove expression-level `Let` bindings by substituting the bound value at each use.

tilelang's LowerIntrin writes `T.clamp(x, lo, hi)` and integer `//`, `%` with a divisor it cannot
prove positive as `let v = value in body`; MSL expressions have no such binding. Substitution keeps
every use of the value where the binding put it: a value used only under `if_then_else` or a
`Select` branch stays there, so a guarded load is never hoisted out of its guard. Duplicating a
value is only correct when evaluating it twice is the same as once: a value with side effects
(an `UpdateState` call such as a random-number draw) that is not used exactly once is refused.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..errors import CodegenError
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from ..host import vocab

_UPDATE_STATE = 3  # tvm CallEffectKind::kUpdateState and above (opaque, control) change state


def _has_side_effects(value: Any) -> bool:
    for call in find_nodes(tir.Evaluate(value), [vocab.TIRX_CALL]):
        op = call.op
        if not isinstance(op, tvm.ir.Op):
            return True
        effect = op.get_attr("TCallEffectKind")
        if effect is None or int(effect) >= _UPDATE_STATE:
            return True
    return False


def _uses(body: Any, var: Any) -> int:
    return sum(1 for v in find_nodes(tir.Evaluate(body), [vocab.TIRX_VAR]) if v.same_as(var))


def _inline(let: Any) -> Any:
    if _has_side_effects(let.value) and _uses(let.body, let.var) != 1:
        raise CodegenError(
            f"cannot print `let {let.var.name} = {let.value}`: the value has side effects and is not used exactly once; "
            "bind it to a local variable (T.alloc_var) before using it"
        )
    return tvm.tirx.stmt_functor.substitute(let.body, {let.var: let.value})


def inline_expression_lets(func: Any) -> Any:
    if not find_nodes(func.body, [vocab.TIRX_LET]):
        return func
    # Post order: a Let's value and body are already free of bindings when it is replaced.
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, _inline, [vocab.TIRX_LET])
    return func.with_body(body)


InlineExpressionLets = per_function_pass("tilelang_metal.InlineExpressionLets", inline_expression_lets)
