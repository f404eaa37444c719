"""One `T.gemm` call as the Metal lowering sees it: operands, tile shape, addressing and edges.

`GemmProblem.from_node` reads tilelang's Gemm tile-op node once and validates it; every bad input
raises `GemmLoweringError` naming the problem and the fix, at lower time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..host import gemm_node_view, tir, tvm
from ..errors import GemmLoweringError
from ..core.scopes import FRAGMENT_SCOPES, GLOBAL_SCOPES, SHARED_SCOPES, SIMDGROUP_SCOPES
from ..host import vocab
INPUT_DTYPES = ("float16", "bfloat16", "float32")
OUTPUT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Operand:
    """A 2-D tile view of `buffer` (storage order): rows along dim `row_axis`, columns along the last
    dim, every other dim fixed at its index in `lead` (batch / pipeline-stage dims before the rows,
    and unit dims between rows and columns, as in `X[b, r0:r0+bm, g, c0:c0+bk]` of a (B, L, G, D)
    tensor)."""

    name: str
    buffer: Any
    lead: tuple  # indices of the dims other than the row and column dims, in storage order
    row0: Any
    col0: Any
    rows: int
    cols: int
    remapped: bool = False  # storage follows an annotated layout: element accesses only (see lower())
    row_axis: int = -2  # the dim the rows run along (negative: from the end)

    @property
    def scope(self) -> str:
        return str(self.buffer.scope())

    @property
    def dtype(self) -> str:
        return str(self.buffer.dtype)

    @property
    def row_extent(self) -> Any:
        return self.buffer.shape[self.row_axis]

    @property
    def col_extent(self) -> Any:
        return self.buffer.shape[-1]

    @property
    def row_stride(self) -> Any:
        if self.buffer.strides:
            return self.buffer.strides[self.row_axis]
        stride = self.buffer.shape[-1]
        for dim in list(self.buffer.shape)[self.row_axis + 1 : -1]:  # unit dims between rows and columns
            stride = stride * dim
        return stride

    def _indices(self, row: Any, col_index: Any) -> list:
        fixed = list(self.lead)
        row_at = len(self.buffer.shape) + self.row_axis
        return [*fixed[:row_at], self.row0 + row, *fixed[row_at:], col_index]

    def indices(self, row: Any, col: Any) -> list:
        return self._indices(row, self.col0 + col)

    def load(self, row: Any, col: Any, lanes: int = 1) -> Any:
        col_index = self.col0 + col
        if lanes > 1:
            col_index = tir.Ramp(col_index, 1, lanes)
        return tir.BufferLoad(self.buffer, self._indices(row, col_index))

    def store(self, value: Any, row: Any, col: Any, lanes: int = 1) -> Any:
        col_index = self.col0 + col
        if lanes > 1:
            col_index = tir.Ramp(col_index, 1, lanes)
        return tir.BufferStore(self.buffer, value, self._indices(row, col_index))

    def address(self, row: Any, col: Any, access: str = "r") -> Any:
        """Pointer to element (row, col) as a `tvm_access_ptr`, so passes see read vs. write intent
        (a read-only device buffer keeps its `const`)."""
        buf = self.buffer
        flat = buf.offset_of(self.indices(row, col))[-1]
        extent = buf.shape[-1] if len(buf.shape) == 1 else self.rows * self.row_stride
        mask = {"r": 1, "w": 2, "rw": 3}[access]
        return tir.call_intrin(
            "handle", vocab.TIRX_TVM_ACCESS_PTR, tir.type_annotation(buf.dtype), buf.data, flat, extent, tir.const(mask, "int32")
        )

    def vector_aligned(self, row: Any, col: Any, lanes: int, analyzer: Any) -> bool:
        """True when the storage offset of element (row, col) is provably a multiple of `lanes` for
        every thread and block, the buffer's own element offset included: a `T4` access needs
        4-element alignment (a row stride of 65, a view starting at column 2, a 64x33 padded tile
        are not)."""
        buf = self.buffer
        flat = buf.offset_of(self.indices(row, col))[-1] + buf.elem_offset
        residue = analyzer.modular_set(flat)
        return residue.coeff % lanes == 0 and residue.base % lanes == 0

    def in_bounds(self, row: Any, col: Any, analyzer: Any) -> Any | None:
        """Condition that (row, col) of the tile lies inside the buffer; None when provably always."""
        conds = []
        # inside the tile (K-edge steps overshoot it) ...
        if not provably_below(analyzer, row, self.rows):
            conds.append(row < self.rows)
        if not provably_below(analyzer, col, self.cols):
            conds.append(col < self.cols)
        # ... and inside the buffer (edge tiles overshoot it)
        r = self.row0 + row
        c = self.col0 + col
        if not provably_below(analyzer, r, self.row_extent):
            conds.append(r < self.row_extent)
        if not provably_below(analyzer, c, self.col_extent):
            conds.append(c < self.col_extent)
        if not conds:
            return None
        out = conds[0]
        for cond in conds[1:]:
            out = tir.And(out, cond)
        return out


def const_int(x: Any) -> int | None:
    if isinstance(x, int):
        return x
    if isinstance(x, tir.IntImm):
        return int(x.value)
    return None


def provably_below(analyzer: Any, expr: Any, bound: Any) -> bool:
    """expr < bound for every value of expr's variables, by interval bounds only (cheap, no search)."""
    limit = const_int(bound)
    if limit is None:
        return False
    value = const_int(expr)
    if value is not None:
        return value < limit
    return analyzer.const_int_bound(expr).max_value < limit


