"""Whole-matrix forms for register accumulators held in simdgroup matrices (spec sections 3.2, 5.3).

A `local.fragment` accumulator on the simdgroup path is a per-thread array in the 8x8 lane layout
(two elements per lane per matrix); `T.clear` and `T.copy` lower through layout inference into
per-lane element stores. Where such a store provably is a whole-matrix operation, this pass writes
it as one:
- a splat of a simdgroup-uniform constant into both elements of matrix `f`
  -> `X[f] = make_filled_simdgroup_matrix<T, 8, 8>(v)`;
- a 2-lane store of matrix `f`'s elements to memory whose address, evaluated for each of the 32
  lanes, is `base + row(lane) * S + col(lane)` (the instruction's lane map, `isa.py`) with one
  lane-independent `base` and stride `S` -> `simdgroup_store(X[f], buf + base, S)`.
Only unguarded stores qualify (a store under a condition that may differ between the lanes of a
simdgroup keeps its per-lane form: partial tiles stay masked), and only stores whose memory dtype
is the accumulator's (no conversion on the way). The memory accesses are the same elements as
before, so results cannot change; the emulator counts a simdgroup_store as one 2-element access per
lane, like the `float2` store it replaces.

Runs in the codegen stage (after tilelang's last Simplify, before the address hoisting): it needs
the lane variable of `UseSimdgroupIndices` and the constant accumulator indices of
`UnrollAccumulatorLoops`.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir, tvm
from ..target.isa import REGISTRY, SIMD_WIDTH
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .kernel_prelude import prelude_vars
from .integer_bits import bits_as_arithmetic, fold_constant_bits, has_division
from .simdgroup_indices import LANE_ID_ATTR, SIMDGROUP_ID_ATTR
from ..host import vocab



def _lane_layout_matrices(body: Any) -> dict[Any, Any]:
    """Data var -> buffer of the per-thread arrays the simdgroup builtins use in lane layout."""
    allocs = {node.buffer.data: node.buffer for node in find_nodes(body, [vocab.TIRX_ALLOCBUFFER])}
    out: dict[Any, Any] = {}
    for call in find_nodes(body, [vocab.TIRX_CALL]):
        for var in intrinsics.simdgroup_matrix_operands(call):
            buf = allocs.get(var)
            if buf is not None and str(buf.scope()) != "metal.simdgroup":
                out[var] = buf
    return out


def _substitute(e: Any, var: Any, value: int) -> Any:
    return tvm.tirx.stmt_functor.substitute(e, {var: tir.const(value, var.dtype)})


def _free_vars(e: Any) -> list[Any]:
    return list(tvm.tirx.analysis.undefined_vars(e, []))


def _has_load(e: Any) -> bool:
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, tir.BufferLoad):
            found = True

    tir.stmt_functor.post_order_visit(e, visit)
    return found


class _Rewriter:
    def __init__(self, func: Any, lane: Any, sg: Any, matrices: dict[Any, Any]):
        self.inst = REGISTRY.simdgroup_matrix()  # the simdgroup builtins' matrices (8x8, MSL's only shape)
        self.per_lane = self.inst.dest_elems  # elements of one matrix held by each lane
        self.lane = lane
        self.matrices = matrices
        self.analyzer = tvm.arith.Analyzer()
        self.analyzer.bind(lane, tvm.ir.Range(0, SIMD_WIDTH))
        # variables with one value per simdgroup: positions, parameters, prelude bindings
        self.uniform: set = {p for p in func.params} | set(prelude_vars(func))
        if sg is not None:
            self.uniform.add(sg)
        self.constants: dict[Any, Any] = {}  # Bind var -> constant value (hoisted broadcast values)
        self.memory: set = {p for p in func.params if str(p.dtype) == "handle"}
        for node in find_nodes(func.body, [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND]):
            if isinstance(node, tir.Bind):
                if str(node.var.dtype) == "handle":
                    self.memory.add(node.var)  # a typed view into a merged threadgroup pool
            elif str(node.buffer.scope()).startswith("shared"):
                self.memory.add(node.buffer.data)
        self.rewrites: dict[Any, Any] = {}  # store -> its whole-matrix form
        self.blocked: set = set()  # stores also reached under lane-dependent control flow

    # ------------------------------------------------------------ uniformity
    def is_uniform(self, e: Any) -> bool:
        return not _has_load(e) and all(any(v.same_as(u) for u in self.uniform) for v in _free_vars(e))

    def constant_value(self, e: Any) -> Any | None:
        if isinstance(e, (tir.IntImm, tir.FloatImm)):
            return e
        if isinstance(e, tir.Var):
            return self.constants.get(e)
        if isinstance(e, tir.Cast) and self.constant_value(e.value) is not None:
            return e
        return None

    # ------------------------------------------------------------ walk
    def visit(self, stmt: Any, uniform: bool) -> None:
        """Collect the rewrite of every store reached only under simdgroup-uniform control flow."""
        if isinstance(stmt, tir.SeqStmt):
            for s in stmt.seq:
                self.visit(s, uniform)
        elif isinstance(stmt, tir.AttrStmt):
            if str(stmt.attr_key) == "thread_extent" and str(stmt.node.thread_tag).startswith("blockIdx"):
                self.uniform.add(stmt.node.var)
            self.visit(stmt.body, uniform)
        elif isinstance(stmt, tir.IfThenElse):
            inner = uniform and self.is_uniform(stmt.condition)
            self.visit(stmt.then_case, inner)
            if stmt.else_case is not None:
                self.visit(stmt.else_case, inner)
        elif isinstance(stmt, tir.For):
            inner = uniform and self.is_uniform(stmt.min) and self.is_uniform(stmt.extent)
            if inner:
                self.uniform.add(stmt.loop_var)
            self.visit(stmt.body, inner)
        elif isinstance(stmt, tir.While):
            self.visit(stmt.body, False)
        elif isinstance(stmt, tir.Bind):
            if self.constant_value(stmt.value) is not None:
                self.constants[stmt.var] = stmt.value
            if uniform and self.is_uniform(stmt.value):
                self.uniform.add(stmt.var)
        elif isinstance(stmt, tir.BufferStore):
            if not uniform:
                self.blocked.add(stmt)
            elif stmt not in self.rewrites:
                form = self.fill(stmt) or self.store(stmt)
                if form is not None:
                    self.rewrites[stmt] = form
        elif hasattr(stmt, "body") and isinstance(getattr(stmt, "body"), tir.Stmt):
            self.visit(stmt.body, uniform)

    def apply(self, body: Any) -> Any:
        chosen = {k: v for k, v in self.rewrites.items() if k not in self.blocked}
        if not chosen:
            return None

        def replace(node: Any) -> Any:
            return chosen.get(node)

        return tvm.tirx.stmt_functor.ir_transform(body, None, replace, [vocab.TIRX_BUFFERSTORE])

    # ------------------------------------------------------------ forms
    def fill(self, stmt: Any) -> Any | None:
        """`X[2f : 2f + 2k] = broadcast(v)` with a constant v -> k make_filled_simdgroup_matrix."""
        if stmt.buffer.data not in self.matrices or not isinstance(stmt.value, tir.Broadcast):
            return None
        index = stmt.indices[-1]
        if not (isinstance(index, tir.Ramp) and isinstance(index.base, tir.IntImm) and _is_one(index.stride)):
            return None
        first, lanes = int(index.base.value), _lanes(index)
        if first % self.per_lane or lanes % self.per_lane or self.constant_value(stmt.value.value) is None:
            return None
        return _seq(
            [
                intrinsics.build_sg_fill(stmt.buffer.data, (first // self.per_lane) + m, stmt.value.value, self.inst.m, self.inst.n)
                for m in range(lanes // self.per_lane)
            ]
        )

    def store(self, stmt: Any) -> Any | None:
        """`mem[base(lane) : +2] = X[2f : 2f + 2]` in the lane map -> simdgroup_store(X[f], ...)."""
        value, index = stmt.value, stmt.indices[-1]
        if stmt.buffer.data not in self.memory or not isinstance(value, tir.BufferLoad) or value.buffer.data not in self.matrices:
            return None
        if str(value.buffer.dtype) != str(stmt.buffer.dtype) or len(stmt.indices) != 1:
            return None
        src = value.indices[-1]
        if not (isinstance(src, tir.Ramp) and isinstance(src.base, tir.IntImm) and _is_one(src.stride) and _lanes(src) == self.per_lane):
            return None
        if not (isinstance(index, tir.Ramp) and _is_one(index.stride) and _lanes(index) == self.per_lane):
            return None
        first = int(src.base.value)
        if first % self.per_lane:
            return None
        placed = self.matrix_placement(index.base)
        if placed is None:
            return None
        base, stride = placed
        address = tir.call_intrin("handle", vocab.TIRX_ADDRESS_OF, tir.BufferLoad(stmt.buffer, [base]))
        return intrinsics.build_sg_store(value.buffer.data, first // self.per_lane, address, stride, self.inst.m, self.inst.n)

    def matrix_placement(self, offset: Any) -> tuple[Any, Any] | None:
        """(base, row stride) when `offset`, the memory position of a lane's first element, is
        `base + row(lane) * stride + col(lane, 0)` for all 32 lanes; None otherwise."""
        simplify = self.analyzer.simplify
        arithmetic = bits_as_arithmetic(offset)  # the analyzer folds // and %, not >> and &
        at = [simplify(_substitute(arithmetic, self.lane, l)) for l in range(SIMD_WIDTH)]
        if self.inst.row(0, 0) != 0 or self.inst.col(0, 0) != 0:
            return None
        row1 = next(l for l in range(SIMD_WIDTH) if self.inst.row(l, 0) == 1 and self.inst.col(l, 0) == 0)
        stride = simplify(at[row1] - at[0])
        if has_division(stride) or not self.analyzer.can_prove(stride >= self.inst.n):
            return None
        for l in range(SIMD_WIDTH):
            if not self.analyzer.can_prove_equal(at[l] - at[0], stride * self.inst.row(l, 0) + self.inst.col(l, 0)):
                return None
        base = simplify(fold_constant_bits(_substitute(offset, self.lane, 0)))
        if any(v.same_as(self.lane) for v in _free_vars(base)):
            return None
        return base, stride


def _lanes(e: Any) -> int:
    return int(e.dtype.lanes) if hasattr(e.dtype, "lanes") else int(str(e.dtype).rsplit("x", 1)[-1])


def _is_one(e: Any) -> bool:
    return isinstance(e, tir.IntImm) and int(e.value) == 1


def _seq(stmts: list[Any]) -> Any:
    return stmts[0] if len(stmts) == 1 else tir.SeqStmt(stmts)


def rewrite_function(func: Any) -> Any:
    attrs = func.attrs or {}
    if LANE_ID_ATTR not in attrs:
        return func
    matrices = _lane_layout_matrices(func.body)
    if not matrices:
        return func
    rewriter = _Rewriter(func, attrs[LANE_ID_ATTR], attrs.get(SIMDGROUP_ID_ATTR), matrices)
    rewriter.visit(func.body, True)
    body = rewriter.apply(func.body)
    return func if body is None else func.with_body(body)


UseSimdgroupMatrixForms = per_function_pass("tilelang_metal.UseSimdgroupMatrixForms", rewrite_function, kernels_only=True)
