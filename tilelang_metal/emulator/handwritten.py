"""The front door's reading of hand-written MSL in the printer's shape (docs/msl_contract.md).

Part of the front door for MSL the plugin did not write (with foreign/, which compiles free-form
foreign MSL): `with_artifact(msl)` reads a hand-written kernel written in the printer's fixed shape
(one `[[kernel]]` function, one parameter per `[[ buffer(i) ]]` or position attribute,
`threadgroup T NAME[COUNT];` declarations on their own lines, pool views, thread arrays, tile
pointers) and returns the same kernel as the printer would have spelled it, with its artifact line
(codegen/artifact.py) appended. From there on a hand-written kernel takes the plugin's own path: the
records drive signature.py's rewrites, the driver and the launch checks, so this module is the one
place where `compile_kernel`'s MSL is parsed (its access marks too: which accesses are stores,
predicated or shuffle operands, found by the printer's statement shapes where the printer records
them as it prints). Every declaration keeps its line (the artifact line
goes after the last one), so compiler diagnostics point at the original lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..codegen.artifact import (
    STANDARD,
    ArgStructParam,
    BufferParam,
    KernelArtifact,
    KernelRecord,
    Param,
    PositionParam,
    ScalarParam,
    ThreadArrayDecl,
    ThreadgroupArrayDecl,
    ThreadgroupViewDecl,
    TilePointerDecl,
)
from ..codegen import access_marks as codegen_marks
from ..codegen.kernel_text import matching_bracket
from ..core.dtypes import DTYPE_OF_MSL, MSL_SCALAR_BYTES, msl_type_bytes
from .mark_insertion import marked_names
from .driver import PRINT_FUNCTIONS
from .errors import EmulatorCompileError
from .foreign.kernel_entry import _param_attributes
from .foreign.source_scan import _mask, _matching
from .foreign.translation import _KERNEL_DEF_RE
from .signature import _check_position, _fail, _int_literal, _line_of

_MAX_THREADS_RE = re.compile(r"max_total_threads_per_threadgroup\s*\(\s*(\d+)\s*\)")
_TG_DECL_RE = re.compile(
    r"^(?P<indent>\s*)threadgroup\s+(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"\[(?P<count>[^\]\[]+)\]\s*(?:__attribute__\s*\(\(.*\)\)\s*|alignas\s*\([^)]*\)\s*)?;(?P<tail>\s*(?://.*)?)$"
)
# Anything that looks like a threadgroup variable declaration (type then name), anywhere on a line.
_TG_ANY_DECL_RE = re.compile(r"\bthreadgroup\s+(?:const\s+)?[A-Za-z_]\w*\s+[A-Za-z_]\w*")
# A typed view into a merged threadgroup pool: `threadgroup T* NAME = (threadgroup T*)(POOL + OFF);`
_TG_VIEW_RE = re.compile(
    r"^(?P<indent>\s*)threadgroup\s+(?P<type>[A-Za-z_]\w*)\s*\*\s*(?P<name>[A-Za-z_]\w*)\s*=\s*"
    r"\(\s*threadgroup\s+(?P=type)\s*\*\s*\)\s*\(\s*(?P<pool>[A-Za-z_]\w*)\s*\+\s*(?P<off>[^;]+?)\s*\)\s*;"
    r"(?P<tail>\s*(?://.*)?)$"
)
_VIEW_EXTENT_RE = re.compile(r"//\s*(\d+) elements\b")
# A tile pointer into a device buffer: `const device T* NAME = (BUF + (OFF));` (spec 1.4 `__src`).
_DEVICE_POINTER_RE = re.compile(
    r"^(?P<indent>\s*)(?P<const>const\s+)?device\s+(?P<type>[A-Za-z_]\w*)\s*\*\s*(?P<name>[A-Za-z_]\w*)\s*=\s*"
    r"(?P<value>\(\s*(?P<buf>[A-Za-z_]\w*)\s*\+.*\))\s*;(?P<tail>\s*(?://.*)?)$"
)
# A thread-private array: `T NAME[COUNT];` (the printer's T.alloc_local / fragments).
_THREAD_ARRAY_RE = re.compile(
    r"^\s*(?:alignas\((?P<align>\d+)\)\s+)?(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*\[(?P<count>[^\]\[]+)\]\s*;\s*(?://.*)?$"
)
_STRUCT_MEMBER_RE = re.compile(r"^(?P<type>[A-Za-z_]\w*)\s+[A-Za-z_]\w*\s*(?P<array>\[\s*2\s*\])?\s*;$")
# The printer's atomics (docs/msl_contract.md, "Atomics"): an atomic object cast of `NAME + offset`,
# the argument of an `atomic_*_explicit` function or a `__tlm_atomic_*` helper.
_ATOMIC_CAST_RE = re.compile(r"\(\s*(?:device|threadgroup)\s+atomic_(?:int|uint|float)\s*\*\s*\)\s*\(\s*([A-Za-z_]\w*)")
_ATOMIC_CALL_RE = re.compile(r"\b(?:atomic_\w+_explicit|__tlm_atomic_\w+)\s*\(")
_FLOAT_TYPES = frozenset({"float", "half", "bfloat"})
_PRINT_CALL = re.compile(r"\b(?:" + "|".join(PRINT_FUNCTIONS) + r")\s*\(")  # T.print's shim functions

_Edit = tuple[int, int, str]  # (start, end, replacement) on the original source


@dataclass
class _Reading:
    """The records read so far and the edits that re-spell the text as the printer would."""

    params: list[Param] = field(default_factory=list)
    threadgroup_arrays: list[ThreadgroupArrayDecl] = field(default_factory=list)
    threadgroup_views: list[ThreadgroupViewDecl] = field(default_factory=list)
    thread_arrays: dict[str, ThreadArrayDecl] = field(default_factory=dict)
    tile_pointers: dict[str, TilePointerDecl] = field(default_factory=dict)
    edits: list[_Edit] = field(default_factory=list)
    opening_at: int = 0  # offset of the kernel's opening (its attribute)


def record_of(msl: str) -> tuple[KernelRecord, list[_Edit]]:
    """The artifact record of the one hand-written kernel of `msl`, and the edits re-spelling its
    declarations in the printer's spelling (each keeping its line)."""
    reading = _Reading()
    name, max_threads, open_pos, close_pos = _kernel_header(msl, reading)
    _kernel_params(msl, open_pos, close_pos, reading)
    _body_declarations(msl, close_pos + 1, reading)
    targets, float_atomics, results_used = _atomics(msl[msl.rfind("\n", 0, open_pos) + 1 :], reading)
    opening_line = _line_of(msl, reading.opening_at) - 1  # 0-based; the kernel's marks count lines from it
    record = KernelRecord(
        name=name, params=tuple(reading.params), block=None, max_total_threads=max_threads,
        threadgroup_arrays=tuple(reading.threadgroup_arrays), threadgroup_views=tuple(reading.threadgroup_views),
        thread_arrays=tuple(reading.thread_arrays.values()), tile_pointers=tuple(reading.tile_pointers.values()),
        prints=_PRINT_CALL.search(msl) is not None,
        atomic_targets=targets, float_atomics=float_atomics, atomic_results_used=results_used,
    )
    body_lines = msl.split("\n")[_line_of(msl, close_pos) :]  # after the `) {` line; body lines keep their text
    marks, blocks = scan_access_marks(body_lines, marked_names(record), first=_line_of(msl, close_pos) - opening_line)
    return replace(record, access_marks=marks, predicated_blocks=blocks), reading.edits


