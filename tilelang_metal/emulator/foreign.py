"""The front door for MSL the plugin did not write (`compile_msl`): MLX's kernels, hand-written Metal.

The plugin's own MSL carries its artifact (codegen/artifact.py), whose records drive signature.py's
rewrites (hand-written MSL in the printer's fixed shape is parsed there line by line). Foreign MSL is free
C++: templates instantiated under a `[[host_name("...")]]`, parameters without `[[buffer(n)]]`
(Metal numbers them in order), `constant` structs by reference, `[[function_constant(n)]]` globals,
threadgroup arrays declared in kernels *and* in helper functions, address-space-qualified member
functions. This module owns all of that parsing: it translates the source and every header it
includes from `include_dirs` into C++ for the shim (keeping every line where it was, so diagnostics
point at the original lines), finds the kernel behind the host name, and generates a driver that
lets the C++ compiler work out the parameter types (so a template parameter `T` needs no parsing).

Checks of a foreign launch (see docs/emulator.md, "Foreign MSL"): argument kinds, dtypes and struct
sizes against the compiled types; device buffers sit against PROT_NONE guard pages, so an access
past a buffer's end (or far before its start) is an error naming the buffer, wherever it happens;
threadgroup memory counts against Metal's 32 KiB. Not checked: accesses inside threadgroup memory
and within the last 16 bytes of a buffer whose size is not a multiple of 16.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..codegen.kernel_text import matching_bracket
from ..isa import COUNTED
from . import toolchain
from .errors import EmulatorCompileError, EmulatorLaunchError, EmulatorRaceError, EmulatorRuntimeError
from .driver import launch_entry
from .signature import POSITION_ATTRIBUTES, check_buffer_slots

# foreign kernels' device buffers sit between guard pages; the runtime's fault handler reads them
_GUARD_FIELDS = "  p.guards = tlm::foreign::guards.regions;\n  p.nguards = tlm::foreign::guards.count;\n"

# What the real Metal compiler predefines for an MSL 3.2 (macOS 15) library, and nothing else: code
# that tests them (MLX's defines.h, logging.h) takes the path it takes on the GPU.
PREDEFINES = ("-D__METAL__=1", "-D__METAL_VERSION__=320")


def _mask(text: str) -> str:
    """`text` with comments, string and character literals blanked (same length, newlines kept), so
    the patterns below never match inside them."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum())):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _matching(masked: str, open_pos: int, open_ch: str = "(", close_ch: str = ")") -> int:
    close = matching_bracket(masked, open_pos, open_ch, close_ch)
    if close is None:
        raise EmulatorCompileError(f"unbalanced '{open_ch}' at offset {open_pos}")
    return close


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside (), [], {} and <> (template argument lists)."""
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    parts.append(text[last:])
    return [p for p in parts if p.strip()]


def _opening_paren(text: str) -> int:
    """Where the parenthesis that closes `text` opens."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise EmulatorCompileError(f"unbalanced ')' in {text!r}")


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _blank_keep_lines(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def _fill_lines(replacement: str, original: str) -> str:
    """`replacement` followed by the newlines `original` spanned, so the line count is kept."""
    return replacement + "\n" * original.count("\n")


# ---------------------------------------------------------------- translation of one file

_TG_KEYWORD_RE = re.compile(r"\bthreadgroup\b(?!_)")
_ATTR_TG_RE = re.compile(r"\[\[\s*threadgroup\s*\(\s*\d+\s*\)\s*\]\]")
_FUNC_CONST_RE = re.compile(
    r"\bconstant\s+(?P<type>[A-Za-z_][\w:]*)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\[\s*function_constant\s*\(\s*(?P<index>\d+)\s*\)\s*\]\]\s*;"
)
# A member function qualified with a non-thread address space: `complex_t() threadgroup : ...`.
_MEMBER_SPACE_RE = re.compile(r"\)(?P<cv>\s*const)?\s+(?P<space>threadgroup|device|constant)\b(?=\s*(?:[:{;=]|const\b|noexcept\b|$))", re.M)
# `[[kernel]]`, or `[[kernel, max_total_threads_per_threadgroup(...)]]` (MLX's steel attention), or
# the `kernel` keyword (Apple's samples), which attribute lists may follow
_ATTRIBUTES = r"(?:\s*\[\[[^\[\]]*\]\])*"
_KERNEL_ATTR = r"(?:\[\[\s*kernel\s*(?:,[^\[\]]*)?\]\]|\bkernel\b" + _ATTRIBUTES + ")"
# `template [[host_name("h")]] [[kernel]] decltype(f<A>) f<A>;`, or `... kernel void f<A>(params);`
_INSTANTIATION_RE = re.compile(r"\btemplate\s*\[\[\s*host_name\s*\(\s*\"(?P<host>[^\"]+)\"\s*\)\s*\]\]\s*" + _KERNEL_ATTR)
# The keyword is no C++: blanked where it qualifies a function (never an identifier named `kernel`).
_KERNEL_KEYWORD_RE = re.compile(r"\bkernel\b(?=" + _ATTRIBUTES + r"\s*void\b)")
# A render-stage function: `vertex T f(`, `fragment T f(` or `[[vertex]] T f(` (a kernel returns void).
_GRAPHICS_DEF_RE = re.compile(
    r"(?:\[\[\s*(?P<attr>vertex|fragment)\s*(?:,[^\[\]]*)?\]\]|\b(?P<keyword>vertex|fragment)\b)" + _ATTRIBUTES
    + r"\s*[A-Za-z_][\w:]*(?:\s*<[^;{}()]*>)?[\s&*]+(?P<name>[A-Za-z_]\w*)\s*\("
)
_KERNEL_DEF_RE = re.compile(_KERNEL_ATTR + r"\s*void\s+(?P<name>[A-Za-z_]\w*)\s*\(")
_HOST_NAMED_DEF_RE = re.compile(
    r"\[\[\s*host_name\s*\(\s*\"(?P<host>[^\"]+)\"\s*\)\s*\]\]\s*" + _KERNEL_ATTR + r"\s*void\s+(?P<name>[A-Za-z_]\w*)\s*\("
)
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"(?P<q>[^"]+)"|<(?P<a>[^>]+)>)', re.M)