def _int(x: Any, what: str) -> int:
    value = const_int(x)
    if value is not None:
        return value
    raise GemmLoweringError(f"{what} must be a compile-time constant on Metal, got {x}. Use static tile sizes.")


def _view_refusal(buf: Any, dims: list) -> str | None:
    """Why the region `dims` (Ranges) of `buf` is not a 2-D tile Metal GEMM can read, or None."""
    if len(dims) < 2:
        return f"must be at least 2-D, got shape {list(buf.shape)}"
    if buf.strides and not tvm.arith.Analyzer().can_prove_equal(buf.strides[-1], 1):
        return (
            f"has innermost stride {buf.strides[-1]}; Metal GEMM needs a contiguous innermost dimension (stride 1). "
            "Pass a contiguous tensor or copy it to shared memory first."
        )
    if any(not _is_unit(r.extent) for r in dims[: _row_axis(dims)]):
        return (
            f"must be a 2-D tile: the region's extents {[str(r.extent) for r in dims]} have more than two dims "
            "other than 1. Pass one 2-D tile (a single index in every other dim)."
        )
    return None


def _operand(name: str, region: Any) -> Operand:
    buf = region.buffer
    dims = list(region.region)
    refusal = _view_refusal(buf, dims)
    if refusal is not None:
        raise GemmLoweringError(f"T.gemm operand {name} ({buf.name}) {refusal}")
    row_axis = _row_axis(dims)
    lead = tuple(r.min for i, r in enumerate(dims[:-1]) if i != row_axis)
    rows = _int(dims[row_axis].extent, f"{name} tile rows")
    cols = _int(dims[-1].extent, f"{name} tile cols")
    return Operand(name, buf, lead, dims[row_axis].min, dims[-1].min, rows, cols, row_axis=row_axis - len(dims))


def _is_unit(extent: Any) -> bool:
    return isinstance(extent, tir.IntImm) and int(extent.value) == 1


def _row_axis(dims: list) -> int:
    """The dim of a tile region the rows run along: the last one before the column dim whose extent is
    not 1 (unit dims may sit between rows and columns), the one just before the columns when all are 1."""
    for axis in range(len(dims) - 2, -1, -1):
        if not _is_unit(dims[axis].extent):
            return axis
    return len(dims) - 2


def tile_view_refusal(buffer: Any, mins: list, extents: list) -> str | None:
    """Why `buffer[mins : mins + extents]` cannot be a T.gemm operand read in place (the check
    `GemmProblem` makes), or None when it can: for passes that put such a view into a T.gemm in
    place of the operand the user passed."""
    extents = [1] * (len(mins) - len(extents)) + list(extents)  # a region may leave leading unit dims implied
    return _view_refusal(buffer, [tvm.ir.Range.from_min_extent(m, e) for m, e in zip(mins, extents)])


def _cast_advice(op: Operand, dtype: str) -> str:
    """How to give operand `op` the dtype `dtype`, for the scope it is in."""
    buf = op.buffer.name
    if op.scope in SHARED_SCOPES:
        return f"cast {op.name} to {dtype}: declare {buf} with T.alloc_shared(..., \"{dtype}\") (the T.copy that fills it casts)"
    if op.scope in FRAGMENT_SCOPES:
        return f"cast {op.name} to {dtype}: T.copy {buf} into a T.alloc_fragment(..., \"{dtype}\") of the same shape (T.copy casts) and pass that"
    return (
        f"cast {op.name} to {dtype}: declare {buf} as T.Tensor(..., \"{dtype}\") and convert the data before the call, "
        f"or stage both tiles with T.copy into T.alloc_shared(..., \"{dtype}\") buffers (T.copy casts)"
    )


