"""The typed kernel artifact: what the printer knows about each kernel it printed, carried in the MSL.

tilelang hands an execution backend only what its source module holds (the MSL text; its kernel
cache may even restore a kernel from disk without running codegen), so the printer writes the
records of every kernel into the source itself, as one comment line at the end of the file (after
the kernels, so a reader meets the kernel first):

    // tilelang_metal.artifact v3 {"convention": "standard", "kernels": [...]}

`artifact_of(source)` reads them back as a frozen `KernelArtifact`: per kernel its parameters in
order (device buffers with their index, element type and const-ness, `constant T&` scalars, TVM's
argument struct, position attributes), its threadgroup arrays and pool views with their extents,
its thread arrays (with the lines where each is live) and tile pointers, the cooperative tensors that
hold a metal4 accumulator, its launch limits, the matrix instructions it runs (names of
`isa.REGISTRY`), what its atomics update, whether it calls T.print, and which of its accesses are
stores, predicated or shuffle operands (codegen/access_marks.py; the emulator's counters and race
checker mark them). The printer spells each declaration through the
record's own `msl()`, so text and record cannot disagree; the emulator and the MLX adapter locate
the declarations by that spelling instead of parsing the text. MSL written by hand has no artifact:
`artifact_of` refuses it in one line (`emulator.compile_msl` runs such MSL).

Imports nothing from TVM: readers (the emulator, the adapters) stay light.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any, Union

from ..core.dtypes import DTYPE_OF_MSL

ARTIFACT_VERSION = 4  # 2: access marks; 3: cooperative tensors and live ranges of thread arrays; 4: live ranges as segments (older: compile again)
MARK = "// tilelang_metal.artifact"
_LINE = re.compile(r"^// tilelang_metal\.artifact v(?P<version>\d+) (?P<payload>\{.*\})[ \t]*$", re.MULTILINE)
_ANY_LINE = re.compile(r"^// tilelang_metal\.artifact\b.*$", re.MULTILINE)
_WHOLE_LINE = re.compile(r"^// tilelang_metal\.artifact\b.*(?:\n|$)", re.MULTILINE)

# The two kernel conventions the printer emits (printer.STANDARD / printer.TVM_RUNTIME).
STANDARD, TVM_RUNTIME = "standard", "tvm_runtime"


class ArtifactError(ValueError):
    """A source without a (readable) artifact; the message is one line naming the fix."""


# ---------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class BufferParam:
    """`[const] device T* [__restrict] NAME [[ buffer(i) ]]`."""

    index: int
    name: str
    elem_type: str  # MSL scalar type, e.g. "half"
    is_const: bool  # read-only: the kernel never writes it
    restrict: bool = True

    @property
    def torch_dtype_name(self) -> str:
        return DTYPE_OF_MSL[self.elem_type]

    def describe(self) -> str:
        const = "const " if self.is_const else ""
        return f"parameter '{self.name}' (buffer {self.index}, {const}device {self.elem_type}*)"

    def msl(self) -> str:
        qual = "const device" if self.is_const else "device"
        restrict = " __restrict" if self.restrict else ""
        return f"{qual} {self.elem_type}*{restrict} {self.name} [[ buffer({self.index}) ]]"


@dataclass(frozen=True)
class ScalarParam:
    """`constant T& NAME [[ buffer(i) ]]`: a by-value argument, passed as a pointer to its value."""

    index: int
    name: str
    elem_type: str

    @property
    def torch_dtype_name(self) -> str:
        return DTYPE_OF_MSL[self.elem_type]

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.index}, constant {self.elem_type}&)"

    def msl(self) -> str:
        return f"constant {self.elem_type}& {self.name} [[ buffer({self.index}) ]]"


@dataclass(frozen=True)
class ArgStructParam:
    """`constant S& NAME [[ buffer(i) ]]` with `S` a struct of the file: the argument struct of TVM's
    Metal runtime convention (codegen/tvm_runtime_args.py), one 8-byte slot per member. The caller
    passes its bytes; the driver passes a pointer to them, as the runtime's setBytes does.
    `members`: (scalar name, the dtype TVM's runtime packs it as), in slot order (empty when read
    from hand-written text)."""

    index: int
    name: str
    struct_type: str
    size: int  # bytes
    members: tuple[tuple[str, str], ...] = ()

    @property
    def torch_dtype_name(self) -> str:
        return "uint8"

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.index}, constant {self.struct_type}&, {self.size} bytes)"

    def msl(self) -> str:
        return f"constant {self.struct_type}& {self.name} [[ buffer({self.index}) ]]"


@dataclass(frozen=True)
class PositionParam:
    """`T NAME [[attribute]]`: a hardware position the launcher fills."""

    name: str
    type: str  # uint3, uint, ushort, ...
    attribute: str

    def msl(self) -> str:
        return f"{self.type} {self.name} [[{self.attribute}]]"


Param = Union[BufferParam, ScalarParam, ArgStructParam, PositionParam]
_PARAM_KINDS: dict[str, type] = {"buffer": BufferParam, "scalar": ScalarParam, "args": ArgStructParam, "position": PositionParam}


# ---------------------------------------------------------------------------- declarations in the body
@dataclass(frozen=True)
class ThreadgroupArrayDecl:
    """`threadgroup T NAME[COUNT];` at kernel scope."""

    name: str
    elem_type: str
    count: int

    def msl(self) -> str:
        return f"threadgroup {self.elem_type} {self.name}[{self.count}];"


@dataclass(frozen=True)
class ThreadgroupViewDecl:
    """A typed view into a merged threadgroup pool at kernel scope; `elements`: its own extent when
    the IR declared one (printed as the trailing comment), else None (it ends at the next view)."""

    name: str
    elem_type: str
    pool: str
    offset: str  # byte offset into the pool, as printed
    elements: int | None

    def declaration(self) -> str:
        ty = self.elem_type
        return f"threadgroup {ty}* {self.name} = (threadgroup {ty}*)({self.pool} + {self.offset});"

    def tail(self) -> str:
        return "" if self.elements is None else f"  // {self.elements} elements"

    def msl(self) -> str:
        return self.declaration() + self.tail()


@dataclass(frozen=True)
class ThreadArrayDecl:
    """A thread-private array `[alignas(A) ]T NAME[COUNT];` (fragments, `T.alloc_local`, simdgroup matrices)."""

    name: str
    elem_type: str
    count: int
    align: int = 0
    # (first, last) line segments from the opening line where the array holds a value: its first use
    # to its last, extended to the end of any loop or block entered after the declaration (a value read
    # at the top of a loop is live through the whole loop), cut at if / else arms that do not use it
    # (codegen/liveness.py); None in hand-written MSL
    live: tuple[tuple[int, int], ...] | None = None

    def msl(self) -> str:
        align = f"alignas({self.align}) " if self.align else ""
        return f"{align}{self.elem_type} {self.name}[{self.count}];"


@dataclass(frozen=True)
class CooperativeTensorDecl:
    """`auto NAME_ct0 = ...get_destination_cooperative_tensor<...>()`, ..., `NAME_ct{count-1}`: a
    metal4 accumulator kept in `count` MPP destination tensors of `elements` values per lane each
    (the instruction's `dest_elems`); `live` as ThreadArrayDecl's."""

    name: str
    elem_type: str  # MSL scalar type of the destination (float)
    count: int
    elements: int
    instruction: str  # isa.REGISTRY name
    live: tuple[tuple[int, int], ...] | None = None

    def tensor_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_ct{i}" for i in range(self.count))


@dataclass(frozen=True)
class TilePointerDecl:
    """`[const] device T* NAME = (BUF + (OFF));`: a tile pointer into a device buffer (spec 1.4)."""

    name: str
    elem_type: str
    is_const: bool
    buffer: str

    def prefix(self) -> str:
        """The declaration up to its value (the value is an expression, printed per loop body)."""
        space = "const device" if self.is_const else "device"
        return f"{space} {self.elem_type}* {self.name} = "


# ---------------------------------------------------------------------------- kernel and module
@dataclass(frozen=True)
class KernelRecord:
    """Everything a launcher needs to know about one printed kernel, without reading its text."""

    name: str
    params: tuple[Param, ...]
    block: tuple[int, int, int] | None  # static threads per threadgroup by axis; None when symbolic
    max_total_threads: int | None  # the kernel attribute's bound (the block's product when static)
    threadgroup_arrays: tuple[ThreadgroupArrayDecl, ...] = ()
    threadgroup_views: tuple[ThreadgroupViewDecl, ...] = ()
    thread_arrays: tuple[ThreadArrayDecl, ...] = ()
    cooperative_tensors: tuple[CooperativeTensorDecl, ...] = ()
    tile_pointers: tuple[TilePointerDecl, ...] = ()
    instructions: tuple[str, ...] = ()  # isa.REGISTRY names of the matrix instructions it runs
    prints: bool = False  # calls T.print
    atomic_targets: tuple[str, ...] = ()  # buffers and threadgroup memory its atomics update (sorted names)
    float_atomics: bool = False  # an atomic on float32 / float16 / bfloat16 data
    atomic_results_used: bool = False  # it reads a value an atomic returns (or loads atomically)
    # The accesses the emulator's instrumented flavours mark (codegen/access_marks.py): (line from
    # the opening line, column, name length, kind: "w" store, "p" predicated, "wp", "s" shuffle
    # operand, "ps"); plain loads are not listed. And (line, column of the `{`) of each `if` / `else`
    # block some threads skip (not the threadgroup-uniform ones).
    access_marks: tuple[tuple[int, int, int, str], ...] = ()
    predicated_blocks: tuple[tuple[int, int], ...] = ()

    @property
    def buffers(self) -> tuple[BufferParam, ...]:
        return tuple(p for p in self.params if isinstance(p, BufferParam))

    @property
    def bound(self) -> tuple[BufferParam | ScalarParam | ArgStructParam, ...]:
        """What the caller passes, in [[ buffer(i) ]] order: device buffers, scalar values, argument structs."""
        return tuple(p for p in self.params if not isinstance(p, PositionParam))

    @property
    def positions(self) -> tuple[PositionParam, ...]:
        return tuple(p for p in self.params if isinstance(p, PositionParam))

    def opening(self) -> str:
        """The kernel's first line up to its parameter list, as printed: `[[kernel, ...]] void NAME(`."""
        bound = "" if self.max_total_threads is None else f", max_total_threads_per_threadgroup({self.max_total_threads})"
        return f"[[kernel{bound}]] void {self.name}("


@dataclass(frozen=True)
class KernelArtifact:
    """The records of every kernel of one printed module (sorted by name, as printed)."""

    convention: str  # STANDARD or TVM_RUNTIME
    kernels: tuple[KernelRecord, ...]
    version: int = ARTIFACT_VERSION

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kernels)

    def kernel(self, name: str) -> KernelRecord:
        for k in self.kernels:
            if k.name == name:
                return k
        raise ArtifactError(f"kernel {name} is not in the module's artifact (kernels: {', '.join(self.names) or 'none'})")

    @property
    def prints(self) -> bool:
        return any(k.prints for k in self.kernels)

    def line(self) -> str:
        """The artifact as the one comment line the printer writes at the end of the file."""
        payload = json.dumps(_to_json(self), separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        return f"{MARK} v{self.version} {payload}"


# ---------------------------------------------------------------------------- encoding
_TUPLE_FIELDS = {"params", "threadgroup_arrays", "threadgroup_views", "thread_arrays", "cooperative_tensors", "live", "tile_pointers", "instructions", "kernels", "members", "block",
                 "atomic_targets",
                "access_marks", "predicated_blocks"}


def _to_json(value: Any) -> Any:
    if isinstance(value, (BufferParam, ScalarParam, ArgStructParam, PositionParam)):
        kind = next(k for k, cls in _PARAM_KINDS.items() if isinstance(value, cls))
        return {"kind": kind, **{f.name: _to_json(getattr(value, f.name)) for f in fields(value)}}
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _to_json(getattr(value, f.name)) for f in fields(value) if f.name != "version"}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _record(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ArtifactError(f"{cls.__name__} record has unknown fields {sorted(unknown)}")
    return cls(**{k: (_tuples(v) if k in _TUPLE_FIELDS else v) for k, v in data.items()})


def _param(data: dict[str, Any]) -> Param:
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in _PARAM_KINDS:
        raise ArtifactError(f"parameter record of unknown kind {kind!r}")
    return _record(_PARAM_KINDS[kind], data)


def _kernel(data: dict[str, Any]) -> KernelRecord:
    data = dict(data)
    data["params"] = tuple(_param(p) for p in data.get("params", ()))
    for key, cls in (("threadgroup_arrays", ThreadgroupArrayDecl), ("threadgroup_views", ThreadgroupViewDecl),
                     ("thread_arrays", ThreadArrayDecl), ("cooperative_tensors", CooperativeTensorDecl),
                     ("tile_pointers", TilePointerDecl)):
        data[key] = tuple(_record(cls, d) for d in data.get(key, ()))
    return _record(KernelRecord, data)


def decode(line: str) -> KernelArtifact:
    """The artifact of one artifact comment line (ArtifactError, one line, when it is not one this
    version reads)."""
    m = _LINE.match(line.strip())
    if m is None:
        raise ArtifactError(f"not a tilelang_metal artifact line: {line.strip()[:60]!r}")
    version = int(m.group("version"))
    if version != ARTIFACT_VERSION:
        raise ArtifactError(
            f"the MSL carries a tilelang_metal artifact v{version}, this tilelang_metal reads v{ARTIFACT_VERSION}: "
            "compile the kernel again with this version (or run the MSL through emulator.compile_msl)"
        )
    try:
        data = json.loads(m.group("payload"))
        return KernelArtifact(convention=data["convention"], kernels=tuple(_kernel(k) for k in data["kernels"]))
    except ArtifactError:
        raise
    except (ValueError, KeyError, TypeError) as err:
        raise ArtifactError(f"unreadable tilelang_metal artifact v{version} ({type(err).__name__}: {err}); compile the kernel again") from None


def find_artifact(source: str) -> KernelArtifact | None:
    """The artifact `source` carries, or None when it has no artifact line (hand-written MSL)."""
    m = _ANY_LINE.search(source)
    return None if m is None else decode(m.group(0))


def artifact_of(source: str) -> KernelArtifact:
    """The artifact of MSL the plugin printed; one-line ArtifactError for MSL without one."""
    found = find_artifact(source)
    if found is None:
        first = source.lstrip().split("\n", 1)[0][:60]
        raise ArtifactError(
            f"this MSL carries no tilelang_metal artifact (first line: {first!r}), so it was not printed by tilelang_metal's "
            "codegen; run hand-written MSL with tilelang_metal.emulator.compile_msl"
        )
    return found


def artifact_line_of(source: str) -> str:
    """The artifact comment line of `source`, as written (`artifact_of`'s one-line ArtifactError when
    it has none); `decode` reads it."""
    m = _ANY_LINE.search(source)
    if m is None:
        artifact_of(source)  # raises, naming the source's first line
    return m.group(0)


def strip_artifact(source: str) -> str:
    """`source` without its artifact line (for text that describes other kernels, e.g. MLX's header)."""
    return _WHOLE_LINE.sub("", source, count=1)


__all__ = [
    "ARTIFACT_VERSION", "ArgStructParam", "ArtifactError", "BufferParam", "CooperativeTensorDecl", "KernelArtifact", "KernelRecord", "MARK",
    "Param", "PositionParam", "STANDARD", "ScalarParam", "TVM_RUNTIME", "ThreadArrayDecl", "ThreadgroupArrayDecl",
    "ThreadgroupViewDecl", "TilePointerDecl", "artifact_line_of", "artifact_of", "decode", "find_artifact", "strip_artifact",
]