@dataclass(frozen=True)
class FunctionConstant:
    name: str
    index: int
    type: str


@dataclass(frozen=True)
class Instantiation:
    """`template [[host_name("h")]] [[kernel]] decltype(f<A>) f<A>;` -> host name, callee, file, line."""

    host_name: str
    function: str  # `f`
    callee: str  # `f<A>` as written
    file: str
    line: int


@dataclass(frozen=True)
class KernelDefinition:
    name: str
    params_text: str  # the parameter list as written (between the parentheses), comments blanked
    file: str
    line: int
    body_text: str = ""  # the body (between the braces), comments blanked


@dataclass
class _Translated:
    text: str
    instantiations: list[Instantiation] = field(default_factory=list)
    kernels: list[KernelDefinition] = field(default_factory=list)
    host_named: dict[str, str] = field(default_factory=dict)  # host name -> function of a non-template kernel
    constants: list[FunctionConstant] = field(default_factory=list)
    graphics: list[tuple[str, str, str, int]] = field(default_factory=list)  # (vertex | fragment, name, file, line)


def _threadgroup_declaration_edits(masked: str, file: str) -> list[tuple[int, int, str]]:
    """`threadgroup T NAME[N]...;` (storage, in any function) -> a reference into the threadgroup's
    memory: `auto& NAME = tlm::foreign::threadgroup_variable<T[N]...>([] {});`. The lambda's closure
    type is distinct for every declaration *and* every template instantiation, so each gets its own
    storage, shared by the threads of a threadgroup. Pointer and reference declarations keep
    `threadgroup` (an empty macro)."""
    edits = []
    for m in _TG_KEYWORD_RE.finditer(masked):
        before = masked[: m.start()].rstrip()
        if before and before[-1] not in ";{}":
            continue  # a qualifier inside a type: parameter, cast, template argument
        end = masked.find(";", m.end())
        if end < 0:
            continue
        decl = masked[m.end() : end]
        if "(" in decl.split("[", 1)[0] or "=" in decl:
            continue  # not a plain variable declaration
        top = decl
        if any(c in re.sub(r"<[^<>]*>", "", top.split("[", 1)[0]) for c in "*&"):
            continue  # pointer or reference into threadgroup memory
        if len(_split_top(decl)) > 1:
            raise EmulatorCompileError(
                f"{file}:{_line(masked, m.start())}: several threadgroup variables in one declaration are not "
                "supported by the emulator: declare one per statement"
            )
        head, bracket, dims = decl.partition("[")
        words = re.match(r"(?P<type>.*?)(?P<name>[A-Za-z_]\w*)\s*$", head, re.S)
        if not words or not words.group("type").strip():
            continue
        elem = " ".join(words.group("type").split())
        dims_text = " ".join((bracket + dims).split())
        original = masked[m.start() : end + 1]
        rep = f"auto& {words.group('name')} = tlm::foreign::threadgroup_variable<{elem}{dims_text}>([] {{}});"
        edits.append((m.start(), end + 1, _fill_lines(rep, original)))
    return edits


def _declaration_start(masked: str, open_paren: int) -> int:
    """Where the declaration whose parameter list opens at `open_paren` starts (after the previous
    `;`, `{`, `}` or access specifier)."""
    depth = 0
    i = open_paren - 1
    while i >= 0:
        ch = masked[i]
        if ch in ")]>":
            depth += 1
        elif ch in "([<":
            depth -= 1
        elif depth <= 0 and ch in ";{}":
            break
        elif depth <= 0 and ch == ":" and re.search(r"\b(public|private|protected)\s*$", masked[:i]):
            break
        i -= 1
    j = i + 1
    while j < open_paren and masked[j].isspace():
        j += 1
    return j


def _member_space_edits(masked: str) -> list[tuple[int, int, str]]:
    """`T f() threadgroup` / `device` / `constant` member functions. C++ has no address spaces, so
    such an overload would redeclare the `thread` one: it is kept out of overload resolution (every
    object in the emulator is a thread object). A member that is not a template already becomes one,
    as only templates may carry a requires-clause."""
    edits = []
    for m in _MEMBER_SPACE_RE.finditer(masked):
        close = m.start()
        depth, i = 0, close
        while i >= 0:  # the parameter list's `(`
            if masked[i] == ")":
                depth += 1
            elif masked[i] == "(":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        start = _declaration_start(masked, i)
        space = ("threadgroup", "device", "constant").index(m.group("space")) + 1  # distinct, or they redeclare each other
        if masked.startswith("template", start):
            clause = f"requires(tlm::foreign::other_address_space<{space}>)"
        else:
            edits.append((start, start, "template <int TlmSpace = 0> "))
            clause = f"requires(tlm::foreign::other_address_space_of<TlmSpace, {space}>)"
        edits.append((close + 1, m.end(), f"{m.group('cv') or ''} {clause}"))
    return edits


_TEMPLATE_RE = re.compile(r"\btemplate\s*<")
_SPECIFIERS = {"constexpr", "inline", "static", "METAL_FUNC", "const"}


def _template_header_end(masked: str, open_pos: int) -> int | None:
    """The `>` closing the template parameter list opened at `open_pos`. Inside it, `<` opens a
    nested list only right after a name (`enable_if_t<`), so `sizeof(T) < 8` is a comparison; anything
    in parentheses is skipped."""
    depth, parens = 0, 0
    for i in range(open_pos, len(masked)):
        ch = masked[i]
        if ch == "(":
            parens += 1
        elif ch == ")":
            parens -= 1
        elif parens:
            continue
        elif ch == "<" and (i == open_pos or re.match(r"[\w>]", masked[i - 1])):
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                return i
        elif ch in ";{}":
            return None
    return None


