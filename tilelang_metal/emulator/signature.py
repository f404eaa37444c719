"""Parsing of the kernel signature and the source rewrites that precede compilation.

The printer's output has a fixed shape (docs/msl_contract.md): one `[[kernel]]` function, one
parameter per line, device buffers as `[const] device T* __restrict NAME [[ buffer(i) ]]`, position
attributes, and threadgroup arrays declared one per line as `threadgroup T NAME[COUNT];`. The
rewrites keep every line where it was, so compiler diagnostics point at the original MSL lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .access_marks import mark_line
from .errors import EmulatorCompileError

# MSL element type -> torch dtype name (looked up lazily so that parsing does not need torch).
SCALAR_TYPES: dict[str, str] = {
    "bool": "bool",
    "char": "int8",
    "uchar": "uint8",
    "short": "int16",
    "ushort": "uint16",
    "int": "int32",
    "uint": "uint32",
    "long": "int64",
    "ulong": "uint64",
    "half": "float16",
    "bfloat": "bfloat16",
    "float": "float32",
}

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
class BufferParam:
    index: int
    name: str
    elem_type: str  # MSL scalar type, e.g. "half"
    is_const: bool

    @property
    def torch_dtype_name(self) -> str:
        return SCALAR_TYPES[self.elem_type]

    def describe(self) -> str:
        const = "const " if self.is_const else ""
        return f"parameter '{self.name}' (buffer {self.index}, {const}device {self.elem_type}*)"


@dataclass(frozen=True)
class ScalarParam:
    """`constant T& NAME [[ buffer(i) ]]`: a by-value argument, passed as a pointer to its value."""

    index: int
    name: str
    elem_type: str

    @property
    def torch_dtype_name(self) -> str:
        return SCALAR_TYPES[self.elem_type]

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.index}, constant {self.elem_type}&)"


@dataclass(frozen=True)
class PositionParam:
    name: str
    type: str  # uint3, uint, ushort, ...
    attribute: str


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
    params: tuple[BufferParam | ScalarParam | PositionParam, ...]
    max_total_threads: int | None
    threadgroup_arrays: tuple[ThreadgroupArray, ...]
    threadgroup_views: tuple[ThreadgroupView, ...] = ()
    thread_arrays: tuple[ThreadArray, ...] = ()

    @property
    def thread_array_bytes(self) -> int:
        """Upper bound of the thread-private arrays' stack use (all of them, as if live at once)."""
        return sum(a.bytes for a in self.thread_arrays)

    @property
    def buffers(self) -> tuple[BufferParam, ...]:
        return tuple(p for p in self.params if isinstance(p, BufferParam))

    @property
    def bound(self) -> tuple[BufferParam | ScalarParam, ...]:
        """What the caller passes, in [[ buffer(i) ]] order: device buffers and scalar values."""
        return tuple(p for p in self.params if isinstance(p, (BufferParam, ScalarParam)))

    @property
    def positions(self) -> tuple[PositionParam, ...]:
        return tuple(p for p in self.params if isinstance(p, PositionParam))


