"""Source marks for the instrumented flavours (counters, racecheck).

The shim cannot tell a load from a store through `T&`, so the rewrite marks them where the printer's
fixed statement shapes make it plain: an access immediately followed by `=` is a store
(`C[i] = v;`, `*(device half4*)(C + off) = v;`) and becomes `C.w()[i]` / `(C.w() + off)`; an access
inside a branch of `?:` (the printer's masked loads) is predicated and becomes `A.p()`. `if`/`else`
blocks open a `tlm::predicated_scope`, so every access executed inside them counts as predicated,
except the branches the printer marks `// threadgroup-uniform` (no thread is masked).
An access inside the arguments of a shuffle (`simd_shuffle*`, `simd_broadcast`) is a lane's
contribution that other lanes may or may not take, and becomes `A.s()` (racecheck does not require
a thread array read there to be initialized). Lines keep their numbers.
"""

from __future__ import annotations

import re

_ASSIGN_RE = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")
_ATOMIC_STORE_TARGET_RE = re.compile(r"atomic_store_explicit\(\([^()]*\*\)\($")
# The printer's comment on an `if` / `else` every thread of a threadgroup takes alike (the GEMM's
# interior/edge choice): such a branch masks no access, so it opens no predicated scope.
_UNIFORM_RE = re.compile(r"\{\s*// threadgroup-uniform\s*$")
_BLOCK_RE = re.compile(r"^\s*(?:\}\s*else\b\s*)?(?:if\s*\(.*\))?\s*\{\s*(?://.*)?$")


def _matching(line: str, open_pos: int) -> int:
    opener = line[open_pos]
    closer = {"(": ")", "[": "]"}[opener]
    depth = 0
    for i in range(open_pos, len(line)):
        if line[i] == opener:
            depth += 1
        elif line[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    return -1


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
        close = _matching(line, end + bracket.end() - 1)
        return close >= 0 and bool(_ASSIGN_RE.match(line, close + 1))
    before = line[:start].rstrip()
    if _ATOMIC_STORE_TARGET_RE.search(before):  # `atomic_store_explicit((T*)(C + off), v, ...)` writes C
        return True
    if before.endswith("("):
        close = _matching(line, len(before) - 1)
        return close >= 0 and bool(_ASSIGN_RE.match(line, close + 1))
    return False


def mark_line(line: str, names: set[str], *, predicated_blocks: bool) -> str:
    if not names:
        return line
    pattern = re.compile(r"(?<![\w.>])(" + "|".join(sorted(map(re.escape, names))) + r")\b(?!\s*\()")
    ternary = _ternary_positions(line)
    shuffled = _shuffle_operand_positions(line) if "simd_" in line else None
    pieces, last = [], 0
    code_end = line.find("//")
    for m in pattern.finditer(line):
        if code_end >= 0 and m.start() >= code_end:
            break
        store = _is_store(line, m.start(), m.end())
        predicated = ternary[m.start()]
        suffix = ".wp()" if store and predicated else ".w()" if store else ".p()" if predicated else ""
        if shuffled is not None and shuffled[m.start()] and not store:
            suffix += ".s()"
        pieces.append(line[last : m.end()] + suffix)
        last = m.end()
    pieces.append(line[last:])
    out = "".join(pieces)
    if predicated_blocks and _BLOCK_RE.match(out) and re.search(r"\b(if|else)\b", out) and not _UNIFORM_RE.search(out):
        brace = out.rindex("{")
        out = out[: brace + 1] + " tlm::predicated_scope __tlm_pred_scope;" + out[brace + 1 :]
    return out