def _address_space_overload_edits(masked: str) -> list[tuple[int, int, str]]:
    """A function template returning a non-thread address space (`template <class T> constexpr
    threadgroup X<T>& operator+=(threadgroup X<T>& a, ...)`) is one of a set of overloads that differ
    only in address spaces; it gets a requires-clause that keeps it out of overload resolution, like
    the member functions (the `thread` overload, unqualified, is the one C++ sees)."""
    edits = []
    for m in _TEMPLATE_RE.finditer(masked):
        close = _template_header_end(masked, m.end() - 1)
        if close is None:
            continue
        rest = masked[close + 1 :]
        stop = re.search(r"[(;{]", rest)
        if not stop or rest[stop.start()] != "(":
            continue
        words = rest[: stop.start()].split()
        while words and words[0] in _SPECIFIERS:
            words.pop(0)
        if not words or words[0] not in ("threadgroup", "device", "constant"):
            continue
        head = rest[: stop.start()]
        if "=" in head.replace("operator", "", 1).split("operator")[0] and "operator" not in head:
            continue
        space = ("threadgroup", "device", "constant").index(words[0]) + 1
        edits.append((close + 1, close + 1, f" requires(tlm::foreign::other_address_space<{space}>)"))
    return edits


_SPECIALIZATION_HEAD_RE = re.compile(r"\s*(?:struct|class)\s+[A-Za-z_]\w*\s*<")
_SPACE_WORD_RE = re.compile(r"\b(threadgroup|device|constant)\b")


def _address_space_specialization_edits(masked: str) -> list[tuple[int, int, str]]:
    """A class template partial specialization on a non-thread address space (`template <class T>
    struct pointer_element<device T*>`, MLX's steel/utils/type_traits.h) would redefine the `thread`
    one, as the spaces are empty here: it gets a requires-clause that is never satisfied, like the
    overloads above (distinct per space, so the specializations stay distinct)."""
    edits = []
    for m in _TEMPLATE_RE.finditer(masked):
        close = _template_header_end(masked, m.end() - 1)
        if close is None:
            continue
        head = _SPECIALIZATION_HEAD_RE.match(masked, close + 1)
        if not head:
            continue
        args_close = _template_header_end(masked, head.end() - 1)
        if args_close is None:
            continue
        space = _SPACE_WORD_RE.search(masked, head.end(), args_close)
        if space is None:
            continue
        index = ("threadgroup", "device", "constant").index(space.group(1)) + 1
        edits.append((close + 1, close + 1, f" requires(tlm::foreign::other_address_space<{index}>)"))
    return edits


def translate(text: str, file: str, function_constants: Mapping[int | str, Any]) -> _Translated:
    """Translate one file (the wrapper or a header) to the shim's C++, line for line."""
    masked = _mask(text)
    result = _Translated(text="")
    edits: list[tuple[int, int, str]] = []
    for m in _FUNC_CONST_RE.finditer(masked):
        fc = FunctionConstant(m.group("name"), int(m.group("index")), m.group("type"))
        result.constants.append(fc)
        value = function_constants.get(fc.index, function_constants.get(fc.name))
        if value is None:
            # Metal needs values only for the constants the specialised kernel uses (MLX's
            # sdpa_vector.h declares `blocks`, which only its 2-pass kernel reads): compile_msl
            # refuses a kernel whose body names it, and reading it anywhere else stops the launch
            # with an error naming it.
            edits.append((m.start(), m.end(),
                          f'static constexpr tlm::foreign::missing_function_constant<{fc.type}> {fc.name}{{"{fc.name}", {fc.index}}};'))
            continue
        literal = ("true" if value else "false") if isinstance(value, bool) else repr(value)
        edits.append((m.start(), m.end(), f"static constexpr {fc.type} {fc.name} = {literal};"))
    for m in _ATTR_TG_RE.finditer(masked):
        edits.append((m.start(), m.end(), " " * (m.end() - m.start())))
    edits.extend(_member_space_edits(masked))
    edits.extend(_address_space_overload_edits(masked))
    edits.extend(_address_space_specialization_edits(masked))
    instantiated: list[tuple[int, int]] = []
    for m in _INSTANTIATION_RE.finditer(masked):
        end = masked.find(";", m.end())
        body = masked[m.end() : end]
        dm = re.match(r"\s*decltype\s*\(", body)
        callee = body.strip()
        if dm:
            close = _matching(body, dm.end() - 1)
            callee = body[close + 1 :].strip()
        elif re.match(r"void\b", callee) and callee.endswith(")"):
            callee = callee[4 : _opening_paren(callee)].strip()  # `void f<A>(params)`: the declarator's name
        fm = re.match(r"([A-Za-z_][\w:]*)\s*<", callee)
        if not fm:
            raise EmulatorCompileError(f"{file}:{_line(masked, m.start())}: cannot read the instantiated kernel '{callee}'")
        result.instantiations.append(
            Instantiation(text[m.start("host") : m.end("host")], fm.group(1), " ".join(callee.split()), file, _line(masked, m.start()))
        )
        edits.append((m.start(), end + 1, _blank_keep_lines(masked[m.start() : end + 1])))
        instantiated.append((m.start(), end + 1))
    for m in _KERNEL_KEYWORD_RE.finditer(masked):
        if not any(a <= m.start() < b for a, b in instantiated):
            edits.append((m.start(), m.end(), " " * (m.end() - m.start())))
    for m in _GRAPHICS_DEF_RE.finditer(masked):
        before = masked[: m.start()].rstrip()
        if m.group("attr") or not before or before[-1] in ";{}>]":  # a declaration, not an identifier `vertex`
            result.graphics.append((m.group("attr") or m.group("keyword"), m.group("name"), file, _line(masked, m.start())))
    for m in _HOST_NAMED_DEF_RE.finditer(masked):
        result.host_named[text[m.start("host") : m.end("host")]] = m.group("name")
    for m in _KERNEL_DEF_RE.finditer(masked):
        close = _matching(masked, m.end() - 1)
        brace = masked.find("{", close)
        body = masked[brace + 1 : _matching(masked, brace, "{", "}")] if brace >= 0 else ""
        result.kernels.append(KernelDefinition(m.group("name"), masked[m.end() : close], file, _line(masked, m.start()), body))
    edits.extend(_threadgroup_declaration_edits(masked, file))
    out = text
    last = len(text) + 1
    for s, e, rep in sorted(edits, key=lambda t: t[0], reverse=True):
        if e > last:
            raise EmulatorCompileError(f"{file}:{_line(text, s)}: overlapping rewrites (emulator bug)")
        out = out[:s] + rep + out[e:]
        last = s
    assert out.count("\n") == text.count("\n"), "translation must keep line numbers"
    result.text = out
    return result