def with_artifact(msl: str) -> str:
    """`msl` (hand-written, one kernel in the printer's shape) in the printer's spelling, its artifact
    line appended after the last line (EmulatorCompileError, one line, for a kernel of another shape:
    `compile_msl` runs free-form MSL)."""
    record, edits = record_of(msl)
    out = msl
    for s, e, rep in sorted(edits, key=lambda t: t[0], reverse=True):
        out = out[:s] + rep + out[e:]
    assert out.count("\n") == msl.count("\n"), "re-spelling must keep line numbers"
    line = KernelArtifact(convention=STANDARD, kernels=(record,)).line()
    return out + ("" if out.endswith("\n") or not out else "\n") + line + "\n"


def _atomics(kernel_text: str, reading: _Reading) -> tuple[tuple[str, ...], bool, bool]:
    """What the kernel's atomics update (sorted names), whether one is on float data, and whether the
    kernel reads a value one returns: a statement `atomic_...(...);` (or a parenthesised comma list of
    them) discards the values."""
    elem = {p.name: p.elem_type for p in reading.params if isinstance(p, BufferParam)}
    elem.update({a.name: a.elem_type for a in [*reading.threadgroup_arrays, *reading.threadgroup_views]})
    targets, float_atomics, results_used = set(), False, False
    for line in _mask(kernel_text).splitlines():
        for cast in _ATOMIC_CAST_RE.finditer(line):
            targets.add(cast.group(1))
            float_atomics |= elem.get(cast.group(1)) in _FLOAT_TYPES or "atomic_float" in cast.group(0)
        call = _ATOMIC_CALL_RE.search(line)
        if call and line[: call.start()].strip() not in ("", "("):
            results_used = True
    return tuple(sorted(targets)), float_atomics, results_used


