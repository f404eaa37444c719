"""Foreign MSL to the shim's C++, line for line: function constants as constexpr values, threadgroup
storage declared in any function, address-space-qualified members and overloads, `kernel` keywords and
`[[host_name]]` instantiations; what each file declares (kernels, instantiations, function constants,
render-stage functions) is recorded for the front door. `_closure` translates the wrapper and every
header it includes from the include directories."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EmulatorCompileError
from .source_scan import _blank_keep_lines, _fill_lines, _line, _mask, _matching, _opening_paren, _split_top

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