# ---------------------------------------------------------------- parameters

@dataclass(frozen=True)
class ForeignParam:
    """One kernel parameter: a `[[buffer(i)]]` binding (pointer or reference) or a position attribute."""

    position: int  # in the parameter list
    name: str
    text: str  # declaration as written (one line)
    buffer: int | None  # [[buffer(i)]], explicit or assigned in order
    attribute: str | None  # position attribute name
    function_constant: str | None = None  # `[[buffer(i), function_constant(c)]]`: present only if c is true
    enabled: bool = True  # False: c is false, the parameter does not exist (no launch argument)

    def describe(self) -> str:
        return f"parameter '{self.name}' (buffer {self.buffer}, `{self.text}`)"

    @property
    def space(self) -> str | None:
        """The binding's address space as written (`device` or `constant`), None for a position attribute."""
        if self.attribute is not None:
            return None
        m = _ADDRESS_SPACE_RE.search(_PARAM_ATTR_LIST_RE.sub("", self.text))
        return m.group(1) if m else None


_PARAM_ATTR_LIST_RE = re.compile(r"\[\[(?P<body>.*?)\]\]")
_PARAM_ATTR_RE = re.compile(r"^\s*(?P<attr>[A-Za-z_]\w*)\s*(?:\(\s*(?P<arg>[^()]*?)\s*\))?\s*$")
_ADDRESS_SPACE_RE = re.compile(r"\b(device|constant)\b")


def _param_attributes(one: str, where: str) -> list[tuple[str, str | None]]:
    """`[[buffer(5), function_constant(has_mask)]]` -> [("buffer", "5"), ("function_constant", "has_mask")]."""
    attrs = []
    for group in _PARAM_ATTR_LIST_RE.finditer(one):
        for item in _split_top(group.group("body")):
            m = _PARAM_ATTR_RE.match(item)
            if not m:
                raise EmulatorCompileError(f"{where}: cannot read the attribute `{item.strip()}`")
            attrs.append((m.group("attr"), m.group("arg")))
    return attrs


def parse_params(kernel: KernelDefinition, constants: Mapping[str, Any] | None = None) -> list[ForeignParam]:
    """Classify the kernel's parameters; buffer indices without an attribute are assigned in order,
    skipping the explicit ones (as Metal does). `constants` (function constant name -> value) decides
    which `function_constant(c)` parameters exist."""
    raw = _split_top(kernel.params_text)
    parsed = []
    explicit = set()
    for pos, text in enumerate(raw):
        one = " ".join(text.split())
        decl = _PARAM_ATTR_LIST_RE.sub("", one).strip()
        name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*$", decl)
        name = name_m.group(1) if name_m else f"#{pos}"
        where = f"{kernel.file}:{kernel.line}: kernel {kernel.name}, parameter '{name}'"
        attrs = _param_attributes(one, where)
        gate = next((arg for a, arg in attrs if a == "function_constant"), None)
        enabled = True
        if gate is not None:
            if constants is None or gate not in constants:
                known = ", ".join(sorted(constants or ())) or "none"
                raise EmulatorCompileError(f"{where}: function_constant({gate}) names no `[[function_constant(n)]]` "
                                           f"constant of the included files (known: {known})")
            enabled = bool(constants[gate])  # not None: compile_msl refused constants the parameters name without a value
        attrs = [(a, arg) for a, arg in attrs if a != "function_constant"]
        attr, arg = attrs[0] if attrs else (None, None)
        if len(attrs) > 1:
            raise EmulatorCompileError(f"{where}: several attributes ({', '.join(a for a, _ in attrs)}) are not supported")
        if attr == "buffer":
            if arg is None or not arg.isdigit():
                raise EmulatorCompileError(f"{where}: [[buffer({arg})]] needs a literal index")
            explicit.add(int(arg))
            parsed.append([pos, name, one, int(arg), None, gate, enabled])
        elif attr in POSITION_ATTRIBUTES:
            parsed.append([pos, name, one, None, attr, gate, enabled])
        elif attr is None:
            if not _ADDRESS_SPACE_RE.search(decl):
                raise EmulatorCompileError(f"{where}: no attribute and not a device/constant binding: `{one}`")
            parsed.append([pos, name, one, None, None, gate, enabled])
        elif attr == "threadgroup":
            raise EmulatorCompileError(
                f"{where}: [[threadgroup(n)]] kernel parameters (memory sized by the host) are not supported "
                "by the emulator: declare the array in the kernel"
            )
        else:
            raise EmulatorCompileError(f"{where}: unsupported attribute [[{attr}]]")
    next_index = 0
    out = []
    for pos, name, one, buf, attr, gate, enabled in parsed:
        if buf is None and attr is None:
            while next_index in explicit:
                next_index += 1
            buf = next_index
            explicit.add(buf)
        out.append(ForeignParam(pos, name, one, buf, attr, gate, enabled))
    indices = [p.buffer for p in out if p.buffer is not None]
    if len(set(indices)) != len(indices):
        raise EmulatorCompileError(
            f"{kernel.file}:{kernel.line}: kernel {kernel.name}: buffer indices {sorted(indices)} repeat (bindings that "
            "share an index under complementary function constants are not supported by the emulator)"
        )
    check_buffer_slots(f"{kernel.file}:{kernel.line}: kernel {kernel.name}", indices)
    return out


# ---------------------------------------------------------------- include closure

@dataclass(frozen=True)
class _Closure:
    files: dict[str, _Translated]  # build-relative path -> translation
    include_dirs: tuple[str, ...]  # build-relative include roots, in order


