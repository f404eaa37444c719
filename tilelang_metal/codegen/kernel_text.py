"""The layout of the printer's MSL file: a header (includes, helpers) followed by one `[[kernel]]`
function per `T.Kernel` block of the module. Consumers that need one kernel at a time (the emulator,
the MLX adapter, TVM's Metal runtime module) split the file here rather than each on its own; the
kernels are found by their artifact records' opening lines (codegen/artifact.py), not by parsing."""

from __future__ import annotations

from dataclasses import replace

from .artifact import artifact_line_of, decode, strip_artifact


def split_kernels(msl: str) -> dict[str, str]:
    """kernel name -> a source holding that kernel alone: the file's header (everything before the
    first kernel) followed by the kernel's text up to the next kernel, then an artifact line holding
    that kernel's record alone (wherever the file has its line), so each piece reads as a file the
    printer wrote for that kernel, and one kernel shared by two modules (a split-K or decoding
    combine step) is the same piece, built once, whatever the other kernels are.
    The kernels are those the artifact records (ArtifactError, one line, for MSL without one)."""
    artifact = decode(artifact_line_of(msl))  # the line read once
    records = artifact.kernels
    msl = strip_artifact(msl)
    starts = []
    for record in records:
        at = msl.find(record.opening())
        if at < 0 or msl.find(record.opening(), at + 1) >= 0:
            raise ValueError(f"kernel {record.name}: its artifact's opening line `{record.opening()}` is not once in the source")
        starts.append((at, record.name))
    starts.sort()
    if not starts:
        return {}
    header = msl[: starts[0][0]]
    out = {}
    own_line = {record.name: replace(artifact, kernels=(record,)).line() for record in records}
    for i, (at, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(msl)
        text = msl[at:end]
        out[name] = header + text + ("" if text.endswith("\n") else "\n") + own_line[name] + "\n"
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