_KERNEL_RE = re.compile(r"(\[\[\s*kernel\b(?:[^\]]|\](?!\]))*\]\]|\bkernel)\s+void\s+([A-Za-z_]\w*)\s*\(")
_MAX_THREADS_RE = re.compile(r"max_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)")
_BUFFER_RE = re.compile(
    r"^(?P<const>const\s+)?device\s+(?P<const2>const\s+)?(?P<type>[A-Za-z_]\w*)\s*\*\s*"
    r"(?:(?:__restrict__|__restrict|restrict)\s+)?(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\[\s*buffer\s*\(\s*(?P<index>\d+)\s*\)\s*\]\]$"
)
_SCALAR_RE = re.compile(
    r"^constant\s+(?:const\s+)?(?P<type>[A-Za-z_]\w*)\s*&\s*(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\[\s*buffer\s*\(\s*(?P<index>\d+)\s*\)\s*\]\]$"
)
_POSITION_RE = re.compile(
    r"^(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*\[\[\s*(?P<attr>[A-Za-z_]\w*)\s*\]\]$"
)
_TG_DECL_RE = re.compile(
    r"^(?P<indent>\s*)threadgroup\s+(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"\[(?P<count>[^\]\[]+)\]\s*(?:__attribute__\s*\(\(.*\)\)\s*|alignas\s*\([^)]*\)\s*)?;(?P<tail>\s*(?://.*)?)$"
)
# A typed view into a merged threadgroup pool: `threadgroup T* NAME = (threadgroup T*)(POOL + OFF);`
_TG_VIEW_RE = re.compile(
    r"^(?P<indent>\s*)threadgroup\s+(?P<type>[A-Za-z_]\w*)\s*\*\s*(?P<name>[A-Za-z_]\w*)\s*=\s*"
    r"\(\s*threadgroup\s+(?P=type)\s*\*\s*\)\s*\(\s*(?P<pool>[A-Za-z_]\w*)\s*\+\s*(?P<off>[^;]+?)\s*\)\s*;"
    r"(?P<tail>\s*(?://.*)?)$"
)
# A thread-private array: `T NAME[COUNT];` (the printer's T.alloc_local / fragments).
_THREAD_ARRAY_RE = re.compile(
    r"^\s*(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*\[(?P<count>[^\]\[]+)\]\s*;\s*(?://.*)?$"
)
SCALAR_BYTES: dict[str, int] = {
    "bool": 1, "char": 1, "uchar": 1, "short": 2, "ushort": 2, "half": 2, "bfloat": 2,
    "int": 4, "uint": 4, "float": 4, "long": 8, "ulong": 8,
}


def type_bytes(type_name: str) -> int | None:
    """Size in the emulator of a scalar, vector (`half4`) or simdgroup matrix (`simdgroup_float8x8`) type."""
    if type_name in SCALAR_BYTES:
        return SCALAR_BYTES[type_name]
    m = re.fullmatch(r"([a-z]+)([234])", type_name)
    if m and m.group(1) in SCALAR_BYTES:
        return SCALAR_BYTES[m.group(1)] * int(m.group(2))
    m = re.fullmatch(r"simdgroup_([a-z]+)8x8", type_name)
    if m and m.group(1) in SCALAR_BYTES:
        return 2 * SCALAR_BYTES[m.group(1)]  # two elements per lane
    return None


# Anything that looks like a threadgroup variable declaration (type then name), anywhere on a line.
_TG_ANY_DECL_RE = re.compile(r"\bthreadgroup\s+(?:const\s+)?[A-Za-z_]\w*\s+[A-Za-z_]\w*")


def _fail(msg: str, source: str, line: int | None = None) -> EmulatorCompileError:
    if line is not None:
        lines = source.splitlines()
        if 1 <= line <= len(lines):
            msg += f"\n  {line:5d} | {lines[line - 1]}"
    return EmulatorCompileError(msg)


def _line_of(source: str, pos: int) -> int:
    return source.count("\n", 0, pos) + 1


def _split_params(source: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the top-level comma-separated parameters in source[start:end]."""
    spans, depth, last = [], 0, start
    for i in range(start, end):
        ch = source[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((last, i))
            last = i + 1
    if source[last:end].strip():
        spans.append((last, end))
    return spans


def _matching_paren(source: str, open_pos: int) -> int:
    depth = 0
    for i in range(open_pos, len(source)):
        if source[i] == "(":
            depth += 1
        elif source[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise EmulatorCompileError("kernel signature: unbalanced parentheses")


def split_kernels(msl: str) -> dict[str, str]:
    """kernel name -> a source holding that kernel alone: the file's header (everything before the
    first kernel) followed by the kernel's text up to the next kernel. A module with several
    `T.Kernel` blocks prints as one file; the emulator compiles its kernels one at a time."""
    kernels = list(_KERNEL_RE.finditer(msl))
    if not kernels:
        return {}
    header = msl[: kernels[0].start()]
    out = {}
    for i, m in enumerate(kernels):
        end = kernels[i + 1].start() if i + 1 < len(kernels) else len(msl)
        out[m.group(2)] = header + msl[m.start() : end]
    return out


@dataclass(frozen=True)
class RewrittenSource:
    signature: KernelSignature
    text: str  # same number of lines as the input, kernel part rewritten


INSTRUMENTS = ("counters", "racecheck")


def rewrite(msl: str, *, checked: bool, instrument: str | None = None) -> RewrittenSource:
    """Parse the kernel signature and rewrite buffer parameters and threadgroup declarations.

    `instrument` ("counters" / "racecheck", checked builds only) also marks stores and predicated
    accesses (access_marks.py); racecheck turns thread arrays into `tlm::local_array`s."""
    if instrument is not None and (instrument not in INSTRUMENTS or not checked):
        raise ValueError(f"instrument must be one of {INSTRUMENTS} on a checked build, got {instrument!r}")
    kernels = list(_KERNEL_RE.finditer(msl))
    if not kernels:
        raise EmulatorCompileError("no kernel found: expected `[[kernel, ...]] void NAME(` (docs/msl_contract.md)")
    if len(kernels) > 1:
        names = ", ".join(m.group(2) for m in kernels)
        raise _fail(f"expected one kernel per file, found {len(kernels)}: {names}", msl, _line_of(msl, kernels[1].start()))
    m = kernels[0]
    name = m.group(2)
    attr = m.group(1)
    mt = _MAX_THREADS_RE.search(attr)
    max_threads = int(mt.group(1)) if mt else None
    open_pos = m.end() - 1
    close_pos = _matching_paren(msl, open_pos)

    params: list[BufferParam | ScalarParam | PositionParam] = []
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) on msl
    # The kernel attribute becomes `static` (keeping the line count). C++ reserves `main`.
    edits.append((m.start(1), m.end(1), "static" + "\n" * attr.count("\n")))
    cxx_name = "tlm_kernel_main" if name == "main" else name
    if cxx_name != name:
        edits.append((m.start(2), m.end(2), cxx_name))
    for s, e in _split_params(msl, open_pos + 1, close_pos):
        raw = msl[s:e]
        text = " ".join(raw.split())
        lead = len(raw) - len(raw.lstrip())
        trail = len(raw) - len(raw.rstrip())
        ps, pe = s + lead, e - trail
        line = _line_of(msl, ps)
        bm = _BUFFER_RE.match(text)
        if bm:
            elem = bm.group("type")
            if elem not in SCALAR_TYPES:
                raise _fail(f"device buffer '{bm.group('name')}': unsupported element type '{elem}'", msl, line)
            bp = BufferParam(
                index=int(bm.group("index")),
                name=bm.group("name"),
                elem_type=elem,
                is_const=bool(bm.group("const") or bm.group("const2")),
            )
            params.append(bp)
            const = "const " if bp.is_const else ""
            if checked:
                rep = f"tlm::checked_ptr<{const}{elem}> {bp.name}"
            else:
                rep = f"{const}{elem}* __restrict {bp.name}"
            edits.append((ps, pe, rep + "\n" * raw[lead : len(raw) - trail].count("\n")))
            continue
        sm = _SCALAR_RE.match(text)
        if sm:
            elem = sm.group("type")
            if elem not in SCALAR_TYPES:
                raise _fail(f"scalar parameter '{sm.group('name')}': unsupported type '{elem}'", msl, line)
            sp = ScalarParam(index=int(sm.group("index")), name=sm.group("name"), elem_type=elem)
            params.append(sp)
            # By value in C++: the driver dereferences the pointer the caller passed.
            edits.append((ps, pe, f"const {elem} {sp.name}" + "\n" * raw[lead : len(raw) - trail].count("\n")))
            continue
        pm = _POSITION_RE.match(text)
        if pm:
            attr_name = pm.group("attr")
            if attr_name not in POSITION_ATTRIBUTES:
                raise _fail(f"kernel parameter '{pm.group('name')}': unsupported attribute [[{attr_name}]]", msl, line)
            ptype = pm.group("type")
            base = ptype.rstrip("0123456789")
            width = ptype[len(base) :]
            if base not in _POSITION_TYPES or width not in ("", "2", "3"):
                raise _fail(f"kernel parameter '{pm.group('name')}': unsupported type '{ptype}'", msl, line)
            params.append(PositionParam(name=pm.group("name"), type=ptype, attribute=attr_name))
            edits.append((ps, pe, f"{ptype} {pm.group('name')}" + "\n" * raw[lead : len(raw) - trail].count("\n")))
            continue
        raise _fail(
            "unsupported kernel parameter (expected `[const] device T* __restrict NAME [[ buffer(i) ]]`, "
            "`constant T& NAME [[ buffer(i) ]]` or a position attribute)",
            msl,
            line,
        )
    bound = [p for p in params if isinstance(p, (BufferParam, ScalarParam))]
    for expected, bp in enumerate(bound):
        if bp.index != expected:
            raise EmulatorCompileError(
                f"parameter '{bp.name}' has [[ buffer({bp.index}) ]]; buffer indices must be 0..n-1 in parameter order"
            )

    # Threadgroup arrays: every `threadgroup` declaration line after the signature.
    body_start = close_pos + 1
    tg_arrays: list[ThreadgroupArray] = []
    views: list[tuple[re.Match[str], int, int, int]] = []
    thread_arrays: list[ThreadArray] = []
    decl_lines: set[int] = set()
    tracked_locals: set[str] = set()
    lines = msl.splitlines(keepends=True)
    offset = 0
    line_edits: list[tuple[int, int, str]] = []
    for lineno, ln in enumerate(lines, start=1):
        start = offset
        offset += len(ln)
        if start < body_start:
            continue
        content = ln.rstrip("\r\n")
        am = _THREAD_ARRAY_RE.match(content)
        count = _int_literal(am.group("count")) if am else None
        size = type_bytes(am.group("type")) if am else None
        if am and count is not None and size is not None:
            arr_t = ThreadArray(am.group("name"), am.group("type"), count, count * size, lineno)
            thread_arrays.append(arr_t)
            decl_lines.add(lineno)
            if instrument == "racecheck" and not arr_t.elem_type.startswith("simdgroup_"):
                indent = content[: len(content) - len(content.lstrip())]
                line_edits.append((start, start + len(content),
                                   f'{indent}tlm::local_array<{arr_t.elem_type}, {count}> {arr_t.name}("{arr_t.name}");'))
                tracked_locals.add(arr_t.name)
            continue
        vm = _TG_VIEW_RE.match(content)
        if vm and any(a.name == vm.group("pool") for a in tg_arrays):
            views.append((vm, lineno, start, len(content)))
            decl_lines.add(lineno)
            continue
        dm = _TG_DECL_RE.match(content)
        if not dm:
            if not _TG_ANY_DECL_RE.search(content.split("//", 1)[0]):
                continue
            raise _fail(
                "unsupported threadgroup declaration (expected `threadgroup T NAME[COUNT];` on its own line)",
                msl,
                lineno,
            )
        decl_lines.add(lineno)
        elem = dm.group("type")
        slot = len(tg_arrays)
        arr = ThreadgroupArray(slot=slot, name=dm.group("name"), elem_type=elem, count=dm.group("count").strip(), line=lineno)
        tg_arrays.append(arr)
        if checked:
            rep = (
                f'{dm.group("indent")}tlm::checked_ptr<{elem}> {arr.name} = '
                f'tlm::threadgroup_array<{elem}>({slot}, ({arr.count}), "{arr.name}");{dm.group("tail")}'
            )
        else:
            rep = (
                f'{dm.group("indent")}{elem}* {arr.name} = '
                f"tlm::threadgroup_array_raw<{elem}>({slot}, ({arr.count}));{dm.group('tail')}"
            )
        line_edits.append((start, start + len(content), rep))

    tg_views = _threadgroup_views(views)
    if checked:
        for (vm, _lineno, start, length), view in zip(views, tg_views):
            end = -1 if view.end is None else view.end
            line_edits.append((
                start,
                start + length,
                f'{vm.group("indent")}tlm::checked_ptr<{view.elem_type}> {view.name} = tlm::threadgroup_view<{view.elem_type}>('
                f'{view.pool}, ({view.offset}), {end}, "{view.name}");{vm.group("tail")}',
            ))

    out = msl
    for s, e, rep in sorted(edits + line_edits, key=lambda t: t[0], reverse=True):
        out = out[:s] + rep + out[e:]
    if instrument is not None:
        names = {p.name for p in params if isinstance(p, BufferParam)} | {a.name for a in tg_arrays} | {v.name for v in tg_views} | tracked_locals
        first_body_line = _line_of(msl, body_start)
        out_lines = out.split("\n")
        for i in range(first_body_line, len(out_lines)):  # the body starts after the `) {` line
            if i + 1 in decl_lines:
                continue
            out_lines[i] = mark_line(out_lines[i], names, predicated_blocks=instrument == "counters")
        out = "\n".join(out_lines)
    assert out.count("\n") == msl.count("\n"), "rewrite must keep line numbers"
    sig = KernelSignature(
        name=name,
        cxx_name=cxx_name,
        params=tuple(params), max_total_threads=max_threads, threadgroup_arrays=tuple(tg_arrays),
        threadgroup_views=tuple(tg_views), thread_arrays=tuple(thread_arrays),
    )
    return RewrittenSource(signature=sig, text=out)


def _threadgroup_views(found: list[tuple[re.Match[str], int, int, int]]) -> list[ThreadgroupView]:
    """Each view's extent ends where the next view of the same pool starts (by literal byte offset);
    views at the same offset (lifetimes the storage planner overlapped) share the span up to the next one."""
    offsets: dict[str, set[int]] = {}
    for vm, *_ in found:
        off = _int_literal(vm.group("off"))
        if off is not None:
            offsets.setdefault(vm.group("pool"), set()).add(off)
    views = []
    for vm, lineno, _start, _len in found:
        off = _int_literal(vm.group("off"))
        later = [o for o in offsets.get(vm.group("pool"), ()) if off is not None and o > off]
        views.append(ThreadgroupView(
            name=vm.group("name"),
            elem_type=vm.group("type"),
            pool=vm.group("pool"),
            offset=vm.group("off").strip(),
            end=min(later) if later else None,
            line=lineno,
        ))
    return views