def _dtype_fix(A: Operand, B: Operand) -> str:
    """The cast that makes the two operands of one T.gemm agree: a float32 operand goes down to the
    other's 16-bit dtype (that operand already bounds the precision, and 16-bit inputs run the faster
    matrix path); float16 with bfloat16 goes to float32, the one dtype both convert to exactly."""
    if A.dtype == "float32":
        return f"{_cast_advice(A, B.dtype)}, or cast B to float32 (exact, slower)"
    if B.dtype == "float32":
        return f"{_cast_advice(B, A.dtype)}, or cast A to float32 (exact, slower)"
    return f"{_cast_advice(A, 'float32')}; {_cast_advice(B, 'float32')}"


@dataclass(frozen=True)
class GemmProblem:
    A: Operand
    B: Operand
    C: Operand
    M: int
    N: int
    K: int
    trans_A: bool
    trans_B: bool
    clear_accum: Any  # bool or PrimExpr
    policy: int

    @property
    def c_scope(self) -> str:
        return self.C.scope

    def with_storage_layouts(self, is_remapped: Any) -> GemmProblem:
        """The problem with each operand marked when `is_remapped(buffer)` says its storage follows a
        layout other than row-major (an annotated shared layout): LowerTileOp rewrites the element
        accesses of such a buffer through its layout, but not vector accesses or matrix loads from
        an address, so those operands are read and written element by element."""
        marked = [
            replace(op, remapped=op.scope in GLOBAL_SCOPES + SHARED_SCOPES and bool(is_remapped(op.buffer))) for op in (self.A, self.B, self.C)
        ]
        return replace(self, A=marked[0], B=marked[1], C=marked[2])

    @staticmethod
    def from_node(node: Any) -> GemmProblem:
        v = gemm_node_view(node)
        A = _operand("A", v.a_region)
        B = _operand("B", v.b_region)
        C = _operand("C", v.c_region)
        problem = GemmProblem(A, B, C, v.m, v.n, v.k, v.trans_a, v.trans_b, v.clear_accum, v.policy)
        problem.validate()
        return problem

    def validate(self) -> None:
        A, B, C = self.A, self.B, self.C
        for op in (A, B):
            if op.dtype not in INPUT_DTYPES:
                raise GemmLoweringError(
                    f"T.gemm operand {op.name} ({op.buffer.name}) has dtype {op.dtype}; Metal GEMM supports "
                    f"{', '.join(INPUT_DTYPES)} inputs. Cast the operand first."
                )
        if A.dtype != B.dtype:
            raise GemmLoweringError(f"T.gemm needs A and B of the same dtype on Metal, got A={A.dtype}, B={B.dtype}: {_dtype_fix(A, B)}")
        if C.dtype not in OUTPUT_DTYPES:
            raise GemmLoweringError(
                f"T.gemm output C ({C.buffer.name}) has dtype {C.dtype}; Metal GEMM accumulates in float32 and "
                f"stores {', '.join(OUTPUT_DTYPES)}."
            )
        if A.scope in GLOBAL_SCOPES and B.scope in GLOBAL_SCOPES:
            pass
        elif A.scope in SHARED_SCOPES and B.scope in SHARED_SCOPES:
            pass
        elif A.scope in FRAGMENT_SCOPES and B.scope in SHARED_SCOPES + GLOBAL_SCOPES:
            pass  # register A (attention's P.V): gemm/register_operand.py
        else:
            raise GemmLoweringError(
                f"unsupported T.gemm operand scopes: A is {A.scope}, B is {B.scope}. Metal GEMM takes both A and B "
                "from global memory (direct-global), both from shared memory (T.alloc_shared + T.copy), or A from "
                "a register fragment (T.alloc_fragment) with B in shared or global memory."
            )
        if C.scope not in GLOBAL_SCOPES + SHARED_SCOPES + FRAGMENT_SCOPES + SIMDGROUP_SCOPES:
            raise GemmLoweringError(
                f"T.gemm output C ({C.buffer.name}) is in scope {C.scope}; use global, shared, local.fragment "
                "(T.alloc_fragment) or metal.simdgroup."
            )
        a_m, a_k = (A.cols, A.rows) if self.trans_A else (A.rows, A.cols)
        b_k, b_n = (B.cols, B.rows) if self.trans_B else (B.rows, B.cols)
        if (a_m, a_k, b_k, b_n, C.rows, C.cols) != (self.M, self.K, self.K, self.N, self.M, self.N):
            raise GemmLoweringError(
                f"T.gemm tile shapes disagree: A is {a_m}x{a_k}, B is {b_k}x{b_n}, C is {C.rows}x{C.cols} "
                f"(M={self.M}, N={self.N}, K={self.K})"
            )
        if C.scope in FRAGMENT_SCOPES + SIMDGROUP_SCOPES:
            if C.rows != int(C.row_extent) or C.cols != int(C.col_extent):
                raise GemmLoweringError(
                    f"T.gemm accumulator {C.buffer.name} must be used as a whole ({list(C.buffer.shape)}), "
                    f"got a {C.rows}x{C.cols} region"
                )
