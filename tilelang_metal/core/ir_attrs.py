"""The plugin's records on the IR, declared once: attribute keys its passes write and its printer reads.

Passes (`transform/`, `gemm/`, `legalize/`) write these records; `codegen/` reads them. Both import
the keys and readers from here, so the printer depends on no pass module. The plugin's own
intrinsics (calls with operand lists) are declared the same way in `intrinsics.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..host import tir, tvm
from ..target.isa import REGISTRY, MatrixInstruction
from ..host import vocab

# AttrStmt key around an IfThenElse whose condition is the same for every thread of a threadgroup
# (gemm/edge_split.py writes it; the printer comments both branches, the emulator's counters read it).
UNIFORM_BRANCH = "tilelang_metal.threadgroup_uniform"
# Function attribute: position attribute -> MSL parameter name (transform/block_swizzle.py).
POSITION_NAMES_ATTR = "tilelang_metal.position_names"
# AllocBuffer annotation: the printer declares the thread array `alignas(N)` (transform/register_staging.py).
THREAD_ARRAY_ALIGN_ATTR = "tilelang_metal.align_bytes"
# Function attributes: the variables bound to Metal's simdgroup / lane id (transform/simdgroup_indices.py).
SIMDGROUP_ID_ATTR = "tilelang_metal.simdgroup_id"
LANE_ID_ATTR = "tilelang_metal.lane_id"
# Scalar parameters of a device kernel that are tensor dimensions (never negative): transform/power_of_two_division.py
SHAPE_PARAMS_ATTR = "tilelang_metal.shape_params"
# Function attribute: the variables the kernel prelude binds (transform/kernel_prelude.py).
PRELUDE_VARS_ATTR = "tilelang_metal.prelude_vars"
# Function attribute: data var -> encoded MatrixStorage (transform/matrix_storage.py).
MATRIX_STORAGE_ATTR = "tilelang_metal.matrix_storage"

# MatrixStorage.kind: how a per-thread accumulator array is held (the instruction kinds are isa.*_KIND)
SIMDGROUP_MATRIX_STORAGE = "simdgroup"
COOPERATIVE_TENSOR_STORAGE = "cooperative"


@dataclass(frozen=True)
class MatrixStorage:
    """How a per-thread array is stored: an array of simdgroup matrices, or MPP destination tensors."""

    kind: str  # SIMDGROUP_MATRIX_STORAGE | COOPERATIVE_TENSOR_STORAGE
    matrices: int  # simdgroup matrices in the array, or destination fragments
    elided: bool = True  # cooperative only: no backing thread array
    a_dtype: str = ""  # cooperative only: operand element types (they type the destination)
    b_dtype: str = ""
    instruction_name: str = ""  # the key of the instruction whose fragments these are (isa.MatrixInstruction.key)

    @property
    def instruction(self) -> MatrixInstruction:
        return REGISTRY.resolve(self.instruction_name)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.instruction.shape

    def encode(self) -> str:
        return f"{self.kind} {self.matrices} {int(self.elided)} {self.a_dtype or '-'} {self.b_dtype or '-'} {self.instruction_name}"

    @staticmethod
    def decode(text: str) -> MatrixStorage:
        kind, matrices, elided, a, b, name = str(text).split()
        return MatrixStorage(kind, int(matrices), elided == "1", "" if a == "-" else a, "" if b == "-" else b, name)


def storage_of(func: Any) -> dict[Any, MatrixStorage]:
    """The decisions `RecordMatrixStorage` stored on a function (empty when it has no matrices)."""
    attrs = func.attrs
    if attrs is None or MATRIX_STORAGE_ATTR not in attrs:
        return {}
    return {var: MatrixStorage.decode(text) for var, text in attrs[MATRIX_STORAGE_ATTR].items()}


def prelude_vars(func: Any) -> list[Any]:
    """The variables the plugin's passes bound in the kernel prelude (named to be unique)."""
    attrs = func.attrs
    if attrs is None or PRELUDE_VARS_ATTR not in attrs:
        return []
    return list(attrs[PRELUDE_VARS_ATTR])