def _kernel_header(msl: str, reading: _Reading) -> tuple[str, int | None, int, int]:
    """The single kernel's name, bound and parameter-list span; its opening re-spelled as printed."""
    kernels = list(_KERNEL_DEF_RE.finditer(_mask(msl)))
    if not kernels:
        raise EmulatorCompileError("no kernel found: expected `[[kernel, ...]] void NAME(` (docs/msl_contract.md)")
    if len(kernels) > 1:
        names = ", ".join(m.group("name") for m in kernels)
        raise _fail(f"expected one kernel per file, found {len(kernels)}: {names}", msl, _line_of(msl, kernels[1].start()))
    m = kernels[0]
    mt = _MAX_THREADS_RE.search(msl, m.start(), m.start("name"))
    max_threads = int(mt.group(1)) if mt else None
    open_pos = m.end() - 1
    try:
        close_pos = _matching(msl, open_pos)
    except EmulatorCompileError:
        raise EmulatorCompileError("kernel signature: unbalanced parentheses") from None
    name = m.group("name")
    opening = KernelRecord(name=name, params=(), block=None, max_total_threads=max_threads).opening()
    reading.opening_at = m.start()
    reading.edits.append((m.start(), m.end(), opening + "\n" * msl.count("\n", m.start(), m.end())))
    return name, max_threads, open_pos, close_pos


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


_RESTRICT = {"__restrict__", "__restrict", "restrict"}


def _kernel_params(msl: str, open_pos: int, close_pos: int, reading: _Reading) -> None:
    """Read every parameter, re-spelled as the printer spells it (buffer indices are checked
    against parameter order by the record-driven rewrite). The attributes are read as foreign/kernel_entry.py
    reads them; the declaration before them is a few words: `[const] device [const] T* [restrict]
    NAME`, `constant [const] T& NAME` or `T NAME`."""
    masked = _mask(msl)
    for s, e in _split_params(masked, open_pos + 1, close_pos):
        raw = msl[s:e]
        ps, pe = s + len(raw) - len(raw.lstrip()), e - (len(raw) - len(raw.rstrip()))
        line = _line_of(msl, ps)
        param = _param(" ".join(masked[s:e].split()), msl, line)
        if param is None:
            raise _fail(
                "unsupported kernel parameter (expected `[const] device T* __restrict NAME [[ buffer(i) ]]`, "
                "`constant T& NAME [[ buffer(i) ]]` or a position attribute)",
                msl,
                line,
            )
        reading.params.append(param)
        reading.edits.append((ps, pe, param.msl() + "\n" * msl.count("\n", ps, pe)))


