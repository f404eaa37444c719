"""Keep power-of-two divisions of non-negative indices arithmetic through tilelang's pre-codegen Simplify.

Between the plugin's pipeline and its codegen hook, tilelang runs LowerIntrin, Simplify and
HoistBroadcastValues on the device module. LowerIntrin rewrites `x // 2^k` and `x % 2^k` to
`x >> k` and `x & (2^k - 1)`. The Simplify after it falls back to Z3 for every fact its own
analysis cannot settle, and with a runtime length such facts are everywhere: each guard
`row(lane) < seq_len` of a ragged tile, and every proof attempted under it. With the shifts and
masks Z3 works on bit-vectors, about 60 ms per failed proof instead of 3 ms with integer division,
and a runtime-length flash attention spent ~9 s of its ~16 s lowering there.

So, at the end of the pipeline, a division by 2^k whose dividend is provably non-negative becomes
truncating division (equal to floor division there), which LowerIntrin keeps and Z3 reads as integer
arithmetic. First thing in the codegen hook, truncating division by 2^k of a provably non-negative
dividend becomes the shift / mask LowerIntrin would have written, so the MSL is unchanged; a dividend
the analysis no longer bounds keeps `/` or `%`, equal for non-negative values, never wrong.

Ranges come from the function's own definitions: launch attributes, serial loops, the lane /
simdgroup variables of UseSimdgroupIndices, and the scalar parameters that are tensor dimensions
(`shape_variables`, read from the buffer map before MakePackedAPI drops it, matched by name;
recorded on the kernel for the codegen hook), so a tail count like `(seq_len + 63) // 64` is covered
too. A variable defined twice with different ranges is not bounded (its proofs fail, its divisions
keep the stock lowering). A truncating division by 2^k that was in the kernel before (a `%` of
tilelang's own passes) also becomes a mask when its dividend is provably non-negative: equal values.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm, vocab
from ..core.ir_attrs import LANE_ID_ATTR, SHAPE_PARAMS_ATTR, SIMDGROUP_ID_ATTR, find_nodes
from ..target.isa import SIMD_WIDTH
from .function_pass import per_function_pass


def _power_of_two_shift(divisor: Any) -> int | None:
    """k when `divisor` is the integer constant 2^k (k >= 1), else None."""
    if not isinstance(divisor, tir.IntImm):
        return None
    value = int(divisor.value)
    if value < 2 or value & (value - 1):
        return None
    return value.bit_length() - 1


def bounded_analyzer(func: Any) -> Any:
    """An analyzer knowing the range of every launch, loop and lane / simdgroup variable of `func`."""
    ranges: dict[Any, list[tuple[Any, Any]]] = {}
    for node in find_nodes(func.body, [vocab.TIRX_ATTRSTMT, vocab.TIRX_FOR]):
        if isinstance(node, tir.For):
            ranges.setdefault(node.loop_var, []).append((node.min, node.extent))
        elif node.attr_key == "thread_extent" and isinstance(node.node, tir.IterVar):
            ranges.setdefault(node.node.var, []).append((tir.IntImm(node.value.dtype, 0), node.value))
    attrs = func.attrs if func.attrs is not None else {}
    analyzer = tvm.arith.Analyzer()
    for var in attrs.get(SHAPE_PARAMS_ATTR, []):
        analyzer.update(var, tvm.arith.ConstIntBound(0, tvm.arith.ConstIntBound.POS_INF))
    if LANE_ID_ATTR in attrs:
        analyzer.bind(attrs[LANE_ID_ATTR], tvm.ir.Range(0, SIMD_WIDTH))
    if SIMDGROUP_ID_ATTR in attrs:  # at most 1024 threads: 32 simdgroups
        analyzer.bind(attrs[SIMDGROUP_ID_ATTR], tvm.ir.Range(0, 1024 // SIMD_WIDTH))
    for var, defs in ranges.items():
        first = defs[0]
        if all(tvm.ir.structural_equal(d[0], first[0]) and tvm.ir.structural_equal(d[1], first[1]) for d in defs):
            analyzer.bind(var, tvm.ir.Range.from_min_extent(first[0], first[1]))
    return analyzer


def _rewrite(func: Any, type_keys: list[str], replace: Any) -> Any:
    analyzer = None

    def visit(node: Any) -> Any:
        nonlocal analyzer
        shift = _power_of_two_shift(node.b)
        if shift is None:
            return None
        if analyzer is None:
            analyzer = bounded_analyzer(func)
        if not analyzer.can_prove(node.a >= tir.IntImm(node.a.dtype, 0)):
            return None
        return replace(node, shift)

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, visit, type_keys)
    return func if body.same_as(func.body) else func.with_body(body)


def _to_truncating(node: Any, _shift: int) -> Any:
    if isinstance(node, tir.FloorDiv):
        return tir.Div(node.a, node.b)
    return tir.Mod(node.a, node.b)


def _to_bit_operations(node: Any, shift: int) -> Any:
    dtype = node.a.dtype
    if isinstance(node, tir.Div):
        return tvm.tirx.shift_right(node.a, tir.IntImm(dtype, shift))
    return tvm.tirx.bitwise_and(node.a, tir.IntImm(dtype, (1 << shift) - 1))


def shape_variables(mod: Any) -> set[str]:
    """Names of the variables that are whole dimensions of a tensor parameter, read before
    MakePackedAPI drops the buffer map (the device kernel's parameters are new variables by then,
    of the same names). A name also taken by a scalar parameter or another variable is left out."""
    shapes: dict[str, list[Any]] = {}
    scalars: set[str] = set()
    for func in mod.functions.values():
        if isinstance(func, tir.PrimFunc):
            for buffer in func.buffer_map.values():
                for dim in buffer.shape:
                    if isinstance(dim, tir.Var):
                        shapes.setdefault(dim.name, []).append(dim)
            scalars.update(param.name for param in func.params if param not in func.buffer_map)
    return {name for name, dims in shapes.items() if name not in scalars and all(d.same_as(dims[0]) for d in dims)}


def ShieldPowerOfTwoDivisions(mod: Any, shape_names: set[str]) -> Any:
    """Floor division / modulo by 2^k of provably non-negative values -> truncating (kernels only)."""

    def shield(func: Any) -> Any:
        names = [param.name for param in func.params]
        shapes = [param for param in func.params if param.name in shape_names and names.count(param.name) == 1]
        if shapes:
            func = func.with_attr(SHAPE_PARAMS_ATTR, shapes)
        return _rewrite(func, [vocab.TIRX_FLOORDIV, vocab.TIRX_FLOORMOD], _to_truncating)

    return per_function_pass("tilelang_metal.ShieldPowerOfTwoDivisions", shield, kernels_only=True)(mod)


RestorePowerOfTwoDivisions = per_function_pass(
    "tilelang_metal.RestorePowerOfTwoDivisions",
    lambda func: _rewrite(func, [vocab.TIRX_DIV, vocab.TIRX_MOD], _to_bit_operations),
    kernels_only=True,
)
