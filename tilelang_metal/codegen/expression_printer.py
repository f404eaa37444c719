"""Printing of TIR expressions as MSL: constants, variables (position attributes marked used), casts,
operators (flat addition chains; precise-math division and infinity tests), select / if_then_else
(the branches' accesses predicated), vectors, buffer loads and calls (extern, math, atomic, packed
and warp calls handed to their printers). A mixin of the kernel printer, which memoizes each printed
subtree (`expr`)."""

from __future__ import annotations

import math
from typing import Any

from ..core import intrinsics
from ..errors import CodegenError
from ..host import DEBUG_PRINT_EXTERNS, tir, vocab
from . import access_marks
from .extern_helpers import EXTERN_HELPERS
from .math_functions import math_call, precise_divide, uint_like
from .msl_types import float_literal, int_literal, msl_type, split_dtype
from .operators import BINARY_OPS, BIT_OPS


class ExpressionPrinting:
    """Needs from the host printer: `_expr_memo`, `precise_math`, `position_of`, `used_positions`,
    `unsigned_positions`, `name_of`, `access`, `packed_access`, `pointer`, the matrix, atomic and warp
    printers' element loads and calls, `note_atomic` / `discarded_atomic`, `prints`, `support_code`, `helpers`."""

    def expr(self, e: Any) -> str:
        if isinstance(e, (int, bool)):
            return str(int(e))
        if isinstance(e, (tir.IntImm, tir.FloatImm)):
            return self._print_expr(e)  # constants hash by value (2 and 2u alike): never memoized
        # IR is immutable and shares subtrees: print each object once, keyed by its hash (the memo
        # keeps the object alive); a hit counts only for the same object.
        key = e.__hash__()
        hit = self._expr_memo.get(key)
        if hit is None or not hit[0].same_as(e):
            hit = (e, self._print_expr(e))
            self._expr_memo[key] = hit
        return hit[1]

    def _print_expr(self, e: Any) -> str:
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is not None:
            return method(e)
        if isinstance(e, tir.Add):  # a chain of additions prints flat: (a + b + c)
            return f"({' + '.join(self.expr(t) for t in _add_terms(e))})"
        if self.precise_math and isinstance(e, (tir.Div, tir.EQ, tir.NE)):
            printed = self._precise_operator(e)
            if printed is not None:
                return printed
        op = BINARY_OPS.get(type(e))
        if op is not None:
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        raise CodegenError(f"the Metal printer does not support {type(e).__name__} expressions: {e}")

    def _precise_operator(self, e: Any) -> str | None:
        """Precise math: float32 division as `precise::divide`; a comparison with an infinity (how
        LowerIntrin writes isinf) as a bit test, which fast math cannot assume away."""
        if isinstance(e, tir.Div):
            return precise_divide(self.expr(e.a), self.expr(e.b)) if str(e.dtype).startswith("float32") else None
        for value, infinity in ((e.a, e.b), (e.b, e.a)):
            if isinstance(infinity, tir.FloatImm) and math.isinf(infinity.value) and str(value.dtype).startswith("float32"):
                bits = "0x7f800000u" if infinity.value > 0 else "0xff800000u"
                op = "==" if isinstance(e, tir.EQ) else "!="
                return f"(as_type<{uint_like(str(value.dtype))}>({self.expr(value)}) {op} {bits})"
        return None

    def expr_IntImm(self, e: Any) -> str:
        return int_literal(int(e.value), str(e.dtype))

    def expr_FloatImm(self, e: Any) -> str:
        return float_literal(float(e.value), str(e.dtype))

    def expr_StringImm(self, e: Any) -> str:
        return c_string_literal(str(e.value))

    def expr_Var(self, e: Any) -> str:
        position = self.position_of.get(e)
        if position is not None:
            self.used_positions.add(position)
        return self.name_of(e)

    expr_SizeVar = expr_Var

    def expr_Cast(self, e: Any) -> str:
        ty = msl_type(str(e.dtype))
        if str(e.dtype) == "uint32" and isinstance(e.value, tir.Var) and e.value in self.unsigned_positions:
            self.expr(e.value)  # marks the position attribute as used
            return self.unsigned_positions[e.value]  # the attribute's own uint component
        if split_dtype(str(e.dtype))[1] > 1:
            return f"{ty}({self.expr(e.value)})"  # MSL converts vectors through constructors
        return f"(({ty})({self.expr(e.value)}))"

    def expr_Not(self, e: Any) -> str:
        return f"(!{self.expr(e.a)})"

    def expr_Min(self, e: Any) -> str:
        return f"min({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Max(self, e: Any) -> str:
        return f"max({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_FloorDiv(self, e: Any) -> str:
        if "float" in str(e.dtype):
            if self.precise_math and str(e.dtype).startswith("float32"):
                return f"floor({precise_divide(self.expr(e.a), self.expr(e.b))})"
            return f"floor({self.expr(e.a)} / {self.expr(e.b)})"
        raise CodegenError(f"integer floordiv reached the printer unlowered: {e}")

    def expr_FloorMod(self, e: Any) -> str:
        raise CodegenError(f"floormod reached the printer unlowered: {e}")

    def choose(self, cond: Any, true_value: Any, false_value: Any) -> str:
        c, t, f = self.expr(cond), self.expr(true_value), self.expr(false_value)
        if split_dtype(str(cond.dtype))[1] > 1:
            return f"select({f}, {t}, {c})"  # lane-wise: MSL's ternary takes a scalar condition only
        return f"({c} ? {access_marks.predicated(f'{t} : {f}')})"  # one branch runs: its accesses are predicated

    def expr_Select(self, e: Any) -> str:
        return self.choose(e.condition, e.true_value, e.false_value)

    def expr_Broadcast(self, e: Any) -> str:
        return f"{msl_type(str(e.dtype))}({self.expr(e.value)})"

    def expr_Ramp(self, e: Any) -> str:
        lanes = split_dtype(str(e.dtype))[1]
        parts = [f"{self.expr(e.base)} + {self.expr(e.stride)} * {t}" for t in range(lanes)]
        return f"{msl_type(str(e.dtype))}({', '.join(parts)})"

    def expr_Shuffle(self, e: Any) -> str:
        """Lanes picked from the concatenation of `e.vectors` (TVM's vectorizer scalarizes a lane-wise
        call it cannot vectorize, such as `tl.clamp`, as per-lane extractions `Shuffle([v], [k])`
        joined by `Shuffle([s0, s1, s2, s3], [0, 1, 2, 3])`): each lane as a component `.x`-`.w`
        of its vector, the result as a scalar or a vector constructor."""
        lanes_of = [split_dtype(str(v.dtype))[1] for v in e.vectors]
        if any(n > 4 for n in lanes_of):
            raise CodegenError(f"vector shuffle of a {max(lanes_of)}-lane vector: Metal vectors have at most 4 lanes")
        elements: list[str] = []
        for vector, n in zip(e.vectors, lanes_of):
            printed = self.expr(vector)
            elements += [printed] if n == 1 else [f"({printed}).{'xyzw'[k]}" for k in range(n)]
        picked = [elements[int(i)] for i in e.indices]
        if len(picked) == 1:
            return picked[0]
        return f"{msl_type(str(e.dtype))}({', '.join(picked)})"

    def expr_Let(self, e: Any) -> str:
        raise CodegenError("expression-level let bindings are not supported by the Metal printer (run LetInline)")

    def expr_BufferLoad(self, e: Any) -> str:
        var = e.buffer.data
        index = e.indices[-1]
        lanes = split_dtype(str(e.dtype))[1]
        if self.is_elided_cooperative(var) or self.is_simdgroup(var):
            return self.load_matrix_element(var, index, str(e.dtype), lanes)
        return self.access(var, index, lanes, str(e.buffer.dtype))

    def expr_Call(self, e: Any) -> str:
        op = str(e.op.name)
        args = e.args
        if op in BIT_OPS:
            return f"({self.expr(args[0])} {BIT_OPS[op]} {self.expr(args[1])})"
        if op == vocab.TIRX_BITWISE_NOT:
            return f"(~{self.expr(args[0])})"
        if op == vocab.TIRX_IF_THEN_ELSE:
            return self.choose(args[0], args[1], args[2])
        if op == vocab.TIRX_LIKELY:
            return self.expr(args[0])
        if op == vocab.TIRX_REINTERPRET:
            return f"as_type<{msl_type(str(e.dtype))}>({self.expr(args[0])})"
        if op in (vocab.TIRX_CALL_EXTERN, vocab.TIRX_CALL_PURE_EXTERN):
            packed = intrinsics.match_packed(e)
            if packed is not None:
                return f"{msl_type(packed.dtype)}({self.packed_access(packed)})"
            atomic = intrinsics.match_atomic(e)
            if atomic is not None:
                self.note_atomic(atomic, discarded=self.discarded_atomic is not None and e.same_as(self.discarded_atomic))
                return self.atomic(atomic)
            name = str(args[0].value)
            if name in DEBUG_PRINT_EXTERNS:
                check_printable(name, args[-1])
                self.prints = True
            if name in access_marks.SHUFFLE_FUNCTIONS:  # a lane's operand, which other lanes may read
                return f"{name}({access_marks.shuffled(', '.join(self.expr(a) for a in args[1:]))})"
            helper = EXTERN_HELPERS.get(name)
            if helper is not None:  # a CUDA device function Metal lacks (T.dp4a)
                name, self.support_code[helper[0]] = helper
            return self.math(name, args[1:], e) or f"{name}({', '.join(self.expr(a) for a in args[1:])})"
        if op in (vocab.TIRX_ADDRESS_OF, vocab.TIRX_TVM_ACCESS_PTR):
            return self.pointer(e)
        special = self.warp_call(op, e)
        if special is not None:
            return special
        text = self.math(op, args, e)
        if text is not None:
            return text
        raise CodegenError(f"the Metal printer does not support the call {op}: {e}")

    def math(self, name: str, args: Any, call: Any) -> str | None:
        """A math function call in MSL (codegen/math_functions.py), or None if `name` is none."""
        printed = math_call(name, [self.expr(a) for a in args], [str(a.dtype) for a in args], str(call.dtype), self.precise_math)
        if printed is None:
            return None
        self.helpers |= printed.helpers
        return printed.text


def c_string_literal(text: str) -> str:
    """`text` as a C string literal: quotes, backslashes and control characters escaped (octal, which
    cannot swallow a following digit the way a hex escape would)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def check_printable(extern: str, value: Any) -> None:
    """T.print takes one scalar value per call (tilelang prints a buffer element by element)."""
    if extern == "debug_print_msg":
        return
    dtype = str(value.dtype)
    if dtype == "handle":
        raise CodegenError(f"T.print of a pointer ({value}): print the values it points at, e.g. T.print(buffer)")
    if split_dtype(dtype)[1] > 1:
        raise CodegenError(f"T.print of a {dtype} vector ({value}): Metal's print takes one scalar; print each lane")


def _add_terms(e: Any) -> list[Any]:
    if isinstance(e, tir.Add):
        return _add_terms(e.a) + _add_terms(e.b)
    return [e]
