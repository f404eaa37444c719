"""Parsing of the kernel signature and the source rewrites that precede compilation.

The printer's output has a fixed shape (docs/msl_contract.md): one `[[kernel]]` function, one
parameter per line, device buffers as `[const] device T* __restrict NAME [[ buffer(i) ]]`, position
attributes, and threadgroup arrays declared one per line as `threadgroup T NAME[COUNT];`. The
rewrites keep every line where it was, so compiler diagnostics point at the original MSL lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..dtypes import DTYPE_OF_MSL

from .access_marks import mark_line
from .errors import EmulatorCompileError

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
        return DTYPE_OF_MSL[self.elem_type]

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
        return DTYPE_OF_MSL[self.elem_type]

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.index}, constant {self.elem_type}&)"


@dataclass(frozen=True)
class ArgStructParam:
    """`constant S& NAME [[ buffer(i) ]]` with `S` a struct of the file: the argument struct of TVM's
    Metal runtime convention (codegen/tvm_runtime_args.py), one 8-byte slot per member. The caller
    passes its bytes; the driver passes a pointer to them, as the runtime's setBytes does."""

    index: int
    name: str
    struct_type: str
    size: int  # bytes

    @property
    def torch_dtype_name(self) -> str:
        return "uint8"

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.index}, constant {self.struct_type}&, {self.size} bytes)"


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
    params: tuple[BufferParam | ScalarParam | ArgStructParam | PositionParam, ...]
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
    def bound(self) -> tuple[BufferParam | ScalarParam | ArgStructParam, ...]:
        """What the caller passes, in [[ buffer(i) ]] order: device buffers, scalar values, argument structs."""
        return tuple(p for p in self.params if isinstance(p, (BufferParam, ScalarParam, ArgStructParam)))


