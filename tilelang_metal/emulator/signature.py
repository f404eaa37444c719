"""The kernel signature and the source rewrites that precede compilation.

MSL the plugin printed carries its artifact (codegen/artifact.py): the records of every parameter,
threadgroup array, pool view, thread array and tile pointer. The rewrites are driven by those
records: each declaration is found by the record's own spelling (what the printer wrote through it)
and replaced; text that does not match its record is refused. Nothing here parses MSL: hand-written
MSL gets its records from the front door first (handwritten.py), and MSL without an artifact is
refused. The rewrites keep every line where it was, so compiler diagnostics point at the original
MSL lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..codegen.artifact import (
    ArgStructParam,
    BufferParam,
    KernelArtifact,
    KernelRecord,
    PositionParam,
    ScalarParam,
    ThreadgroupViewDecl,
    find_artifact,
)
from ..core.dtypes import DTYPE_OF_MSL, msl_type_bytes
from ..target.limits import BUFFER_ARGUMENT_SLOTS

from ..codegen.kernel_text import matching_bracket
from .mark_insertion import apply_marks
from .errors import EmulatorCompileError

def check_buffer_slots(where: str, indices: Sequence[int]) -> None:
    """Refuse a [[ buffer(i) ]] past Metal's buffer argument table (limits.BUFFER_ARGUMENT_SLOTS):
    a Mac cannot compile the kernel, so the emulator does not run it either."""
    beyond = sorted(i for i in indices if i >= BUFFER_ARGUMENT_SLOTS)
    if beyond:
        raise EmulatorCompileError(
            f"{where} binds [[ buffer({beyond[-1]}) ]] ({len(indices)} buffer slots); Metal has {BUFFER_ARGUMENT_SLOTS} per kernel "
            f"(indices 0-{BUFFER_ARGUMENT_SLOTS - 1}), so a Mac cannot compile it: pass fewer tensors or scalars"
        )


# attribute -> (lane_info field expression per component, number of components)
POSITION_ATTRIBUTES: dict[str, tuple[tuple[str, ...], int]] = {
    "threadgroup_position_in_grid": (("__li.tg[0]", "__li.tg[1]", "__li.tg[2]"), 3),
    "threadgroups_per_grid": (("__li.grid[0]", "__li.grid[1]", "__li.grid[2]"), 3),
    "thread_position_in_threadgroup": (("__li.tid[0]", "__li.tid[1]", "__li.tid[2]"), 3),
    "threads_per_threadgroup": (("__li.block[0]", "__li.block[1]", "__li.block[2]"), 3),
    "thread_position_in_grid": (
        tuple(f"(__li.tg[{d}] * __li.block[{d}] + __li.tid[{d}])" for d in range(3)),
        3,
    ),
    "threads_per_grid": (tuple(f"(__li.grid[{d}] * __li.block[{d}])" for d in range(3)), 3),
    "thread_index_in_threadgroup": (("__li.linear",), 1),
    "simdgroup_index_in_threadgroup": (("__li.simd_group",), 1),
    "thread_index_in_simdgroup": (("__li.lane",), 1),
    "simdgroups_per_threadgroup": (("__li.simd_groups",), 1),
    "threads_per_simdgroup": (("32u",), 1),
}

_POSITION_TYPES = {"uint", "ushort", "int", "short"}


@dataclass(frozen=True)
class ThreadgroupArray:
    slot: int
    name: str
    elem_type: str
    count: str  # C++ expression as written
    line: int  # 1-based


@dataclass(frozen=True)
class ThreadgroupView:
    """A typed view into a merged threadgroup pool; its extent ends at the next view (or the pool end)."""

    name: str
    elem_type: str
    pool: str
    offset: str  # byte offset, C++ expression as written
    end: int | None  # byte offset of the next view in the pool; None = the end of the pool
    line: int


def _int_literal(text: str) -> int | None:
    t = text.strip()
    while t.startswith("(") and t.endswith(")"):
        t = t[1:-1].strip()
    return int(t) if re.fullmatch(r"\d+", t) else None


@dataclass(frozen=True)
class ThreadArray:
    """A thread-private array declared in the kernel body (lives on the GPU thread's fiber stack)."""

    name: str
    elem_type: str
    count: int
    bytes: int
    line: int


@dataclass(frozen=True)
class KernelSignature:
    name: str
    cxx_name: str  # the function name in the compiled C++ (differs only for `main`)
    params: tuple[BufferParam | ScalarParam | ArgStructParam | PositionParam, ...]
    max_total_threads: int | None
    threadgroup_arrays: tuple[ThreadgroupArray, ...]
    threadgroup_views: tuple[ThreadgroupView, ...] = ()
    thread_arrays: tuple[ThreadArray, ...] = ()
    line: int = 1  # 1-based line of the kernel's opening (what comes before is the file's header)
    record: KernelRecord | None = field(default=None, compare=False)  # its artifact record

    @property
    def thread_array_bytes(self) -> int:
        """Upper bound of the thread-private arrays' stack use (all of them, as if live at once)."""
        return sum(a.bytes for a in self.thread_arrays)

    @property
    def buffers(self) -> tuple[BufferParam, ...]:
        return tuple(p for p in self.params if isinstance(p, BufferParam))

    @property
    def bound(self) -> tuple[BufferParam | ScalarParam | ArgStructParam, ...]:
        """What the caller passes, in [[ buffer(i) ]] order: device buffers, scalar values, argument structs."""
        return tuple(p for p in self.params if isinstance(p, (BufferParam, ScalarParam, ArgStructParam)))


def _fail(msg: str, source: str, line: int | None = None) -> EmulatorCompileError:
    if line is not None:
        lines = source.splitlines()
        if 1 <= line <= len(lines):
            msg += f"\n  {line:5d} | {lines[line - 1]}"
    return EmulatorCompileError(msg)


def _line_of(source: str, pos: int) -> int:
    return source.count("\n", 0, pos) + 1


def _matching_paren(source: str, open_pos: int) -> int:
    close = matching_bracket(source, open_pos)
    if close is None:
        raise EmulatorCompileError("kernel signature: unbalanced parentheses")
    return close


@dataclass(frozen=True)
class RewrittenSource:
    signature: KernelSignature
    text: str  # same number of lines as the input, kernel part rewritten
    record: KernelRecord


INSTRUMENTS = ("counters", "racecheck")

Param = BufferParam | ScalarParam | ArgStructParam | PositionParam
_Edit = tuple[int, int, str]  # (start, end, replacement) on the original source


@dataclass(frozen=True)
class _KernelHeader:
    """The kernel's name, attribute and parameter-list span, and the edits to its declaration line."""

    name: str
    cxx_name: str  # `main` is reserved in C++
    max_total_threads: int | None
    open_pos: int  # the parameter list's `(`
    close_pos: int  # its matching `)`
    edits: tuple[_Edit, ...]
    line: int  # 1-based line of the opening


@dataclass
class _BodyDeclarations:
    """What the body declares (arrays, pool views) and the edits rewriting those declarations."""

    threadgroup_arrays: list[ThreadgroupArray] = field(default_factory=list)
    threadgroup_views: list[ThreadgroupView] = field(default_factory=list)
    thread_arrays: list[ThreadArray] = field(default_factory=list)
    decl_lines: set[int] = field(default_factory=set)  # 1-based lines holding a declaration
    tracked_locals: set[str] = field(default_factory=set)  # thread arrays racecheck tracks
    device_pointers: set[str] = field(default_factory=set)  # tile pointers into device buffers
    edits: list[_Edit] = field(default_factory=list)


def rewrite(msl: str, *, checked: bool, instrument: str | None = None) -> RewrittenSource:
    """Parse the kernel signature and rewrite buffer parameters and threadgroup declarations.

    `instrument` ("counters" / "racecheck", checked builds only) also marks stores and predicated
    accesses where the record says (mark_insertion.py); racecheck turns thread arrays into `tlm::local_array`s."""
    if instrument is not None and (instrument not in INSTRUMENTS or not checked):
        raise ValueError(f"instrument must be one of {INSTRUMENTS} on a checked build, got {instrument!r}")
    racecheck = instrument == "racecheck"
    artifact = _artifact(msl)
    if artifact is None:
        raise EmulatorCompileError(
            "this MSL carries no tilelang_metal artifact: compile_kernel reads hand-written MSL through the front "
            "door (emulator.handwritten.with_artifact) first; free-form MSL runs with emulator.compile_msl"
        )
    record = _record_in(msl, artifact)  # the records say what to rewrite
    header = _located_header(msl, record)
    params, param_edits = _located_params(msl, header, record, checked=checked)
    body_start = header.close_pos + 1
    body = _located_declarations(msl, body_start, record, checked=checked, racecheck=racecheck)
    out = _apply_edits(msl, [*header.edits, *param_edits, *body.edits])
    if instrument is not None:
        names = _instrumented_names(params, body)
        out = _instrument_body(out, header.line, record, names, body.decl_lines, instrument)
    assert out.count("\n") == msl.count("\n"), "rewrite must keep line numbers"
    sig = KernelSignature(
        name=header.name,
        cxx_name=header.cxx_name,
        params=tuple(params), max_total_threads=header.max_total_threads,
        threadgroup_arrays=tuple(body.threadgroup_arrays),
        threadgroup_views=tuple(body.threadgroup_views), thread_arrays=tuple(body.thread_arrays),
        line=header.line,
        record=record,
    )
    return RewrittenSource(signature=sig, text=out, record=record)


def _artifact(msl: str) -> KernelArtifact | None:
    try:
        return find_artifact(msl)
    except ValueError as err:  # an artifact of another version, or damaged
        raise EmulatorCompileError(str(err)) from None


def _mismatch(record: KernelRecord, what: str, expected: str) -> EmulatorCompileError:
    return EmulatorCompileError(
        f"kernel {record.name}: its artifact records {what}, but the MSL has no `{expected}`: the MSL was edited after "
        "tilelang_metal printed it; run edited MSL with tilelang_metal.emulator.compile_msl"
    )


def _record_in(msl: str, artifact: KernelArtifact) -> KernelRecord:
    """The record of the one kernel `msl` holds (a per-kernel source carries the module's artifact)."""
    present = [k for k in artifact.kernels if k.opening() in msl]
    if not present:
        raise EmulatorCompileError(
            f"the MSL's artifact records kernels {', '.join(artifact.names) or '(none)'}, but none of them is in the source "
            "as printed; run edited MSL with tilelang_metal.emulator.compile_msl"
        )
    if len(present) > 1:
        names = ", ".join(k.name for k in present)
        raise EmulatorCompileError(f"expected one kernel per file, found {len(present)}: {names} (emulator.split_kernels splits a module)")
    return present[0]


def _located_header(msl: str, record: KernelRecord) -> _KernelHeader:
    """The kernel's opening line, found by its record's spelling; the attribute becomes `static`."""
    start = msl.index(record.opening())
    attr_end = msl.index("]]", start) + 2
    name_start = msl.index(" void ", attr_end) + len(" void ")
    open_pos = start + len(record.opening()) - 1
    edits: list[_Edit] = [(start, attr_end, "static")]
    cxx_name = "tlm_kernel_main" if record.name == "main" else record.name
    if cxx_name != record.name:
        edits.append((name_start, name_start + len(record.name), cxx_name))
    return _KernelHeader(
        name=record.name,
        cxx_name=cxx_name,
        max_total_threads=record.max_total_threads,
        open_pos=open_pos,
        close_pos=_matching_paren(msl, open_pos),
        edits=tuple(edits),
        line=_line_of(msl, start),
    )


def _located_params(msl: str, header: _KernelHeader, record: KernelRecord, *, checked: bool) -> tuple[list[Param], list[_Edit]]:
    """Each recorded parameter found in order by its spelling; nothing else may sit between them."""
    edits: list[_Edit] = []
    cursor = header.open_pos + 1
    rest = []
    for p in record.params:
        text = p.msl()
        at = msl.find(text, cursor, header.close_pos)
        if at < 0:
            raise _mismatch(record, f"parameter {p.name}", text)
        rest.append(msl[cursor:at])
        edits.append((at, at + len(text), _cxx_param(p, checked)))
        cursor = at + len(text)
    rest.append(msl[cursor : header.close_pos])
    between = "".join(rest)
    if between.replace(",", "").strip() or between.count(",") != max(len(record.params) - 1, 0):
        raise _fail(f"kernel {record.name}: its parameter list holds more than its artifact records", msl, _line_of(msl, header.open_pos))
    for expected, p in enumerate(record.bound):
        if p.index != expected:
            raise EmulatorCompileError(f"parameter '{p.name}' has [[ buffer({p.index}) ]]; buffer indices must be 0..n-1 in parameter order")
    for p in record.params:
        if isinstance(p, (BufferParam, ScalarParam)) and p.elem_type not in DTYPE_OF_MSL:
            raise EmulatorCompileError(f"kernel {record.name}: parameter '{p.name}' has unsupported element type '{p.elem_type}'")
        if isinstance(p, PositionParam):
            _check_position(p, msl, None)
    return list(record.params), edits


def _body_lines(msl: str, body_start: int) -> dict[str, list[tuple[int, int, str]]]:
    """Stripped body line -> [(1-based line, offset of the line, its text)]."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    offset = 0
    for lineno, ln in enumerate(msl.splitlines(keepends=True), start=1):
        start = offset
        offset += len(ln)
        if start >= body_start:
            content = ln.rstrip("\r\n")
            found.setdefault(content.strip(), []).append((lineno, start, content))
    return found


def _indent(content: str) -> str:
    return content[: len(content) - len(content.lstrip())]


def _located_declarations(msl: str, body_start: int, record: KernelRecord, *, checked: bool, racecheck: bool) -> _BodyDeclarations:
    """The recorded threadgroup arrays, pool views, thread arrays and tile pointers, found by their
    spelling and rewritten to shim calls."""
    body = _BodyDeclarations()
    lines = _body_lines(msl, body_start)

    def sites(what: str, text: str, *, once: bool) -> list[tuple[int, int, str]]:
        found = lines.get(text, [])
        if not found or (once and len(found) > 1):
            raise _mismatch(record, what, text) if not found else EmulatorCompileError(
                f"kernel {record.name}: `{text}` is declared {len(found)} times; its artifact records it once")
        for lineno, _, _ in found:
            body.decl_lines.add(lineno)
        return found

    for slot, a in enumerate(record.threadgroup_arrays):
        ((lineno, start, content),) = sites(f"threadgroup array {a.name}", a.msl(), once=True)
        arr = ThreadgroupArray(slot=slot, name=a.name, elem_type=a.elem_type, count=str(a.count), line=lineno)
        body.threadgroup_arrays.append(arr)
        body.edits.append((start, start + len(content), _threadgroup_array_text(_indent(content), arr, "", checked=checked)))
    views = []
    for v in record.threadgroup_views:
        ((lineno, start, content),) = sites(f"threadgroup view {v.name}", v.msl(), once=True)
        views.append((_ViewSite(v, lineno, start, len(content), _indent(content))))
    body.threadgroup_views = _threadgroup_views(views)
    if checked:
        body.edits.extend(_checked_view_edits(views, body.threadgroup_views))
    for t in record.thread_arrays:
        for lineno, start, content in sites(f"thread array {t.name}", t.msl(), once=False):
            _record_thread_array(body, t.name, t.elem_type, t.count, t.align, lineno, start, content, checked=checked, racecheck=racecheck)
    for tp in record.tile_pointers:
        prefix = tp.prefix()
        found = [site for text, group in lines.items() if text.startswith(prefix) and text.endswith(";") for site in group]
        if not found:
            raise _mismatch(record, f"tile pointer {tp.name}", prefix + "...;")
        for lineno, start, content in found:
            value = content.strip()[len(prefix) : -1]
            body.edits.append((start, start + len(content), f"{_indent(content)}auto {tp.name} = {value};"))
            body.device_pointers.add(tp.name)
            body.decl_lines.add(lineno)
    return body


def _cxx_param(p: Param, checked: bool) -> str:
    """The C++ form of a kernel parameter (the driver binds it, driver.py)."""
    if isinstance(p, BufferParam):
        const = "const " if p.is_const else ""
        return f"tlm::checked_ptr<{const}{p.elem_type}> {p.name}" if checked else f"{const}{p.elem_type}* __restrict {p.name}"
    if isinstance(p, ScalarParam):
        return f"const {p.elem_type} {p.name}"
    if isinstance(p, ArgStructParam):
        return f"const {p.struct_type} {p.name}"
    return f"{p.type} {p.name}"


def _check_position(p: PositionParam, msl: str, line: int | None) -> None:
    if p.attribute not in POSITION_ATTRIBUTES:
        raise _fail(f"kernel parameter '{p.name}': unsupported attribute [[{p.attribute}]]", msl, line)
    base = p.type.rstrip("0123456789")
    if base not in _POSITION_TYPES or p.type[len(base) :] not in ("", "2", "3"):
        raise _fail(f"kernel parameter '{p.name}': unsupported type '{p.type}'", msl, line)


def _record_thread_array(body: _BodyDeclarations, name: str, elem_type: str, count: int, align: int, lineno: int,
                         start: int, content: str, *, checked: bool, racecheck: bool) -> None:
    """Note a thread array for the stack size; checked builds bound its indices (`tlm::bounded_local`:
    an index out of range is reported, not written over the thread's stack), racecheck also tracks
    which elements were written (`tlm::local_array`)."""
    size = msl_type_bytes(elem_type)
    if size is not None:
        body.thread_arrays.append(ThreadArray(name, elem_type, count, count * size, lineno))
    body.decl_lines.add(lineno)
    if not checked or size is None or elem_type.startswith("simdgroup_"):
        return
    kind = "local_array" if racecheck else "bounded_local"
    # the wrapper holds a pointer, so it is 8-byte aligned already (and C++ refuses a smaller alignas)
    prefix = f"alignas({align}) " if align > _WRAPPER_ALIGN else ""
    body.edits.append((start, start + len(content), f'{_indent(content)}{prefix}tlm::{kind}<{elem_type}, {count}> {name}("{name}");'))
    if racecheck:
        body.tracked_locals.add(name)


_WRAPPER_ALIGN = 8  # alignof(tlm::bounded_local) and alignof(tlm::local_array): their `name` pointer's


def _threadgroup_array_text(indent: str, arr: ThreadgroupArray, tail: str, *, checked: bool) -> str:
    """A threadgroup array declaration as a slot of the shim's threadgroup memory."""
    elem = arr.elem_type
    if checked:
        return f'{indent}tlm::checked_ptr<{elem}> {arr.name} = tlm::threadgroup_array<{elem}>({arr.slot}, ({arr.count}), "{arr.name}");{tail}'
    return f"{indent}{elem}* {arr.name} = tlm::threadgroup_array_raw<{elem}>({arr.slot}, ({arr.count}));{tail}"


@dataclass(frozen=True)
class _ViewSite:
    """A pool view's declaration and where it sits in the source."""

    decl: ThreadgroupViewDecl
    line: int
    start: int
    length: int
    indent: str
    tail: str | None = None  # the text after the `;` (None: the record's own)


def _checked_view_edits(found: list[_ViewSite], views: list[ThreadgroupView]) -> list[_Edit]:
    """Checked builds: each pool view becomes a bounds-checked `tlm::threadgroup_view`."""
    edits = []
    for view_id, (site, view) in enumerate(zip(found, views), start=1):
        end = -1 if view.end is None else view.end
        tail = site.decl.tail() if site.tail is None else site.tail
        edits.append((
            site.start,
            site.start + site.length,
            f"{site.indent}tlm::checked_ptr<{view.elem_type}> {view.name} = tlm::threadgroup_view<{view.elem_type}>("
            f'{view.pool}, ({view.offset}), {end}, "{view.name}", {view_id});{tail}',
        ))
    return edits


def _apply_edits(msl: str, edits: list[_Edit]) -> str:
    """Apply non-overlapping (start, end, replacement) edits, last first so earlier offsets stay valid."""
    out = msl
    for s, e, rep in sorted(edits, key=lambda t: t[0], reverse=True):
        out = out[:s] + rep + out[e:]
    return out


def _instrumented_names(params: list[Param], body: _BodyDeclarations) -> set[str]:
    """The pointers whose accesses instrumentation marks: device buffers, threadgroup arrays and views, tracked locals."""
    return (
        {p.name for p in params if isinstance(p, BufferParam)}
        | {a.name for a in body.threadgroup_arrays}
        | {v.name for v in body.threadgroup_views}
        | body.tracked_locals
        | body.device_pointers
    )


def _instrument_body(out: str, opening_line: int, record: KernelRecord, names: set[str], decl_lines: set[int], instrument: str) -> str:
    """Mark the accesses the record lists, on every line except declarations (mark_insertion.py)."""
    out_lines = out.split("\n")
    apply_marks(out_lines, opening_line - 1, record, names, decl_lines, predicated_blocks=instrument == "counters")
    return "\n".join(out_lines)


def _threadgroup_views(found: list[_ViewSite]) -> list[ThreadgroupView]:
    """Each view's extent: its own element count when declared (the printer writes it after the view,
    `// N elements`), else up to where the next view of the same pool starts (by literal byte offset;
    views at the same offset, whose lifetimes the storage planner overlapped, share the span up to
    the next one)."""
    offsets: dict[str, set[int]] = {}
    for site in found:
        off = _int_literal(site.decl.offset)
        if off is not None:
            offsets.setdefault(site.decl.pool, set()).add(off)
    views = []
    for site in found:
        v = site.decl
        off = _int_literal(v.offset)
        later = [o for o in offsets.get(v.pool, ()) if off is not None and o > off]
        elem_bytes = msl_type_bytes(v.elem_type)
        if v.elements is not None and off is not None and elem_bytes:
            later = [off + v.elements * elem_bytes]
        views.append(ThreadgroupView(name=v.name, elem_type=v.elem_type, pool=v.pool, offset=v.offset,
                                     end=min(later) if later else None, line=site.line))
    return views