def _param(text: str, msl: str, line: int) -> Param | None:
    """One parameter (whitespace collapsed), or None when it has none of the printer's shapes."""
    try:
        attrs = _param_attributes(text, f"line {line}")
    except EmulatorCompileError:
        return None
    if len(attrs) != 1 or not text.endswith("]]") or text.count("[[") != 1:
        return None
    attr, arg = attrs[0]
    words = text[: text.index("[[")].replace("*", " * ").replace("&", " & ").split()
    if not words or not words[-1].isidentifier():
        return None
    name, words = words[-1], words[:-1]
    if attr == "buffer" and arg is not None and arg.isdigit():
        return _buffer_param(words, name, int(arg), msl, line) or _scalar_param(words, name, int(arg), msl, line)
    if arg is None and len(words) == 1 and words[0].isidentifier():
        param = PositionParam(name=name, type=words[0], attribute=attr)
        _check_position(param, msl, line)
        return param
    return None


def _buffer_param(words: list[str], name: str, index: int, msl: str, line: int) -> BufferParam | None:
    """`[const] device [const] T * [restrict]` before the name."""
    while words and words[-1] in _RESTRICT:
        words = words[:-1]
    if len(words) < 3 or words[-1] != "*" or "device" not in words[:-2]:
        return None
    qualifiers, elem = words[:-2], words[-2]
    if set(qualifiers) - {"const", "device"} or qualifiers.count("device") != 1 or not elem.isidentifier():
        return None
    if elem not in DTYPE_OF_MSL:
        raise _fail(f"device buffer '{name}': unsupported element type '{elem}'", msl, line)
    return BufferParam(index=index, name=name, elem_type=elem, is_const="const" in qualifiers)


def _scalar_param(words: list[str], name: str, index: int, msl: str, line: int) -> ScalarParam | ArgStructParam | None:
    """`constant [const] T &` before the name: a scalar, or an argument struct of the file."""
    if words[:1] != ["constant"] or words[-1:] != ["&"]:
        return None
    middle = words[1:-1]
    if middle[:1] == ["const"]:
        middle = middle[1:]
    if len(middle) != 1 or not middle[0].isidentifier():
        return None
    elem = middle[0]
    if elem in DTYPE_OF_MSL:
        return ScalarParam(index=index, name=name, elem_type=elem)
    size = _arg_struct_size(msl, elem)
    if size is None:
        raise _fail(f"scalar parameter '{name}': unsupported type '{elem}'", msl, line)
    return ArgStructParam(index=index, name=name, struct_type=elem, size=size)


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
        bytes_ = MSL_SCALAR_BYTES.get(mm.group("type")) if mm else None
        if bytes_ is None or bytes_ * (2 if mm.group("array") else 1) != 8:
            return None
        size += 8
    return size


def _body_declarations(msl: str, body_start: int, reading: _Reading) -> None:
    """The body's thread arrays, tile pointers, pool views and threadgroup arrays, one per line."""
    offset = 0
    for lineno, ln in enumerate(msl.splitlines(keepends=True), start=1):
        start = offset
        offset += len(ln)
        if start < body_start:
            continue
        content = ln.rstrip("\r\n")
        indent = content[: len(content) - len(content.lstrip())]
        found = _thread_array(content) or _tile_pointer(content) or _view(content, reading) or _threadgroup_array(msl, content, lineno)
        if found is None:
            continue
        decl, spelled = found
        _check_redeclaration(msl, lineno, decl, reading)
        if isinstance(decl, ThreadArrayDecl):
            reading.thread_arrays.setdefault(decl.name, decl)
        elif isinstance(decl, TilePointerDecl):
            reading.tile_pointers.setdefault(decl.name, decl)
        elif isinstance(decl, ThreadgroupViewDecl):
            reading.threadgroup_views.append(decl)
        else:
            reading.threadgroup_arrays.append(decl)
        reading.edits.append((start, start + len(content), indent + spelled))