def _closure(source: str, include_dirs: Sequence[Path], constants: Mapping[int | str, Any]) -> _Closure:
    """Translate the wrapper and every file it reaches through `#include` inside `include_dirs`
    (headers outside them, e.g. `<metal_stdlib>`, are the shim's)."""
    roots = [Path(d).resolve() for d in include_dirs]
    for r in roots:
        if not r.is_dir():
            raise EmulatorCompileError(f"include directory {r} does not exist")
    files: dict[str, _Translated] = {}
    main = "main.metal"
    files[main] = translate(source, "<source>", constants)
    pending: list[tuple[str, Path | None, str]] = [(main, None, source)]
    seen: set[Path] = set()
    while pending:
        _rel, path, text = pending.pop()
        for m in _includes(text):
            target = m.group("q") or m.group("a")
            candidates = ([path.parent / target] if (m.group("q") and path is not None) else []) + [r / target for r in roots]
            found = next((c.resolve() for c in candidates if c.is_file()), None)
            if found is None or found in seen:
                continue
            root_index = next((i for i, r in enumerate(roots) if found.is_relative_to(r)), None)
            if root_index is None:
                continue
            seen.add(found)
            rel = f"inc{root_index}/{found.relative_to(roots[root_index]).as_posix()}"
            body = found.read_text()
            files[rel] = translate(body, str(found.relative_to(roots[root_index])), constants)
            pending.append((rel, found, body))
    return _Closure(files, tuple(f"inc{i}" for i in range(len(roots))))


def _includes(text: str) -> list[re.Match[str]]:
    """The `#include` directives of `text` that are not inside a comment."""
    masked = _mask(text)
    return [m for m in _INCLUDE_RE.finditer(text) if "#" in masked[m.start() : m.end()]]


# ---------------------------------------------------------------- driver

def _position_arg(p: ForeignParam, ptype: str) -> str:
    comps, _width = POSITION_ATTRIBUTES[p.attribute]
    padded = list(comps) + ["0u"] * (3 - len(comps))
    return f"tlm::foreign::position<{ptype}>({', '.join(padded)})"


def _buffer_slots(params: Sequence[ForeignParam]) -> list[ForeignParam]:
    """Every [[buffer(i)]] parameter (present or not) in index order: the driver's `__buf[slot]`."""
    return sorted((p for p in params if p.buffer is not None), key=lambda p: p.buffer)


def _driver(callee: str, params: list[ForeignParam], host_name: str) -> str:
    slot_of = {p.buffer: i for i, p in enumerate(_buffer_slots(params))}
    args = []
    for p in params:
        ptype = f"tlm::foreign::param_t<{p.position}, decltype(&{callee})>"
        if p.attribute is not None:
            args.append(_position_arg(p, ptype))
        else:
            args.append(f"tlm::foreign::bind<{ptype}>(__buf[{slot_of[p.buffer]}])")
    bound = sorted((p for p in params if p.buffer is not None), key=lambda p: p.buffer)
    info = "\n".join(
        f"    case {p.buffer}: tlm::foreign::describe<tlm::foreign::param_t<{p.position}, decltype(&{callee})>>(out); return 1;"
        for p in bound
    )
    arg_text = ",\n      ".join(args)
    return f"""
#line 1 "tlm_driver"
// Generated by tilelang_metal.emulator.foreign for host name {host_name} ({callee}).
namespace {{
void tlm_entry(const tlm::rt::lane_info& __li, void* const* __buf, const int64_t* __n) {{
  (void)__li; (void)__buf; (void)__n;
  {callee}(
      {arg_text});
}}
}}  // namespace

extern "C" __attribute__((visibility("default"))) int tlm_param_info(int index, int64_t* out) {{
  switch (index) {{
{info}
    default: return 0;
  }}
}}

{launch_entry(False, _GUARD_FIELDS)}
extern "C" __attribute__((visibility("default"))) void tlm_set_guards(const tlm::rt::guard_region* r, uint32_t n) {{
  tlm::foreign::guards.regions = r;
  tlm::foreign::guards.count = n;
}}

extern "C" __attribute__((visibility("default"))) const char* tlm_shim_version() {{ return TLM_SHIM_VERSION; }}
"""


# ---------------------------------------------------------------- compile

# Element codes of shim/tlm/foreign.h (scalar_code) -> torch dtype names.
_SCALAR_CODES = {
    1: "bool", 2: "int8", 3: "uint8", 4: "int16", 5: "uint16", 6: "int32", 7: "uint32",
    8: "int64", 9: "uint64", 10: "float16", 11: "bfloat16", 12: "float32",
}


@dataclass(frozen=True)
class Binding:
    """What a [[buffer(i)]] parameter takes, as the compiled kernel declares it."""

    param: ForeignParam
    by_reference: bool  # `constant T& x`: a value (number, struct bytes), else a pointer to a buffer
    pointee_bytes: int
    dtype: str | None  # torch dtype name of the element (None: a struct)
    lanes: int  # vector width of the pointee (1: scalar)
    const: bool


def _find_kernel(host_name: str, closure: _Closure) -> tuple[str, KernelDefinition]:
    """The callee (`f<A...>` or `f`) and the definition of the kernel `host_name` names."""
    insts = [i for t in closure.files.values() for i in t.instantiations if i.host_name == host_name]
    plain = [t.host_named[host_name] for t in closure.files.values() if host_name in t.host_named]
    definitions = [k for t in closure.files.values() for k in t.kernels]
    if insts:
        inst = insts[0]
        callee, function = inst.callee, inst.function.split("::")[-1]
    elif plain:
        callee = function = plain[0]
    elif any(k.name == host_name for k in definitions):
        callee = function = host_name
    else:
        known = sorted({i.host_name for t in closure.files.values() for i in t.instantiations}
                       | {k.name for k in definitions})
        raise EmulatorCompileError(
            f"no kernel named '{host_name}' in the source: instantiate it with "
            f"`template [[host_name(\"{host_name}\")]] [[kernel]] decltype(f<...>) f<...>;` (known: {', '.join(known) or 'none'})"
        )
    matches = [k for k in definitions if k.name == function]
    if not matches:
        raise EmulatorCompileError(f"kernel '{host_name}' instantiates {callee}, but no `[[kernel]] void {function}(` is defined in the included files")
    if len({(k.file, k.line) for k in matches}) > 1:
        where = ", ".join(f"{k.file}:{k.line}" for k in matches)
        raise EmulatorCompileError(f"kernel '{host_name}': several `[[kernel]] void {function}(` definitions ({where}); the emulator cannot tell which one is meant")
    return callee, matches[0]