def find_nodes(stmt: Any, type_keys: list[str]) -> list[Any]:
    """All nodes whose type key is in `type_keys`, in post order. The traversal runs in C++ and
    calls back into Python only for matching nodes (lowering-time budget)."""
    found: list[Any] = []

    def collect(node: Any) -> None:
        found.append(node)
        return None  # keep the node unchanged

    tvm.tirx.stmt_functor.ir_transform(stmt, None, collect, type_keys)
    return found


def declared_element_counts(body: Any) -> dict[Any, int]:
    """Element count of each buffer declared over a data variable (views into merged pools)."""
    out: dict[Any, int] = {}
    for node in find_nodes(body, [vocab.TIRX_DECLBUFFER]):
        count = 1
        for dim in node.buffer.shape:
            if not isinstance(dim, tir.IntImm):
                break
            count *= int(dim.value)
        else:
            out[node.buffer.data] = max(count, out.get(node.buffer.data, 0))
    return out


# Function attribute: the lowering's decisions `python -m tilelang_metal lower --explain` prints, in
# the order they were taken (an array of one-line texts): the shared-staging bypass, register staging
# and K-prefetch turned off for registers, and the plan of every T.gemm.
DECISIONS_ATTR = "tilelang_metal.decisions"
# Function attribute: why the shared-staging bypass kept a T.gemm's staging (for the threadgroup-memory refusal).
STAGING_KEPT_ATTR = "tilelang_metal.staging_kept"
# AttrStmt key around a lowered T.gemm body: the decisions its lowering took (an array of texts); the
# pipeline moves them into DECISIONS_ATTR right after LowerTileOp (`collect_decisions`).
DECISION_MARK = "tilelang_metal.decision"


def with_decisions(func: Any, texts: list[str], key: str = DECISIONS_ATTR) -> Any:
    """`func` with `texts` appended to its decision record `key` (each text once)."""
    if not texts:
        return func
    before = [str(t) for t in func.attrs[key]] if func.attrs is not None and key in func.attrs else []
    return func.with_attr(key, tvm.runtime.convert(list(dict.fromkeys(before + [str(t) for t in texts]))))


def mark_decisions(lowered: Any, texts: list[str]) -> Any:
    """`lowered` (a Stmt, or a PrimFunc whose body LowerTileOp inlines) carrying `texts` as a DECISION_MARK."""
    if not texts:
        return lowered
    if isinstance(lowered, tir.PrimFunc):
        return lowered.with_body(mark_decisions(lowered.body, texts))
    return tir.AttrStmt(tvm.runtime.convert([str(t) for t in texts]), DECISION_MARK, tir.const(0, "int32"), lowered)


def collect_decisions(func: Any) -> Any:
    """Every DECISION_MARK of `func`'s body moved into its DECISIONS_ATTR (in program order), the marks removed."""
    texts: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, tir.AttrStmt) and node.attr_key == DECISION_MARK:
            texts.extend(str(t) for t in node.node)

    tvm.tirx.stmt_functor.pre_order_visit(func.body, lambda node: visit(node) is None)
    if not texts:
        return func

    def strip(node: Any) -> Any:
        return node.body if node.attr_key == DECISION_MARK else None

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, strip, [vocab.TIRX_ATTRSTMT])
    return with_decisions(func.with_body(body), texts)


def decisions_of(funcs: Any) -> list[str]:
    """The decisions recorded on these PrimFuncs (a lowered module's functions), each once."""
    found: list[str] = []
    for func in funcs:
        attrs = getattr(func, "attrs", None)
        if attrs is not None and DECISIONS_ATTR in attrs:
            found += [str(t) for t in attrs[DECISIONS_ATTR]]
    return list(dict.fromkeys(found))