def _check_redeclaration(msl: str, lineno: int, decl: object, reading: _Reading) -> None:
    """A name is one record: a thread array or tile pointer may be declared again only as it was
    (one per loop body, as the printer does); threadgroup memory only once."""
    name = decl.name  # type: ignore[attr-defined]
    same_kind = {ThreadArrayDecl: reading.thread_arrays, TilePointerDecl: reading.tile_pointers}.get(type(decl))
    earlier = same_kind.get(name) if same_kind is not None else None
    if earlier is not None and earlier != decl:
        raise _fail(f"'{name}' is declared again with another type or size: give each declaration its own name", msl, lineno)
    shared = [*reading.threadgroup_arrays, *reading.threadgroup_views]
    others = [d.name for d in shared] + [n for group in (reading.thread_arrays, reading.tile_pointers) if group is not same_kind for n in group]
    if name in others:
        raise _fail(f"'{name}' is declared more than once: give each declaration its own name", msl, lineno)


def _thread_array(content: str) -> tuple[ThreadArrayDecl, str] | None:
    am = _THREAD_ARRAY_RE.match(content)
    count = _int_literal(am.group("count")) if am else None
    if not (am and count is not None and msl_type_bytes(am.group("type")) is not None):
        return None
    decl = ThreadArrayDecl(am.group("name"), am.group("type"), count, int(am.group("align") or 0))
    return decl, decl.msl()


def _tile_pointer(content: str) -> tuple[TilePointerDecl, str] | None:
    pm = _DEVICE_POINTER_RE.match(content)
    if not pm:
        return None
    decl = TilePointerDecl(pm.group("name"), pm.group("type"), bool(pm.group("const")), pm.group("buf"))
    return decl, f"{decl.prefix()}{pm.group('value')};"


def _view(content: str, reading: _Reading) -> tuple[ThreadgroupViewDecl, str] | None:
    vm = _TG_VIEW_RE.match(content)
    if not (vm and any(a.name == vm.group("pool") for a in reading.threadgroup_arrays)):
        return None
    declared = _VIEW_EXTENT_RE.search(vm.group("tail") or "")
    decl = ThreadgroupViewDecl(vm.group("name"), vm.group("type"), vm.group("pool"), vm.group("off").strip(),
                               int(declared.group(1)) if declared else None)
    return decl, decl.msl()


def _threadgroup_array(msl: str, content: str, lineno: int) -> tuple[ThreadgroupArrayDecl, str] | None:
    """`threadgroup T NAME[COUNT];` on its own line (COUNT a literal); other threadgroup variables are refused."""
    dm = _TG_DECL_RE.match(content)
    if not dm:
        if not _TG_ANY_DECL_RE.search(content.split("//", 1)[0]):
            return None
        raise _fail("unsupported threadgroup declaration (expected `threadgroup T NAME[COUNT];` on its own line)", msl, lineno)
    count = _int_literal(dm.group("count"))
    if count is None:
        raise _fail(f"threadgroup array '{dm.group('name')}': its size must be a literal element count, got `{dm.group('count').strip()}`",
                    msl, lineno)
    decl = ThreadgroupArrayDecl(dm.group("name"), dm.group("type"), count)
    return decl, decl.msl()




# ---------------------------------------------------------------------------- access marks
# The printer records which accesses are stores, predicated or shuffle operands as it prints them
# (codegen/access_marks.py); for hand-written MSL the front door reads them from the text, from the
# printer's fixed statement shapes: an access immediately followed by `=` is a store (`C[i] = v;`,
# `*(device half4*)(C + off) = v;`, the target of `atomic_store_explicit`); an access inside a
# branch of `?:` is predicated; an access inside the arguments of a shuffle (`simd_shuffle*`,
# `simd_broadcast`) is a shuffle operand; an `if` / `else` line ending in `{` opens a predicated
# block unless it carries the printer's `// threadgroup-uniform` note.
_ASSIGN_RE = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")
_ATOMIC_STORE_TARGET_RE = re.compile(r"atomic_store_explicit\(\([^()]*\*\)\($")
# The printer's comment on an `if` / `else` every thread of a threadgroup takes alike (the GEMM's
# interior/edge choice): such a branch masks no access, so it opens no predicated scope.
_UNIFORM_RE = re.compile(r"\{\s*// threadgroup-uniform\s*$")
_BLOCK_RE = re.compile(r"^\s*(?:\}\s*else\b\s*)?(?:if\s*\(.*\))?\s*\{\s*(?://.*)?$")