def _refuse_graphics_functions(kernel_name: str, closure: _Closure) -> None:
    """Vertex and fragment functions are render stages, not compute kernels: the emulator has no
    rasterizer, stage_in or textures to run or even compile them."""
    graphics = [g for t in closure.files.values() for g in t.graphics]
    asked = [g for g in graphics if g[1] == kernel_name]
    if asked:
        kind, name, file, line = asked[0]
        raise EmulatorCompileError(f"{file}:{line}: '{name}' is a {kind} function, not a compute kernel: the emulator runs only `kernel void` / `[[kernel]]` functions")
    if graphics:
        kind, name, file, line = graphics[0]
        raise EmulatorCompileError(
            f"{file}:{line}: {kind} function '{name}' is a render stage the emulator cannot compile: "
            f"pass compile_msl the source of kernel '{kernel_name}' without it"
        )


def _constant_values(closure: _Closure, constants: Mapping[int | str, Any]) -> dict[str, Any]:
    """Function constant name -> the value given for it (by index or by name)."""
    return {fc.name: constants.get(fc.index, constants.get(fc.name))
            for t in closure.files.values() for fc in t.constants}


_compile_lock = threading.Lock()
_memo: dict[str, ForeignKernel] = {}


def compile_msl(
    source: str,
    kernel_name: str,
    *,
    include_dirs: Sequence[str | Path] = (),
    function_constants: Mapping[int | str, bool | int | float] | None = None,
    instrument: str | None = None,
) -> ForeignKernel:
    """Compile the kernel `kernel_name` (a host name or a plain kernel's name) of MSL `source` that
    the plugin did not write, with headers from `include_dirs`; `function_constants` gives every
    `[[function_constant(n)]]` a value (by index or by name). `instrument` builds the "counters" or
    "racecheck" flavour (ForeignKernel.counters / .racecheck build theirs on demand)."""
    constants = dict(function_constants or {})
    closure = _closure(source, [Path(d) for d in include_dirs], constants)
    _refuse_graphics_functions(kernel_name, closure)
    callee, definition = _find_kernel(kernel_name, closure)
    for name, value in _constant_values(closure, constants).items():
        if value is None and re.search(rf"\b{re.escape(name)}\b", definition.body_text + definition.params_text):
            index = next(fc.index for t in closure.files.values() for fc in t.constants if fc.name == name)
            raise EmulatorCompileError(
                f"kernel '{kernel_name}': function constant '{name}' (index {index}) has no value: "
                f"pass function_constants={{{index}: ...}} to compile_msl"
            )
    params = parse_params(definition, _constant_values(closure, constants))
    driver = _driver(callee, params, kernel_name)
    main = closure.files["main.metal"].text
    extra = tuple(sorted((rel, t.text) for rel, t in closure.files.items() if rel != "main.metal"))
    flags = (*PREDEFINES, *(f"-I{d}" for d in closure.include_dirs))
    traced = instrument == "counters" and toolchain.memory_trace_unavailable() is None
    if traced:
        flags += toolchain.MEMORY_TRACE_FLAGS
    safe = re.sub(r"\W", "_", kernel_name)[:40]
    unit = toolchain.SourceUnit(safe, source, main, driver, extra_files=extra, extra_flags=flags)
    key = hashlib.sha256((unit.text + repr(extra) + repr(flags) + str(instrument)).encode()).hexdigest()
    memo_key = f"{key}:{toolchain.cache_dir()}:{toolchain.compiler()}:{toolchain.fiber_flavour()}"
    with _compile_lock:
        hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    lib = toolchain.kernel_library(unit, True, instrument)
    kernel = ForeignKernel(kernel_name, callee, params, lib, unit, instrument,
                           source=source, include_dirs=tuple(str(d) for d in include_dirs), constants=constants,
                           memory_traced=traced)
    with _compile_lock:
        _memo[memo_key] = kernel
    return kernel


# ---------------------------------------------------------------- launch

_PAGE = mmap.PAGESIZE
_ABSENT_TRACED_BYTES = 4096  # zeros behind an absent buffer in the traced counters build (see launch)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_NONE = 0


class _GuardRegion(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_void_p), ("hi", ctypes.c_void_p), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_uint64), ("name", ctypes.c_char_p), ("buffer", ctypes.c_int32),
                ("traced", ctypes.c_int32)]


