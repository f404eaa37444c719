"""Scanning foreign MSL as text: comments and literals blanked so patterns never match inside them,
brackets matched, top-level splits; helpers that keep a rewrite's line count (diagnostics point at the
original lines). Shared by the translation, the parameter reader and handwritten.py."""

from __future__ import annotations

import re

from ...codegen.kernel_text import matching_bracket
from ..errors import EmulatorCompileError


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