def _ternary_positions(line: str) -> list[bool]:
    """For each position: is it inside a branch of a `?:` (in the same or an enclosing bracket group)?"""
    inside = [False] * (len(line) + 1)
    stack = [False]
    for i, ch in enumerate(line):
        if ch == "/" and line[i : i + 2] == "//":
            break
        if ch in "([":
            stack.append(False)
        elif ch in ")]":
            if len(stack) > 1:
                stack.pop()
        elif ch in ";{}":
            stack = [False]
        elif ch == "?":
            stack[-1] = True
        inside[i] = any(stack)
    return inside


_SHUFFLE_RE = re.compile(r"\b(?:simd_shuffle(?:_xor|_up|_down)?|simd_broadcast)\s*$")


def _shuffle_operand_positions(line: str) -> list[bool]:
    """For each position: is it inside the argument list of a shuffle / broadcast call?"""
    inside = [False] * (len(line) + 1)
    stack: list[bool] = []
    for i, ch in enumerate(line):
        if ch == "/" and line[i : i + 2] == "//":
            break
        if ch == "(":
            stack.append(bool(_SHUFFLE_RE.search(line, 0, i)))
        elif ch == ")" and stack:
            stack.pop()
        inside[i] = any(stack)
    return inside


def _is_store(line: str, start: int, end: int) -> bool:
    rest = line[end:]
    bracket = re.match(r"\s*\[", rest)
    if bracket:
        close = matching_bracket(line, end + bracket.end() - 1, "[", "]")
        return close is not None and bool(_ASSIGN_RE.match(line, close + 1))
    before = line[:start].rstrip()
    if _ATOMIC_STORE_TARGET_RE.search(before):  # `atomic_store_explicit((T*)(C + off), v, ...)` writes C
        return True
    if before.endswith("("):
        close = matching_bracket(line, len(before) - 1)
        return close is not None and bool(_ASSIGN_RE.match(line, close + 1))
    return False


def scan_line(line: str, names: set[str]) -> tuple[list[tuple[int, int, str]], int | None]:
    """The marks of one line, (column, name length, kind) as codegen/access_marks.py spells them,
    and the column of the `{` when the line opens a predicated block (else None)."""
    if not names:
        return [], None
    pattern = re.compile(r"(?<![\w.>])(" + "|".join(sorted(map(re.escape, names))) + r")\b(?!\s*\()")
    ternary = _ternary_positions(line)
    shuffled = _shuffle_operand_positions(line) if "simd_" in line else None
    marks = []
    code_end = line.find("//")
    for m in pattern.finditer(line):
        if code_end >= 0 and m.start() >= code_end:
            break
        store = _is_store(line, m.start(), m.end())
        kind = codegen_marks.kind(is_store=store, is_predicated=ternary[m.start()],
                                  is_shuffled=shuffled is not None and shuffled[m.start()])
        if kind:
            marks.append((m.start(), m.end() - m.start(), kind))
    block = None
    if _BLOCK_RE.match(line) and re.search(r"\b(if|else)\b", line) and not _UNIFORM_RE.search(line):
        block = line.rindex("{")
    return marks, block


def scan_access_marks(lines: list[str], names: set[str], *, first: int) -> tuple[tuple[codegen_marks.Mark, ...], tuple[codegen_marks.Block, ...]]:
    """The marks and predicated blocks of the body `lines`, whose first is line `first` from the opening."""
    marks, blocks = [], []
    for k, line in enumerate(lines):
        found, block = scan_line(line, names)
        marks += [(first + k, col, length, kind) for col, length, kind in found]
        if block is not None:
            blocks.append((first + k, block))
    return tuple(marks), tuple(blocks)


__all__ = ["record_of", "scan_access_marks", "scan_line", "with_artifact"]