class _Guarded:
    """`nbytes` of memory whose end touches a PROT_NONE page (a second one lies a page below its
    first page): reads and writes past the end fault. The start is 16-byte aligned, so up to 15 bytes
    past the end of a buffer whose size is not a multiple of 16 are not caught."""

    def __init__(self, nbytes: int) -> None:
        padded = (nbytes + 15) // 16 * 16
        data_pages = max(1, (padded + _PAGE - 1) // _PAGE)
        self.total = (data_pages + 2) * _PAGE
        self.map = mmap.mmap(-1, self.total)
        self._view = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._view)
        back = self.base + (data_pages + 1) * _PAGE
        self.address = back - padded
        self.nbytes = nbytes
        for page in (self.base, back):
            if _libc.mprotect(page, _PAGE, _PROT_NONE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect of a guard page failed")
        self.guard_lo, self.guard_hi = self.base, self.base + self.total

    def close(self) -> None:
        for page in (self.base, self.base + self.total - _PAGE):
            _libc.mprotect(page, _PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
        del self._view
        self.map.close()


class ForeignKernel:
    """A compiled foreign kernel. `launch(args, grid, block)`: one argument per [[buffer(i)]] in index
    order (a CPU tensor for a pointer; a number, one-element tensor or the struct's bytes for a
    `constant T&`); `grid` counts threadgroups (MTLCommandEncoder.dispatchThreadgroups)."""

    def __init__(self, name: str, callee: str, params: list[ForeignParam], library: Path, unit: toolchain.SourceUnit,
                 instrument: str | None, *, source: str, include_dirs: tuple[str, ...], constants: dict,
                 memory_traced: bool = False) -> None:
        from .kernel import _load

        self.name = name
        self.callee = callee
        self.params = tuple(params)
        self.library_path = library
        self.unit = unit
        self.instrument = instrument
        self.memory_traced = memory_traced  # counters flavour built with memory tracing (MEMORY_COUNTERS count)
        self._rebuild = (source, include_dirs, constants)
        self._lib = _load(library)
        self._lib.tlm_param_info.restype = ctypes.c_int
        self._lib.tlm_param_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
        self._lib.tlm_set_guards.restype = None
        self._lib.tlm_set_guards.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        self._lock = threading.Lock()
        # every buffer parameter, in index order (the driver's slots); bindings: those that exist,
        # one launch argument each (a `function_constant(c)` parameter with c false has none)
        self.slots = tuple(_buffer_slots(params))
        self.bindings = tuple(self._describe(p) for p in self.slots if p.enabled)

    def __repr__(self) -> str:
        return f"ForeignKernel({self.name!r}, {self.callee!r})"

    def _describe(self, p: ForeignParam) -> Binding:
        out = (ctypes.c_int64 * 5)()
        if not self._lib.tlm_param_info(p.buffer, out):  # pragma: no cover - generated together
            raise EmulatorCompileError(f"kernel {self.name}: no type information for buffer {p.buffer}")
        return Binding(p, bool(out[0]), int(out[1]), _SCALAR_CODES.get(int(out[2])), int(out[3]), bool(out[4]))

    def _flavour(self, instrument: str) -> ForeignKernel:
        if self.instrument == instrument:
            return self
        source, include_dirs, constants = self._rebuild
        return compile_msl(source, self.name, include_dirs=include_dirs, function_constants=constants, instrument=instrument)

    def _argument_bytes(self, b: Binding, value: Any) -> tuple[bytes | None, Any]:
        """(bytes to place, tensor to copy back into or None) for one binding."""
        import torch

        what = f"kernel {self.name}: {b.param.describe()}"
        if b.by_reference:
            if b.dtype is None:  # a struct by reference
                if isinstance(value, ctypes.Structure):
                    value = bytes(value)
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise EmulatorLaunchError(f"{what}: expected the struct's {b.pointee_bytes} bytes (bytes or a ctypes.Structure), got {type(value).__name__}")
                if len(value) != b.pointee_bytes:
                    raise EmulatorLaunchError(f"{what}: the struct has {b.pointee_bytes} bytes, got {len(value)}: check the field layout")
                return bytes(value), None
            dtype = getattr(torch, b.dtype)
            if isinstance(value, torch.Tensor):
                if value.numel() != b.lanes or value.dtype != dtype:
                    raise EmulatorLaunchError(f"{what}: expected {b.lanes} {dtype} value(s), got a {value.dtype} tensor of shape {tuple(value.shape)}")
                held = value.detach().cpu().reshape(-1).contiguous()
            else:
                values = list(value) if isinstance(value, (list, tuple)) else [value]
                if len(values) != b.lanes or not all(isinstance(v, (bool, int, float)) for v in values):
                    raise EmulatorLaunchError(f"{what}: expected {b.lanes} number(s), got {value!r}")
                held = torch.tensor(values, dtype=dtype)
                if not dtype.is_floating_point and held.tolist() != [int(v) for v in values]:
                    raise EmulatorLaunchError(f"{what}: {value!r} does not fit in {dtype}")
            return held.view(torch.uint8).numpy().tobytes(), None
        if b.dtype is None and isinstance(value, (ctypes.Structure, bytes, bytearray, memoryview)):
            # a pointer to structs (`const constant AttnParams* params`, set with setBytes): their bytes
            raw = bytes(value)
            if not raw or len(raw) % b.pointee_bytes:
                raise EmulatorLaunchError(f"{what}: {len(raw)} bytes is not a whole number of {b.pointee_bytes}-byte structs: check the field layout")
            return raw, None
        if not isinstance(value, torch.Tensor):
            raise EmulatorLaunchError(f"{what}: expected a torch.Tensor, got {type(value).__name__}")
        if value.device.type != "cpu" or not value.is_contiguous():
            raise EmulatorLaunchError(f"{what}: the tensor must be a contiguous CPU tensor")
        if b.dtype is not None and value.dtype != getattr(torch, b.dtype):
            raise EmulatorLaunchError(f"{what}: expected dtype torch.{b.dtype}, got {value.dtype}")
        nbytes = value.numel() * value.element_size()
        if nbytes % b.pointee_bytes:
            raise EmulatorLaunchError(f"{what}: {nbytes} bytes is not a whole number of {b.pointee_bytes}-byte elements")
        return None, value

    def launch(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int], *, workers: int | None = None,
               _instrumentation: tuple[int, int, int] | None = None) -> None:
        """Run over `grid` threadgroups of `block` threads; results land in the tensors."""
        from ..limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES
        from .kernel import DEFAULT_STACK_BYTES, _dims, default_workers

        if len(args) != len(self.bindings):
            names = ", ".join(b.param.name for b in self.bindings)
            absent = [p for p in self.slots if not p.enabled]
            why = f"; absent: {', '.join(f'{p.name} ({p.function_constant} is false)' for p in absent)}" if absent else ""
            raise EmulatorLaunchError(f"kernel {self.name} takes {len(self.bindings)} buffer argument(s) ({names}{why}), got {len(args)}")
        g, blk = _dims(grid, "grid"), _dims(block, "block")
        if blk[0] * blk[1] * blk[2] > MAX_THREADS_PER_THREADGROUP:
            raise EmulatorLaunchError(f"kernel {self.name}: block {blk} has more than {MAX_THREADS_PER_THREADGROUP} threads")
        prepared = [self._argument_bytes(b, a) for b, a in zip(self.bindings, args)]
        by_buffer = {b.param.buffer: (b, item) for b, item in zip(self.bindings, prepared)}
        regions: list[_Guarded] = []
        try:
            table = (_GuardRegion * max(1, len(self.slots)))()
            names = []
            for i, p in enumerate(self.slots):
                if p.enabled:
                    b, (raw, tensor) = by_buffer[p.buffer]
                    names.append(p.name.encode())
                    nbytes = len(raw) if raw is not None else tensor.numel() * tensor.element_size()
                elif self.memory_traced:
                    # The traced build is -O0: it evaluates reads the optimizer (and Metal's) drops as
                    # dead, e.g. MLX's steel GEMM reads the absent addmm_params to build an epilogue it
                    # never applies. Here an absent buffer reads as zeros and is not counted; the
                    # plain and racecheck builds keep the error below.
                    raw, nbytes = bytes(_ABSENT_TRACED_BYTES), _ABSENT_TRACED_BYTES
                    names.append(f"{p.name} (absent: function_constant({p.function_constant}) is false)".encode())
                else:  # absent: no bytes, so any access faults on the guard page and names why
                    raw, nbytes = b"", 0
                    names.append(f"{p.name} (absent: function_constant({p.function_constant}) is false)".encode())
                region = _Guarded(nbytes)
                regions.append(region)
                if raw is not None:
                    ctypes.memmove(region.address, raw, nbytes)
                elif nbytes:
                    ctypes.memmove(region.address, tensor.data_ptr(), nbytes)
                table[i] = _GuardRegion(region.guard_lo, region.guard_hi, region.address, nbytes, names[i], p.buffer,
                                        int(p.enabled and p.space == "device"))
            n = len(regions)
            ptrs = (ctypes.c_void_p * max(n, 1))(*[r.address for r in regions])
            counts = (ctypes.c_int64 * max(n, 1))(*[r.nbytes for r in regions])
            err = ctypes.create_string_buffer(4096)
            nworkers = default_workers() if workers is None else int(workers)
            mode, counters, seed = _instrumentation or (0, 0, 0)
            with self._lock:
                if self.instrument is not None:
                    self._lib.tlm_instrument(mode, counters or None, seed)
                self._lib.tlm_set_guards(ctypes.addressof(table), n)
                rc = self._lib.tlm_launch(ptrs, counts, (ctypes.c_uint32 * 3)(*g), (ctypes.c_uint32 * 3)(*blk), nworkers,
                                          4 * DEFAULT_STACK_BYTES, THREADGROUP_MEMORY_BYTES, err, 4096)
                self._lib.tlm_set_guards(None, 0)
            if rc == 2:
                raise EmulatorRaceError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
            if rc != 0:
                raise EmulatorRuntimeError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
            for p, region in zip(self.slots, regions):
                if not p.enabled:
                    continue
                b, (raw, tensor) = by_buffer[p.buffer]
                if tensor is not None and not b.const and region.nbytes:
                    ctypes.memmove(tensor.data_ptr(), region.address, region.nbytes)
        finally:
            for r in regions:
                r.close()

    def counters(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int]) -> dict[str, int]:
        """Counts of one launch (totals): barriers, simd collectives, matrix instructions and, when the
        compiler can trace memory (clang; `memory_counts_unavailable()` says why not), the memory
        traffic of MEMORY_COUNTERS, counted from the kernel's own loads and stores by address (see
        docs/emulator.md, "Foreign MSL"). Counters the emulator cannot count for foreign MSL are left
        out rather than reported as 0: predicated accesses always, memory traffic without clang."""
        from .instrument import _MODE_COUNTERS, COUNTER_NAMES
        from .kernel import _dims

        k = self._flavour("counters")
        ngroups = 1
        for d in _dims(grid, "grid"):
            ngroups *= d
        rows = (ctypes.c_uint64 * max(1, ngroups * len(COUNTER_NAMES)))()
        k.launch(args, grid, block, _instrumentation=(_MODE_COUNTERS, ctypes.addressof(rows), 0))
        names = _FOREIGN_COUNTERS + (MEMORY_COUNTERS if k.memory_traced else ())
        total = dict.fromkeys(names, 0)
        for gi in range(ngroups):
            for i, name in enumerate(COUNTER_NAMES):
                if name in total:
                    total[name] += int(rows[gi * len(COUNTER_NAMES) + i])
        return total

    def racecheck(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int], *,
                  seeds: Sequence[int] = (0, 1, 2)) -> None:
        """Run once per schedule seed (threads of a threadgroup and threadgroups in seeded orders) on
        copies of the arguments and require bitwise-identical outputs; the first schedule's results
        land in `args`. Foreign kernels' individual accesses are not tracked, so this finds races whose
        outcome depends on the order (a missing barrier before a read of shared data), not every race."""
        import torch

        from .instrument import _MODE_RACECHECK, _first_difference

        k = self._flavour("racecheck")
        if not seeds:
            raise ValueError("racecheck needs at least one seed")
        runs = []
        for seed in seeds:
            copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            try:
                k.launch(copies, grid, block, workers=1, _instrumentation=(_MODE_RACECHECK, 0, int(seed)))
            except EmulatorRaceError as e:
                raise EmulatorRaceError(f"{e} (schedule seed {seed})") from None
            runs.append(copies)
        for seed, run in zip(seeds[1:], runs[1:]):
            for i, (first, other) in enumerate(zip(runs[0], run)):
                if isinstance(first, torch.Tensor):
                    diff = _first_difference(first, other)
                    if diff is not None:
                        raise EmulatorRaceError(
                            f"kernel {self.name}: outputs depend on the schedule: buffer {self.bindings[i].param.buffer} "
                            f"('{self.bindings[i].param.name}') element {diff[0]} is {diff[1]!r} with seed {seeds[0]} "
                            f"and {diff[2]!r} with seed {seed}"
                        )
        for a, r in zip(args, runs[0]):
            if isinstance(a, torch.Tensor):
                a.copy_(r)


_FOREIGN_COUNTERS = ("threadgroup_barriers", "memory_barriers", "lockstep_barriers", "simdgroup_barriers",
                     "simd_collectives") + tuple(inst.counter for inst in COUNTED)
# Memory traffic, counted for foreign kernels when the compiler can trace it (memory_counts_unavailable).
MEMORY_COUNTERS = (
    "device_load_instructions", "device_load_bytes", "device_store_instructions", "device_store_bytes",
    "threadgroup_load_instructions", "threadgroup_load_bytes", "threadgroup_store_instructions",
    "threadgroup_store_bytes", "narrow_device_loads",
    "load_instructions", "store_instructions", "unique_device_load_bytes", "device_transactions", "threadgroup_replays",
)


def memory_counts_unavailable() -> str | None:
    """Why ForeignKernel.counters leaves memory traffic out with this emulator compiler, or None."""
    return toolchain.memory_trace_unavailable()
