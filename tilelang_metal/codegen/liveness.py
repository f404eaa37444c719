"""Where each thread-private array of a printed kernel holds a value, by line (for the register
estimate, register_budget.kernel_registers): from its first use after the declaration (the printer
declares arrays ahead of the statements that fill them) to its last use, extended to the
end of the outermost loop or block entered after the declaration that contains that use (a value
read at the top of a loop is needed again on the next iteration); only to the end of the innermost
block holding all its uses for a 16-byte array that the first of them fills whole there (each step
fills it before reading it: copy_runs' run registers). Arrays whose ranges do not meet
(the copies of a fragment that a pipelined loop's prologue and epilogue each declare) never hold
registers at the same time.

The arms of an if / else run one or the other (the interior / edge split, transform/interior_split.py,
prints a body in each): an array whose value is not needed after the if / else holds nothing in an
arm that does not use it, and in an arm that does, only from the arm's start (if it was live before
the if) or its first use there to its last use there. So a range is a tuple of (first, last)
segments. Works on the printer's own lines (two spaces per block level), not on hand-written MSL."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..core.dtypes import MSL_SCALAR_BYTES

_TOKEN = re.compile(r"[A-Za-z_]\w*")

Segments = tuple[tuple[int, int], ...]


def _depth(line: str) -> int:
    return (len(line) - len(line.lstrip(" "))) // 2


def _code(line: str) -> str:
    """The line without indentation and trailing comment (`} else {  // threadgroup-uniform`)."""
    return line.split("//", 1)[0].strip()


def _if_else(lines: Sequence[str]) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Each if statement with an else of the printed lines: (its `if` line, its closing line, the
    (first, last) body lines of each arm)."""
    found = []
    for i, line in enumerate(lines):
        text = _code(line)
        if not (text.startswith("if (") and text.endswith("{")):
            continue
        depth, arms, begin = _depth(line), [], i + 1
        for j in range(i + 1, len(lines)):
            if not lines[j].strip() or _depth(lines[j]) > depth:
                continue
            closing = _code(lines[j])
            arms.append((begin, j - 1))
            if closing.startswith("} else"):
                begin = j + 1
                continue
            if closing == "}" and len(arms) > 1:
                found.append((i, j, arms))
            break
    return found


def _extended(lines: Sequence[str], start: int, last: int, depth: int) -> int:
    """`last`, or the end of the outermost block entered after `depth` that contains it."""
    if last > start and _depth(lines[last]) > depth:
        return next((j for j in range(last + 1, len(lines)) if lines[j].strip() and _depth(lines[j]) <= depth), len(lines) - 1)
    return last


def _segments(lines: Sequence[str], statements: list, uses: list[int], start: int, end: int, names: Sequence[str]) -> Segments:
    """The segments of a range (start, end) with `uses`, cut by the first if / else inside it
    after which nothing reads the value."""
    for k, (at, closing, arms) in enumerate(statements):
        if not (start < closing and at < end <= closing) or start > at and not any(a <= start <= b for a, b in arms):
            continue
        cut: list[tuple[int, int]] = [(start, at)] if start < at else []
        for begin, finish in arms:
            inside = [u for u in uses if begin <= u <= finish]
            if not inside:
                continue
            first = begin if start < at else inside[0]  # live on entry: from the arm's start
            depth = max(_depth(lines[at]) + 1, _uncarried_depth(lines, statements, inside, names) if first == inside[0] else 0)
            last = min(_extended(lines, first, inside[-1], depth), finish)
            cut.extend(_segments(lines, statements[k + 1:], inside, first, last, names))
        return tuple(cut)
    return ((start, end),)


def live_ranges(lines: Sequence[str], tokens: Mapping[str, str]) -> dict[str, Segments]:
    """The (first, last) line segments of each array that `tokens` (identifier as printed -> array
    name) names; an array whose identifiers never appear has no entry."""
    declared: dict[str, int] = {}  # array -> line of its first declaration
    seen: set[str] = set()  # identifiers declared so far (a cooperative accumulator has one per tensor)
    uses: dict[str, list[int]] = {}  # array -> the lines that use it after a declaration
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        for token in set(_TOKEN.findall(line)):
            name = tokens.get(token)
            if name is None:
                continue
            if token not in seen:
                seen.add(token)
                declared.setdefault(name, i)
            elif not uses.get(name) or uses[name][-1] != i:
                uses.setdefault(name, []).append(i)
            last[name] = i
    statements = _if_else(lines)
    ranges = {}
    for name, at in declared.items():
        used = uses.get(name, [])
        start = used[0] if used else at
        names = [t for t, n in tokens.items() if n == name]
        if not _one_run(lines[at], names):
            names = []  # the rule below is for 16-byte run registers only
        end = _extended(lines, start, last[name], max(_depth(lines[at]), _uncarried_depth(lines, statements, used, names)))
        ranges[name] = _segments(lines, statements, used, start, end, names)
    return ranges


def _one_run(declaration: str, names: Sequence[str]) -> bool:
    """The array is 16 bytes (`half r[8];`): one move fills it whole."""
    match = re.fullmatch(r"(\w+) (\w+)\[(\d+)\];", _code(declaration))
    return bool(match) and match[2] in names and MSL_SCALAR_BYTES.get(match[1], 0) * int(match[3]) == 16


def _uncarried_depth(lines: Sequence[str], statements: list, uses: list[int], names: Sequence[str]) -> int:
    """For a 16-byte array whose first use in the innermost block holding all of `uses` fills it whole
    (`*(thread tlm_run16<half>*)(r + (0)) = ...`, or every arm of the if / else there begins with a
    write of it): the depth of that block, as no loop around it carries the value (copy_runs' run
    registers, filled and stored within one K step); else 0. Other arrays keep the loop-wide range
    the register model (register_budget, attention_config) is measured against."""
    if not uses or not names or not _writes_first(lines, statements, uses, names):
        return 0
    if not any(f"({n} + (0)) = " in _code(lines[uses[0]]) and _code(lines[uses[0]]).startswith("*(thread ") for n in names):
        return 0
    return min(_depth(lines[j]) for j in range(uses[0], uses[-1] + 1) if lines[j].strip())


def _write_only(line: str, names: Sequence[str]) -> bool:
    """The line assigns the array and reads nothing of it (`x[v] = ...`, `*(thread T*)(x + 0) = ...`)."""
    target, sep, value = _code(line).partition(" = ")
    return bool(sep) and any(n in _TOKEN.findall(target) for n in names) and not any(n in _TOKEN.findall(value) for n in names)


def _writes_first(lines: Sequence[str], statements: list, uses: list[int], names: Sequence[str]) -> bool:
    """The first use writes the array unconditionally within the block of all its uses: it sits in
    no `if` there, or in an if / else each of whose arms begins its uses with a write."""
    start, last = uses[0], uses[-1]
    if not _write_only(lines[start], names):
        return False
    common = min(_depth(lines[j]) for j in range(start, last + 1) if lines[j].strip())
    for level in range(_depth(lines[start]) - 1, common - 1, -1):
        opener = next(j for j in range(start - 1, -1, -1) if lines[j].strip() and _depth(lines[j]) == level)
        text = _code(lines[opener])
        if not (text.startswith("if (") or text.startswith("} else")):
            continue
        arms = next((a for i, closing, a in statements if any(b - 1 == opener for b, _ in a) and closing > start), None)
        if arms is None:
            return False  # an if without else: the value may come from an earlier step
        for begin, finish in arms:
            inside = [u for u in uses if begin <= u <= finish]
            if not inside or not _write_only(lines[inside[0]], names):
                return False
    return True
