"""The layout of the printer's MSL file: a header (includes, helpers) followed by one `[[kernel]]`
function per `T.Kernel` block of the module. Consumers that need one kernel at a time (the emulator,
the MLX adapter, TVM's Metal runtime module) split the file here rather than each on its own."""

from __future__ import annotations

import re

KERNEL_RE = re.compile(r"(\[\[\s*kernel\b(?:[^\]]|\](?!\]))*\]\]|\bkernel)\s+void\s+([A-Za-z_]\w*)\s*\(")


def split_kernels(msl: str) -> dict[str, str]:
    """kernel name -> a source holding that kernel alone: the file's header (everything before the
    first kernel) followed by the kernel's text up to the next kernel."""
    kernels = list(KERNEL_RE.finditer(msl))
    if not kernels:
        return {}
    header = msl[: kernels[0].start()]
    out = {}
    for i, m in enumerate(kernels):
        end = kernels[i + 1].start() if i + 1 < len(kernels) else len(msl)
        out[m.group(2)] = header + msl[m.start() : end]
    return out


def matching_bracket(text: str, open_pos: int, open_ch: str = "(", close_ch: str = ")") -> int | None:
    """Offset of the bracket closing the one at `open_pos`, or None when it never closes (callers
    raise their own error: a signature, a foreign kernel, an MLX body)."""
    depth = 0
    for i in range(open_pos, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    return None
