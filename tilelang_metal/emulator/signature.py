"""Parsing of the kernel signature and the source rewrites that precede compilation.

The printer's output has a fixed shape (docs/msl_contract.md): one `[[kernel]]` function, one
parameter per line, device buffers as `[const] device T* __restrict NAME [[ buffer(i) ]]`, position
attributes, and threadgroup arrays declared one per line as `threadgroup T NAME[COUNT];`. The
rewrites keep every line where it was, so compiler diagnostics point at the original MSL lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
class KernelSignature:
    name: str
    cxx_name: str  # the function name in the compiled C++ (differs only for `main`)
    params: tuple[BufferParam | ScalarParam | PositionParam, ...]
    max_total_threads: int | None
    threadgroup_arrays: tuple[ThreadgroupArray, ...]

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


def rewrite(msl: str, *, checked: bool) -> RewrittenSource:
    """Parse the kernel signature and rewrite buffer parameters and threadgroup declarations."""
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
    lines = msl.splitlines(keepends=True)
    offset = 0
    line_edits: list[tuple[int, int, str]] = []
    for lineno, ln in enumerate(lines, start=1):
        start = offset
        offset += len(ln)
        if start < body_start:
            continue
        content = ln.rstrip("\r\n")
        dm = _TG_DECL_RE.match(content)
        if not dm:
            if not _TG_ANY_DECL_RE.search(content.split("//", 1)[0]):
                continue
            raise _fail(
                "unsupported threadgroup declaration (expected `threadgroup T NAME[COUNT];` on its own line)",
                msl,
                lineno,
            )
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

    out = msl
    for s, e, rep in sorted(edits + line_edits, key=lambda t: t[0], reverse=True):
        out = out[:s] + rep + out[e:]
    assert out.count("\n") == msl.count("\n"), "rewrite must keep line numbers"
    sig = KernelSignature(
        name=name,
        cxx_name=cxx_name,
        params=tuple(params), max_total_threads=max_threads, threadgroup_arrays=tuple(tg_arrays)
    )
    return RewrittenSource(signature=sig, text=out)
