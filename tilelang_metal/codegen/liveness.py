"""Where each thread-private array of a printed kernel holds a value, by line (for the register
estimate, register_budget.kernel_registers): from its first use after the declaration (the printer
declares arrays ahead of the statements that fill them) to its last use, extended to the
end of the outermost loop or block entered after the declaration that contains that use (a value
read at the top of a loop is needed again on the next iteration). Arrays whose ranges do not meet
(the copies of a fragment that a pipelined loop's prologue and epilogue each declare) never hold
registers at the same time. Works on the printer's own lines (two spaces per block level), not on
hand-written MSL."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_TOKEN = re.compile(r"[A-Za-z_]\w*")


def _depth(line: str) -> int:
    return (len(line) - len(line.lstrip(" "))) // 2


def live_ranges(lines: Sequence[str], tokens: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """(first, last) line index of each array that `tokens` (identifier as printed -> array name)
    names; an array whose identifiers never appear has no entry."""
    declared: dict[str, int] = {}  # array -> line of its first declaration
    seen: set[str] = set()  # identifiers declared so far (a cooperative accumulator has one per tensor)
    first: dict[str, int] = {}  # array -> its first use after a declaration
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        for token in set(_TOKEN.findall(line)):
            name = tokens.get(token)
            if name is None:
                continue
            if token not in seen:
                seen.add(token)
                declared.setdefault(name, i)
            else:
                first.setdefault(name, i)
            last[name] = i
    ranges = {}
    for name, at in declared.items():
        start = first.get(name, at)
        end, depth = last[name], _depth(lines[at])
        if end > start and _depth(lines[end]) > depth:  # used inside a block entered after the declaration
            end = next((j for j in range(end + 1, len(lines)) if lines[j].strip() and _depth(lines[j]) <= depth), len(lines) - 1)
        ranges[name] = (start, end)
    return ranges
