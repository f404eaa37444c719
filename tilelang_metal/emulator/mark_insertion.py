"""Access marks for the instrumented flavours (counters, racecheck), applied from the kernel's record.

The shim cannot tell a load from a store through `T&`, nor a masked access from one every thread
makes, so the instrumented flavours mark them in the source: a store `C[i] = v` becomes
`C.w()[i] = v` (`.wp()` when predicated), a load in a branch of `?:` becomes `A.p()`, a shuffle's
operand `A.s()` (`.p().s()`), and an `if` / `else` block some threads skip opens a
`tlm::predicated_scope`, so every access executed inside it counts as predicated. Which accesses
these are is not read from the MSL: the printer recorded each one when it printed it
(codegen/access_marks.py, the artifact's `access_marks` and `predicated_blocks`); the front door
records the same for hand-written MSL (handwritten.py). Here each recorded position is checked to
hold the name it marks (text edited after printing is refused) and the marks are inserted there.
Lines keep their numbers.
"""

from __future__ import annotations

from ..codegen.artifact import KernelRecord
from ..core.dtypes import msl_type_bytes
from .errors import EmulatorCompileError

SUFFIXES = {"w": ".w()", "wp": ".wp()", "p": ".p()", "s": ".s()", "ps": ".p().s()"}
PREDICATED_SCOPE = " tlm::predicated_scope __tlm_pred_scope;"


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _moved(record: KernelRecord, line: int, col: int, what: str, found: str) -> EmulatorCompileError:
    return EmulatorCompileError(
        f"kernel {record.name}: its artifact marks {what} at line {line} column {col + 1}, but the MSL has `{found}` there: "
        "the MSL was edited after tilelang_metal printed it; run edited MSL with tilelang_metal.emulator.compile_msl"
    )


def marked_names(record: KernelRecord) -> set[str]:
    """Every name a mark may spell, what either flavour instruments: device buffers, threadgroup
    arrays and views, tile pointers, and the thread arrays racecheck tracks (of a known element
    size, not simdgroup matrices)."""
    tracked = {t.name for t in record.thread_arrays if msl_type_bytes(t.elem_type) is not None and not t.elem_type.startswith("simdgroup_")}
    return ({p.name for p in record.buffers} | {a.name for a in record.threadgroup_arrays} | {v.name for v in record.threadgroup_views}
            | tracked | {t.name for t in record.tile_pointers})


def apply_marks(lines: list[str], opening_line: int, record: KernelRecord, names: set[str], skip: set[int], *,
                predicated_blocks: bool) -> None:
    """Insert the record's marks into `lines` (the kernel's source split at newlines, the kernel
    opening at 0-based index `opening_line`): only accesses to `names` (the flavour's instrumented
    pointers), on no line of `skip` (1-based declaration lines); the predicated scopes when
    `predicated_blocks` (counters)."""
    if not names:
        return
    known = marked_names(record)
    inserts: dict[int, list[tuple[int, str]]] = {}
    for rel, col, length, kind in record.access_marks:
        i = opening_line + rel
        if i + 1 in skip:
            continue
        text = lines[i] if 0 <= i < len(lines) else ""
        name = text[col : col + length]
        whole = (name in known and kind in SUFFIXES and (col == 0 or not _is_word(text[col - 1]))
                 and (col + length >= len(text) or not _is_word(text[col + length])))
        if not whole:
            raise _moved(record, i + 1, col, f"an access ({kind})", text[max(col - 8, 0) : col + length + 8].strip())
        if name in names:
            inserts.setdefault(i, []).append((col + length, SUFFIXES[kind]))
    if predicated_blocks:
        for rel, col in record.predicated_blocks:
            i = opening_line + rel
            text = lines[i] if 0 <= i < len(lines) else ""
            if text[col : col + 1] != "{":
                raise _moved(record, i + 1, col, "a predicated block's `{`", text.strip())
            inserts.setdefault(i, []).append((col + 1, PREDICATED_SCOPE))
    for i, at in inserts.items():
        text = lines[i]
        for pos, insert in sorted(at, key=lambda t: t[0], reverse=True):
            text = text[:pos] + insert + text[pos:]
        lines[i] = text
