"""The printer's record of the accesses the emulator's instrumented flavours mark.

The emulator's counters and race checker (docs/emulator.md) need to know, for each access the
printer writes, whether it is a store, whether only some threads execute it (a branch of `?:`), and
whether it is an operand of a shuffle; and which `if` / `else` blocks mask threads. The printer
knows each of these when it prints the access, so it says so in an internal form of its text:
control characters that never occur in MSL wrap each access's name (`LOAD name END` or
`STORE name END`), the branches of a `?:` (`PRED ... PRED_END`) and a shuffle's arguments
(`SHUFFLE ... SHUFFLE_END`), and precede the `{` of a block that masks threads (`BLOCK`).
`strip` removes them, leaving the MSL byte for byte as it would be without them, and returns what
they said as data for the kernel's artifact record:

- marks: (line, column, length of the name, kind) with the line counted from the kernel's opening
  line (0) and the kind one of "w" (store), "wp" (predicated store), "p" (predicated load), "s"
  (shuffle operand), "ps" (predicated shuffle operand); plain loads are not recorded;
- blocks: (line, column of the `{`) of each `if` / `else` block that opens a predicated scope.

Expressions are memoized by the printer, so the wrapping is context-free where it must be: a name
carries only load / store, and the `?:` and the shuffle wrap their own operands.
"""

from __future__ import annotations

LOAD, STORE, END = "\x01", "\x02", "\x03"
PRED, PRED_END = "\x04", "\x05"
SHUFFLE, SHUFFLE_END = "\x06", "\x07"
BLOCK = "\x0e"
SENTINELS = frozenset(LOAD + STORE + END + PRED + PRED_END + SHUFFLE + SHUFFLE_END + BLOCK)

# Metal's shuffles whose operands the race checker treats as a lane's contribution (`.s()`).
SHUFFLE_FUNCTIONS = frozenset({"simd_shuffle", "simd_shuffle_xor", "simd_shuffle_up", "simd_shuffle_down", "simd_broadcast"})

Mark = tuple[int, int, int, str]
Block = tuple[int, int]


def load(name: str) -> str:
    return f"{LOAD}{name}{END}"


def store(name: str) -> str:
    return f"{STORE}{name}{END}"


def predicated(text: str) -> str:
    return f"{PRED}{text}{PRED_END}"


def shuffled(text: str) -> str:
    return f"{SHUFFLE}{text}{SHUFFLE_END}"


def kind(*, is_store: bool, is_predicated: bool, is_shuffled: bool) -> str:
    """The mark of one access ("" for a plain load, which is not recorded)."""
    k = ("w" if is_store else "") + ("p" if is_predicated else "")
    return k + ("s" if is_shuffled and not is_store else "")


def strip(text: str) -> tuple[str, tuple[Mark, ...], tuple[Block, ...]]:
    """`text` without the sentinels, its marks and its predicated blocks (see the module doc)."""
    marks: list[Mark] = []
    blocks: list[Block] = []
    out_lines = []
    for lineno, line in enumerate(text.split("\n")):
        out: list[str] = []
        col = 0
        pred = shuf = 0
        name_start = name_store = None
        for ch in line:
            if ch in SENTINELS:
                if ch in (LOAD, STORE):
                    name_start, name_store = col, ch == STORE
                elif ch == END:
                    k = kind(is_store=bool(name_store), is_predicated=pred > 0, is_shuffled=shuf > 0)
                    if k:
                        marks.append((lineno, name_start, col - name_start, k))
                    name_start = None
                elif ch == PRED:
                    pred += 1
                elif ch == PRED_END:
                    pred -= 1
                elif ch == SHUFFLE:
                    shuf += 1
                elif ch == SHUFFLE_END:
                    shuf -= 1
                else:  # BLOCK: the `{` that follows opens a predicated scope
                    blocks.append((lineno, col))
                continue
            out.append(ch)
            col += 1
        if pred or shuf or name_start is not None:
            raise AssertionError(f"unbalanced access marks on printed line {lineno}: {line!r}")
        out_lines.append("".join(out))
    return "\n".join(out_lines), tuple(marks), tuple(blocks)
