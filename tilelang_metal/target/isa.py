"""Matrix instructions of Apple GPUs as data, and the registry the compiler picks them from.

A `MatrixInstruction` owns everything the compiler knows about one matrix multiply-accumulate
instruction: its name (also its emulator counter name), its selection kind, its shape (m, n, k),
its three operand roles (left m x k, right k x n, destination m x n), each with a lane map, the MSL
spelling the printer needs, its FLOPs per execution and the target features it requires.
Selection, the GEMM lowering, the matrix-storage pass, the printer, the emulator's counter names
and the roofline read these fields; nothing else writes `16`, `32` or `8` for a fragment.

A lane map is a table of bit fields (`Field`): row and column of element `e` of lane `l` are sums
of `weight * ((source // divisor) % 2**width)` over the fields, and `lane_of` / `elem_of` are the
same table read backwards. Only `//` and `%` appear, so the same tables evaluate on Python ints and
on TIR expressions (tilelang's layout inference accepts floordiv/floormod, not bitwise ops). The
emulator shim writes its own layouts (`shim/tlm/layouts.h`, from the provenance in
docs/lane_layouts.md), so a wrong table here makes the numeric tests fail.

Adding an instruction is a `REGISTRY.register(MatrixInstruction(...))` (see docs/architecture.md for
the emulator side).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

SIMD_WIDTH = 32  # lanes per simdgroup on every Apple GPU

SIMDGROUP_KIND = "metal.simdgroup"
COOPERATIVE_TENSOR_KIND = "metal.cooperative_tensor"

METAL4_FEATURE = "metal4"  # the target key of Metal 4 and the instruction feature it gives: MPP tensor operations

LANE, ELEM = "lane", "elem"  # sources of a forward lane map
ROW, COL = "row", "col"  # sources of an inverse one

_UNBOUNDED = 0  # Field.width: every bit from `divisor` up (no modulus)


@dataclass(frozen=True)
class Field:
    """`weight * ((source // divisor) % 2**width)`: `width` bits of `source` starting at bit
    log2(divisor), placed at bit log2(weight) of the result (width 0: all remaining bits)."""

    source: str
    divisor: int
    weight: int
    width: int = 1

    def evaluate(self, values: dict[str, Any]) -> Any:
        x = values[self.source] // self.divisor
        if self.width != _UNBOUNDED:
            x = x % (1 << self.width)
        return x if self.weight == 1 else self.weight * x


def bits(source: str, low: int, *, at: int, width: int = 1) -> Field:
    """`width` bits of `source` from bit `low`, placed at bit `at` (width 0: all bits from `low`)."""
    return Field(source, 1 << low, 1 << at, width)


def _sum(fields: tuple[Field, ...], values: dict[str, Any]) -> Any:
    terms = [f.evaluate(values) for f in fields]
    total = terms[0] if terms else 0
    for term in terms[1:]:
        total = total + term
    return total


def _log2(x: int) -> int:
    return x.bit_length() - 1


@dataclass(frozen=True)
class LaneMap:
    """Where element `elem` of lane `lane` sits in a fragment: `row` and `col` as bit-field tables of
    the sources `lane` and `elem` (fields of elem bits the fragment does not have are ignored)."""

    row: tuple[Field, ...]
    col: tuple[Field, ...]


@dataclass(frozen=True)
class Operand:
    """One operand role of an instruction: its fragment shape and its lane map."""

    role: str  # "left" | "right" | "destination"
    rows: int
    cols: int
    lane_map: LaneMap

    @property
    def elems(self) -> int:
        """Elements of the fragment each lane holds."""
        return self.rows * self.cols // SIMD_WIDTH

    def _forward(self, table: tuple[Field, ...]) -> tuple[Field, ...]:
        elem_bits = _log2(self.elems)
        return tuple(f for f in table if f.source != ELEM or _log2(f.divisor) < elem_bits)

    def row(self, lane: Any, elem: Any) -> Any:
        return _sum(self._forward(self.lane_map.row), {LANE: lane, ELEM: elem})

    def col(self, lane: Any, elem: Any) -> Any:
        return _sum(self._forward(self.lane_map.col), {LANE: lane, ELEM: elem})

    def _inverse(self, target: str) -> tuple[Field, ...]:
        """The fields of `target` (lane or elem) as functions of row and col, highest bits first. A
        field reading the top bits of its coordinate needs no modulus."""
        out = []
        for coordinate, extent, table in ((ROW, self.rows, self.lane_map.row), (COL, self.cols, self.lane_map.col)):
            for f in self._forward(table):
                if f.source != target:
                    continue
                low = _log2(f.weight)
                source_bits = _log2(SIMD_WIDTH) if f.source == LANE else _log2(self.elems)
                width = f.width or source_bits - _log2(f.divisor)
                top = low + width >= _log2(extent)
                out.append(Field(coordinate, f.weight, f.divisor, _UNBOUNDED if top else width))
        return tuple(sorted(out, key=lambda f: -f.weight))

    def lane_of(self, row: Any, col: Any) -> Any:
        """Inverse of (row, col): which lane holds element (row, col)."""
        return _sum(self._inverse(LANE), {ROW: row, COL: col})

    def elem_of(self, row: Any, col: Any) -> Any:
        """Inverse of (row, col): which of its elements element (row, col) is."""
        return _sum(self._inverse(ELEM), {ROW: row, COL: col})

    @cached_property
    def run(self) -> int:
        """Consecutive columns of one row that a lane holds as consecutive elements (aligned runs
        from element 0): the widest per-lane vector access of the fragment."""
        run = self.elems
        while run > 1:
            if all(
                self.row(lane, e) == self.row(lane, e - e % run) and self.col(lane, e) == self.col(lane, e - e % run) + e % run
                for lane in range(SIMD_WIDTH)
                for e in range(self.elems)
            ):
                return run
            run //= 2
        return 1

    def check(self, name: str) -> None:
        """ValueError unless the map is a bijection between (lane, elem) and the fragment and the
        inverse tables invert it."""
        if self.rows * self.cols != SIMD_WIDTH * self.elems:
            raise ValueError(f"{name} {self.role}: a {self.rows}x{self.cols} fragment is not a whole number of elements per lane")
        seen = set()
        for lane in range(SIMD_WIDTH):
            for e in range(self.elems):
                r, c = self.row(lane, e), self.col(lane, e)
                if not (0 <= r < self.rows and 0 <= c < self.cols) or (r, c) in seen:
                    raise ValueError(f"{name} {self.role}: lane {lane} element {e} maps to ({r}, {c}), outside or taken")
                seen.add((r, c))
                if (self.lane_of(r, c), self.elem_of(r, c)) != (lane, e):
                    raise ValueError(f"{name} {self.role}: lane_of / elem_of do not invert ({lane}, {e}) -> ({r}, {c})")


@dataclass(frozen=True)
class MatrixInstruction:
    """C[m x n] += A[m x k] * B[k x n] on one simdgroup, as data."""

    name: str  # unique; also the emulator counter of its executions
    kind: str  # the selection kind it implements (docs/selection.md)
    m: int
    n: int
    k: int
    left: Operand
    right: Operand
    destination: Operand
    operation: str  # the MSL operation: "matmul2d", "simdgroup_multiply_accumulate", ...
    msl: str  # the printer's spelling: the matmul2d descriptor, or the simdgroup matrix type, as a format string
    requires: frozenset[str] = field(default_factory=frozenset)  # target features (keys)
    selectable: bool = True  # False: only counted (foreign kernels use it), never chosen for a T.gemm
    # Transposed operands read by the operation itself (matmul2d's descriptor flags): the lane map of
    # the *stored* left (k x m) and right (n x k) matrix, None when the operation has no such flag.
    stored_left_map: LaneMap | None = None
    stored_right_map: LaneMap | None = None
    transpose_left: bool = False  # this variant reads op(left) = left^T: its left role is the stored k x m matrix
    transpose_right: bool = False  # likewise, its right role is the stored n x k matrix

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def counter(self) -> str:
        return self.name  # a transposed variant counts as its registered instruction

    @property
    def key(self) -> str:
        """What a matrix call and a storage decision name: the registered name, plus `:tn`-style
        transposes (left, right) for a transposed variant (`Registry.resolve` reads it back)."""
        if not (self.transpose_left or self.transpose_right):
            return self.name
        return f"{self.name}:{'t' if self.transpose_left else 'n'}{'t' if self.transpose_right else 'n'}"

    def can_transpose(self, left: bool, right: bool) -> bool:
        """True when the operation itself reads these operands transposed (descriptor flags)."""
        return (not left or self.stored_left_map is not None) and (not right or self.stored_right_map is not None)

    def transposed(self, left: bool, right: bool) -> MatrixInstruction:
        """This instruction computing op(left) * op(right), op = transpose where asked: a transposed
        role holds the stored matrix (left k x m, right n x k) in its stored lane map, so a lane
        gathers runs that are contiguous in the operand's storage (docs/lane_layouts.md section 2b).
        The destination does not change."""
        if self.transpose_left or self.transpose_right:
            raise ValueError(f"{self.key} is already a transposed variant; transpose the registered {self.name}")
        if not self.can_transpose(left, right):
            raise ValueError(f"{self.name} cannot read a transposed {'left' if left else 'right'} operand (no descriptor flag)")
        lhs = Operand("left", self.k, self.m, self.stored_left_map) if left else self.left
        rhs = Operand("right", self.n, self.k, self.stored_right_map) if right else self.right
        return replace(self, left=lhs, right=rhs, transpose_left=left, transpose_right=right)

    @property
    def flops(self) -> int:
        """FLOPs of one execution (a multiply and an add per product term)."""
        return 2 * self.m * self.n * self.k

    @property
    def left_elems(self) -> int:
        return self.left.elems

    @property
    def right_elems(self) -> int:
        return self.right.elems

    @property
    def dest_elems(self) -> int:
        return self.destination.elems

    @property
    def run(self) -> int:
        """The run width every role shares (the GEMM lowering gathers operands in runs of it)."""
        return min(self.left.run, self.right.run, self.destination.run)

    # The destination's lane maps (an operand's sub-blocks use its own role's map).
    def row(self, lane: Any, elem: Any) -> Any:
        return self.destination.row(lane, elem)

    def col(self, lane: Any, elem: Any) -> Any:
        return self.destination.col(lane, elem)

    def lane_of(self, row: Any, col: Any) -> Any:
        return self.destination.lane_of(row, col)

    def elem_of(self, row: Any, col: Any) -> Any:
        return self.destination.elem_of(row, col)

    def check(self) -> None:
        shapes = {
            "left": (self.k, self.m) if self.transpose_left else (self.m, self.k),
            "right": (self.n, self.k) if self.transpose_right else (self.k, self.n),
            "destination": (self.m, self.n),
        }
        for role, op in (("left", self.left), ("right", self.right), ("destination", self.destination)):
            if op.role != role or (op.rows, op.cols) != shapes[role]:
                raise ValueError(f"{self.name}: the {role} operand must be {shapes[role][0]}x{shapes[role][1]}, got {op.role} {op.rows}x{op.cols}")
            op.check(self.name)
        if not (self.transpose_left or self.transpose_right):  # the stored maps too, one role at a time
            for left, right in ((True, False), (False, True)):
                if self.can_transpose(left, right):
                    self.transposed(left, right).check()


def roles(m: int, n: int, k: int, left: LaneMap, right: LaneMap | None = None, destination: LaneMap | None = None) -> dict[str, Operand]:
    """The three operand roles of an m x n x k instruction (right and destination default to the left's map)."""
    return {
        "left": Operand("left", m, k, left),
        "right": Operand("right", k, n, right or left),
        "destination": Operand("destination", m, n, destination or left),
    }


# ---------------------------------------------------------------- simdgroup_matrix<T, 8, 8>
# thread_elements(): two horizontally adjacent elements per lane; A, B and C share the map.
SIMDGROUP_8x8_MAP = LaneMap(
    row=(bits(LANE, 4, at=2), bits(LANE, 2, at=1), bits(LANE, 1, at=0)),
    col=(bits(LANE, 3, at=2), bits(LANE, 0, at=1), bits(ELEM, 0, at=0, width=0)),
)

# ---------------------------------------------------------------- MPP cooperative tensors
# matmul2d(16, 32, 16): left 16x16, right and destination 16x32. Lane l owns runs of 4 consecutive
# columns; element e picks the run: +8 rows for bit 2 of e, +16 columns for bit 3 of e.
MATMUL2D_16x32_MAP = LaneMap(
    row=(bits(LANE, 4, at=2), bits(LANE, 2, at=1), bits(LANE, 1, at=0), bits(ELEM, 2, at=3)),
    col=(bits(ELEM, 3, at=4, width=0), bits(LANE, 3, at=3), bits(LANE, 0, at=2), bits(ELEM, 0, at=0, width=2)),
)

# A transposed operand's tensor holds the stored matrix (docs/lane_layouts.md section 2b, as MLX's NAX
# kernels use it): the 16x16 formula over 16x16 blocks of it, block `e >> 3` along N. So the stored
# K x M left input keeps the map above, and the stored N x K right input moves `e >> 3` to its rows.
MATMUL2D_16x32_STORED_RIGHT_MAP = LaneMap(
    row=(bits(ELEM, 3, at=4, width=0), bits(LANE, 4, at=2), bits(ELEM, 2, at=3), bits(LANE, 2, at=1), bits(LANE, 1, at=0)),
    col=(bits(LANE, 3, at=3), bits(LANE, 0, at=2), bits(ELEM, 0, at=0, width=2)),
)

_MATMUL2D_DESCRIPTOR = (
    "mpp::tensor_ops::matmul2d_descriptor({m}, {n}, {k}, {transpose_left}, {transpose_right}, {relaxed}, "
    "mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate)"
)
_SIMDGROUP_TYPE = "simdgroup_{scalar}{rows}x{cols}"


def matmul2d(m: int, n: int, k: int, left: LaneMap, right: LaneMap | None = None, destination: LaneMap | None = None,
             *, stored_left: LaneMap | None = None, stored_right: LaneMap | None = None,
             requires: Iterable[str] = (METAL4_FEATURE,), selectable: bool = True) -> MatrixInstruction:
    """An MPP matmul2d instruction (multiply_accumulate); `stored_left` / `stored_right` are the lane
    maps of transposed operands (the descriptor's transpose flags), None where not known."""
    return MatrixInstruction(
        f"matmul2d_{m}x{n}x{k}", COOPERATIVE_TENSOR_KIND, m, n, k, **roles(m, n, k, left, right, destination),
        operation="matmul2d", msl=_MATMUL2D_DESCRIPTOR, requires=frozenset(requires), selectable=selectable,
        stored_left_map=stored_left, stored_right_map=stored_right,
    )


def simdgroup_matrix_op(operation: str, *, selectable: bool) -> MatrixInstruction:
    """A simdgroup_matrix<T, 8, 8> operation (8x8 is the only shape MSL has)."""
    return MatrixInstruction(
        f"{operation}_8x8x8", SIMDGROUP_KIND, 8, 8, 8, **roles(8, 8, 8, SIMDGROUP_8x8_MAP),
        operation=operation, msl=_SIMDGROUP_TYPE, selectable=selectable,
    )


MATMUL2D_16x32x16 = matmul2d(16, 32, 16, MATMUL2D_16x32_MAP, stored_left=MATMUL2D_16x32_MAP, stored_right=MATMUL2D_16x32_STORED_RIGHT_MAP)
SIMDGROUP_8x8x8 = simdgroup_matrix_op("simdgroup_multiply_accumulate", selectable=True)
SIMDGROUP_MULTIPLY_8x8x8 = simdgroup_matrix_op("simdgroup_multiply", selectable=False)  # foreign kernels only


class Registry:
    """The known instructions, in preference order (selection takes the first that fits)."""

    def __init__(self, instructions: Iterable[MatrixInstruction]):
        self._instructions: list[MatrixInstruction] = []
        for inst in instructions:
            self.register(inst)

    def __iter__(self) -> Iterator[MatrixInstruction]:
        return iter(list(self._instructions))

    def register(self, inst: MatrixInstruction, *, first: bool = False) -> MatrixInstruction:
        """Add `inst` (checked: shapes, bijective lane maps); `first` makes it the preferred one."""
        if any(other.name == inst.name for other in self._instructions):
            raise ValueError(f"a matrix instruction named {inst.name} is already registered")
        inst.check()
        self._instructions.insert(0 if first else len(self._instructions), inst)
        return inst

    def unregister(self, name: str) -> None:
        self._instructions.remove(self.named(name))

    @contextlib.contextmanager
    def registered(self, inst: MatrixInstruction, *, first: bool = False) -> Iterator[MatrixInstruction]:
        """`inst` is registered while the block runs (tests, experiments)."""
        self.register(inst, first=first)
        try:
            yield inst
        finally:
            self.unregister(inst.name)

    @contextlib.contextmanager
    def substituted(self, inst: MatrixInstruction) -> Iterator[MatrixInstruction]:
        """`inst` stands in for the registered instruction of the same name while the block runs
        (the lane-layout mutation tests give an instruction a wrong lane map this way)."""
        old = self.named(inst.name)
        inst.check()
        at = self._instructions.index(old)
        self._instructions[at] = inst
        try:
            yield inst
        finally:
            self._instructions[self._instructions.index(inst)] = old

    def named(self, name: str) -> MatrixInstruction:
        for inst in self._instructions:
            if inst.name == name:
                return inst
        raise KeyError(f"no matrix instruction named {name}")

    def resolve(self, key: str) -> MatrixInstruction:
        """The instruction a `MatrixInstruction.key` names: a registered one, or its transposed variant."""
        name, _, flags = key.partition(":")
        inst = self.named(name)
        if not flags:
            return inst
        if len(flags) != 2 or set(flags) - {"n", "t"}:
            raise KeyError(f"bad matrix instruction key {key}: transposes are two of n/t, as in {name}:nt")
        return inst.transposed(flags[0] == "t", flags[1] == "t")

    def available(self, features: Iterable[str]) -> list[MatrixInstruction]:
        """The selectable instructions a target with these features (keys) has, in preference order."""
        have = set(features)
        return [inst for inst in self._instructions if inst.selectable and inst.requires <= have]

    def of_kind(self, kind: str, features: Iterable[str]) -> list[MatrixInstruction]:
        return [inst for inst in self.available(features) if inst.kind == kind]

    def simdgroup_matrix(self, rows: int = 8, cols: int = 8) -> MatrixInstruction:
        """The simdgroup multiply-accumulate on `rows x cols` matrices (what a simdgroup builtin's
        matrices are, as the IR names only their shape)."""
        for inst in self._instructions:
            if inst.kind == SIMDGROUP_KIND and inst.selectable and (inst.m, inst.n) == (rows, cols):
                return inst
        raise KeyError(f"no simdgroup matrix instruction of shape {rows}x{cols}")


REGISTRY = Registry((MATMUL2D_16x32x16, SIMDGROUP_8x8x8, SIMDGROUP_MULTIPLY_8x8x8))
# The instructions the emulator runtime counts, in the order of its counter rows (shim/tlm/runtime_api.h).
COUNTED = tuple(REGISTRY)