from ..codegen.kernel_text import KERNEL_RE as _KERNEL_RE  # noqa: E402
from ..codegen.kernel_text import matching_bracket  # noqa: E402
from ..codegen.kernel_text import split_kernels  # noqa: E402,F401  (re-exported)
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
# A tile pointer into a device buffer: `const device T* NAME = (BUF + (OFF));` (spec 1.4 `__src`).
_DEVICE_POINTER_RE = re.compile(
    r"^(?P<indent>\s*)(?:const\s+)?device\s+[A-Za-z_]\w*\s*\*\s*(?P<name>[A-Za-z_]\w*)\s*=\s*"
    r"(?P<value>\(\s*(?P<buf>[A-Za-z_]\w*)\s*\+.*\))\s*;(?P<tail>\s*(?://.*)?)$"
)
# A thread-private array: `T NAME[COUNT];` (the printer's T.alloc_local / fragments).
_THREAD_ARRAY_RE = re.compile(
    r"^\s*(?P<align>alignas\(\d+\)\s+)?(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*\[(?P<count>[^\]\[]+)\]\s*;\s*(?://.*)?$"
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
    close = matching_bracket(source, open_pos)
    if close is None:
        raise EmulatorCompileError("kernel signature: unbalanced parentheses")
    return close


@dataclass(frozen=True)
class RewrittenSource:
    signature: KernelSignature
    text: str  # same number of lines as the input, kernel part rewritten


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
    accesses (access_marks.py); racecheck turns thread arrays into `tlm::local_array`s."""
    if instrument is not None and (instrument not in INSTRUMENTS or not checked):
        raise ValueError(f"instrument must be one of {INSTRUMENTS} on a checked build, got {instrument!r}")
    header = _parse_kernel_header(msl)
    params, param_edits = _rewrite_params(msl, header, checked=checked)
    body_start = header.close_pos + 1
    body = _rewrite_declarations(msl, body_start, checked=checked, racecheck=instrument == "racecheck")
    out = _apply_edits(msl, [*header.edits, *param_edits, *body.edits])
    if instrument is not None:
        names = _instrumented_names(params, body)
        out = _instrument_body(out, _line_of(msl, body_start), names, body.decl_lines, instrument)
    assert out.count("\n") == msl.count("\n"), "rewrite must keep line numbers"
    sig = KernelSignature(
        name=header.name,
        cxx_name=header.cxx_name,
        params=tuple(params), max_total_threads=header.max_total_threads,
        threadgroup_arrays=tuple(body.threadgroup_arrays),
        threadgroup_views=tuple(body.threadgroup_views), thread_arrays=tuple(body.thread_arrays),
    )
    return RewrittenSource(signature=sig, text=out)


def _parse_kernel_header(msl: str) -> _KernelHeader:
    """Find the single kernel, its attribute and parameter list; the attribute becomes `static`."""
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
    open_pos = m.end() - 1
    # The kernel attribute becomes `static` (keeping the line count). C++ reserves `main`.
    edits: list[_Edit] = [(m.start(1), m.end(1), "static" + "\n" * attr.count("\n"))]
    cxx_name = "tlm_kernel_main" if name == "main" else name
    if cxx_name != name:
        edits.append((m.start(2), m.end(2), cxx_name))
    return _KernelHeader(
        name=name,
        cxx_name=cxx_name,
        max_total_threads=int(mt.group(1)) if mt else None,
        open_pos=open_pos,
        close_pos=_matching_paren(msl, open_pos),
        edits=tuple(edits),
    )


def _rewrite_params(msl: str, header: _KernelHeader, *, checked: bool) -> tuple[list[Param], list[_Edit]]:
    """Parse and rewrite every kernel parameter; check buffer indices run 0..n-1."""
    params: list[Param] = []
    edits: list[_Edit] = []
    for s, e in _split_params(msl, header.open_pos + 1, header.close_pos):
        param, edit = _rewrite_param(msl, s, e, checked=checked)
        params.append(param)
        edits.append(edit)
    bound = [p for p in params if isinstance(p, (BufferParam, ScalarParam, ArgStructParam))]
    for expected, bp in enumerate(bound):
        if bp.index != expected:
            raise EmulatorCompileError(
                f"parameter '{bp.name}' has [[ buffer({bp.index}) ]]; buffer indices must be 0..n-1 in parameter order"
            )
    return params, edits


def _rewrite_param(msl: str, s: int, e: int, *, checked: bool) -> tuple[Param, _Edit]:
    """One parameter msl[s:e] -> its parsed form and the edit giving its C++ form (same line count).

    Each `_*_param` parser returns None when the text is not its kind of parameter."""
    raw = msl[s:e]
    text = " ".join(raw.split())
    lead = len(raw) - len(raw.lstrip())
    trail = len(raw) - len(raw.rstrip())
    ps, pe = s + lead, e - trail
    line = _line_of(msl, ps)
    newlines = "\n" * raw[lead : len(raw) - trail].count("\n")
    for parse in (_buffer_param, _scalar_param, _position_param):
        found = parse(text, msl, line, checked=checked)
        if found is not None:
            param, replacement = found
            return param, (ps, pe, replacement + newlines)
    raise _fail(
        "unsupported kernel parameter (expected `[const] device T* __restrict NAME [[ buffer(i) ]]`, "
        "`constant T& NAME [[ buffer(i) ]]` or a position attribute)",
        msl,
        line,
    )


def _buffer_param(text: str, msl: str, line: int, *, checked: bool) -> tuple[BufferParam, str] | None:
    """`[const] device T* NAME [[ buffer(i) ]]` -> a checked or raw pointer parameter."""
    bm = _BUFFER_RE.match(text)
    if not bm:
        return None
    elem = bm.group("type")
    if elem not in DTYPE_OF_MSL:
        raise _fail(f"device buffer '{bm.group('name')}': unsupported element type '{elem}'", msl, line)
    bp = BufferParam(
        index=int(bm.group("index")),
        name=bm.group("name"),
        elem_type=elem,
        is_const=bool(bm.group("const") or bm.group("const2")),
    )
    const = "const " if bp.is_const else ""
    if checked:
        return bp, f"tlm::checked_ptr<{const}{elem}> {bp.name}"
    return bp, f"{const}{elem}* __restrict {bp.name}"


def _scalar_param(text: str, msl: str, line: int, *, checked: bool) -> tuple[ScalarParam, str] | None:
    """`constant T& NAME [[ buffer(i) ]]` -> a by-value parameter (the driver dereferences the pointer)."""
    sm = _SCALAR_RE.match(text)
    if not sm:
        return None
    elem = sm.group("type")
    if elem not in DTYPE_OF_MSL:
        size = _arg_struct_size(msl, elem)
        if size is None:
            raise _fail(f"scalar parameter '{sm.group('name')}': unsupported type '{elem}'", msl, line)
        ap = ArgStructParam(index=int(sm.group("index")), name=sm.group("name"), struct_type=elem, size=size)
        return ap, f"const {elem} {ap.name}"  # type: ignore[return-value]
    sp = ScalarParam(index=int(sm.group("index")), name=sm.group("name"), elem_type=elem)
    return sp, f"const {elem} {sp.name}"


_STRUCT_MEMBER_RE = re.compile(r"^(?P<type>[A-Za-z_]\w*)\s+[A-Za-z_]\w*\s*(?P<array>\[\s*2\s*\])?\s*;$")


def _arg_struct_size(msl: str, struct_type: str) -> int | None:
    """Bytes of an argument struct `struct S { T name[2]; ... };` declared in the file (every member
    one 8-byte slot: a 32-bit `T name[2]` or a 64-bit `T name`); None for anything else."""
    m = re.search(r"\bstruct\s+" + re.escape(struct_type) + r"\s*\{(?P<body>[^{}]*)\}\s*;", msl)
    if m is None:
        return None
    members = [line.split("//")[0].strip() for line in m.group("body").splitlines()]
    size = 0
    for member in filter(None, members):
        mm = _STRUCT_MEMBER_RE.match(member)
        bytes_ = SCALAR_BYTES.get(mm.group("type")) if mm else None
        if bytes_ is None or bytes_ * (2 if mm.group("array") else 1) != 8:
            return None
        size += 8
    return size


def _position_param(text: str, msl: str, line: int, *, checked: bool) -> tuple[PositionParam, str] | None:
    """`T NAME [[ attribute ]]` -> a plain parameter the driver fills from the lane's position."""
    pm = _POSITION_RE.match(text)
    if not pm:
        return None
    attr_name = pm.group("attr")
    if attr_name not in POSITION_ATTRIBUTES:
        raise _fail(f"kernel parameter '{pm.group('name')}': unsupported attribute [[{attr_name}]]", msl, line)
    ptype = pm.group("type")
    base = ptype.rstrip("0123456789")
    width = ptype[len(base) :]
    if base not in _POSITION_TYPES or width not in ("", "2", "3"):
        raise _fail(f"kernel parameter '{pm.group('name')}': unsupported type '{ptype}'", msl, line)
    return PositionParam(name=pm.group("name"), type=ptype, attribute=attr_name), f"{ptype} {pm.group('name')}"


def _rewrite_declarations(msl: str, body_start: int, *, checked: bool, racecheck: bool) -> _BodyDeclarations:
    """Find the body's thread arrays, threadgroup arrays and pool views, and rewrite them to shim calls."""
    body = _BodyDeclarations()
    views: list[tuple[re.Match[str], int, int, int]] = []
    offset = 0
    for lineno, ln in enumerate(msl.splitlines(keepends=True), start=1):
        start = offset
        offset += len(ln)
        if start < body_start:
            continue
        content = ln.rstrip("\r\n")
        if _thread_array(content, lineno, start, body, racecheck=racecheck):
            continue
        pm = _DEVICE_POINTER_RE.match(content)
        if pm:
            # the pointer keeps the buffer's checks: it is a copy of the (checked) parameter + offset
            body.edits.append((start, start + len(content), f"{pm.group('indent')}auto {pm.group('name')} = {pm.group('value')};{pm.group('tail')}"))
            body.device_pointers.add(pm.group("name"))
            body.decl_lines.add(lineno)
            continue
        vm = _TG_VIEW_RE.match(content)
        if vm and any(a.name == vm.group("pool") for a in body.threadgroup_arrays):
            views.append((vm, lineno, start, len(content)))
            body.decl_lines.add(lineno)
            continue
        _threadgroup_array(msl, content, lineno, start, body, checked=checked)
    body.threadgroup_views = _threadgroup_views(views)
    if checked:
        body.edits.extend(_checked_view_edits(views, body.threadgroup_views))
    return body


def _thread_array(content: str, lineno: int, start: int, body: _BodyDeclarations, *, racecheck: bool) -> bool:
    """Record a thread-private array declared on this line (racecheck: make it a tracked `tlm::local_array`)."""
    am = _THREAD_ARRAY_RE.match(content)
    count = _int_literal(am.group("count")) if am else None
    size = type_bytes(am.group("type")) if am else None
    if not (am and count is not None and size is not None):
        return False
    arr = ThreadArray(am.group("name"), am.group("type"), count, count * size, lineno)
    body.thread_arrays.append(arr)
    body.decl_lines.add(lineno)
    if racecheck and not arr.elem_type.startswith("simdgroup_"):
        indent = content[: len(content) - len(content.lstrip())]
        body.edits.append((start, start + len(content),
                           f'{indent}{am.group("align") or ""}tlm::local_array<{arr.elem_type}, {count}> {arr.name}("{arr.name}");'))
        body.tracked_locals.add(arr.name)
    return True


def _threadgroup_array(msl: str, content: str, lineno: int, start: int, body: _BodyDeclarations, *,
                       checked: bool) -> None:
    """Rewrite a `threadgroup T NAME[COUNT];` line to a slot of the shim's threadgroup memory."""
    dm = _TG_DECL_RE.match(content)
    if not dm:
        if not _TG_ANY_DECL_RE.search(content.split("//", 1)[0]):
            return
        raise _fail(
            "unsupported threadgroup declaration (expected `threadgroup T NAME[COUNT];` on its own line)",
            msl,
            lineno,
        )
    body.decl_lines.add(lineno)
    elem = dm.group("type")
    slot = len(body.threadgroup_arrays)
    arr = ThreadgroupArray(slot=slot, name=dm.group("name"), elem_type=elem, count=dm.group("count").strip(), line=lineno)
    body.threadgroup_arrays.append(arr)
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
    body.edits.append((start, start + len(content), rep))


def _checked_view_edits(found: list[tuple[re.Match[str], int, int, int]], views: list[ThreadgroupView]) -> list[_Edit]:
    """Checked builds: each pool view becomes a bounds-checked `tlm::threadgroup_view`."""
    edits = []
    for view_id, ((vm, _lineno, start, length), view) in enumerate(zip(found, views), start=1):
        end = -1 if view.end is None else view.end
        edits.append((
            start,
            start + length,
            f'{vm.group("indent")}tlm::checked_ptr<{view.elem_type}> {view.name} = tlm::threadgroup_view<{view.elem_type}>('
            f'{view.pool}, ({view.offset}), {end}, "{view.name}", {view_id});{vm.group("tail")}',
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


def _instrument_body(out: str, first_body_line: int, names: set[str], decl_lines: set[int], instrument: str) -> str:
    """Mark accesses on every body line except declarations (access_marks.py)."""
    out_lines = out.split("\n")
    for i in range(first_body_line, len(out_lines)):  # the body starts after the `) {` line
        if i + 1 in decl_lines:
            continue
        out_lines[i] = mark_line(out_lines[i], names, predicated_blocks=instrument == "counters")
    return "\n".join(out_lines)


_VIEW_EXTENT_RE = re.compile(r"//\s*(\d+) elements\b")


def _threadgroup_views(found: list[tuple[re.Match[str], int, int, int]]) -> list[ThreadgroupView]:
    """Each view's extent: the element count the printer writes after it (`// N elements`), else up
    to where the next view of the same pool starts (by literal byte offset; views at the same offset,
    whose lifetimes the storage planner overlapped, share the span up to the next one)."""
    offsets: dict[str, set[int]] = {}
    for vm, *_ in found:
        off = _int_literal(vm.group("off"))
        if off is not None:
            offsets.setdefault(vm.group("pool"), set()).add(off)
    views = []
    for vm, lineno, _start, _len in found:
        off = _int_literal(vm.group("off"))
        later = [o for o in offsets.get(vm.group("pool"), ()) if off is not None and o > off]
        declared = _VIEW_EXTENT_RE.search(vm.group("tail") or "")
        elem_bytes = type_bytes(vm.group("type"))
        if declared and off is not None and elem_bytes:
            later = [off + int(declared.group(1)) * elem_bytes]
        views.append(ThreadgroupView(
            name=vm.group("name"),
            elem_type=vm.group("type"),
            pool=vm.group("pool"),
            offset=vm.group("off").strip(),
            end=min(later) if later else None,
            line=lineno,
        ))
    return views
