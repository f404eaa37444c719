"""The instrumented flavours' source marks: stores, `?:`-predicated accesses, `if` blocks, as the front
door reads them from hand-written MSL (handwritten.scan_line) and the emulator inserts them."""

from __future__ import annotations

import pytest

from tilelang_metal.emulator.mark_insertion import PREDICATED_SCOPE, SUFFIXES
from tilelang_metal.emulator.handwritten import scan_line, with_artifact
from tilelang_metal.emulator.signature import rewrite

NAMES = {"A", "C", "A_s", "A_frag"}


def mark(line: str, blocks: bool = True) -> str:
    """The line as the instrumented flavours spell it, from the front door's marks."""
    marks, brace = scan_line(line, NAMES)
    inserts = [(col + length, SUFFIXES[kind]) for col, length, kind in marks]
    if blocks and brace is not None:
        inserts.append((brace + 1, PREDICATED_SCOPE))
    for pos, text in sorted(inserts, reverse=True):
        line = line[:pos] + text + line[pos:]
    return line


def test_stores_are_marked_loads_are_not():
    assert mark("  C[i] = (A[j] + C[i]);") == "  C.w()[i] = (A[j] + C[i]);"
    assert mark("  *(device half4*)(C + (o + 4)) = *(const device half4*)(A + o);") == (
        "  *(device half4*)(C.w() + (o + 4)) = *(const device half4*)(A + o);"
    )
    assert mark("  C[i] += 1.0f;") == "  C.w()[i] += 1.0f;"
    assert mark("  x = (C[i] == A[i]);") == "  x = (C[i] == A[i]);"
    # names are whole identifiers: C_acc, blockIdx.A and calls are left alone
    assert mark("  C_acc[0] = s.A[1] + A(2);") == "  C_acc[0] = s.A[1] + A(2);"


def test_the_target_of_an_atomic_store_is_a_store():
    assert mark("  atomic_store_explicit((threadgroup atomic_int*)(A_s + (o)), (A[j] + 1), memory_order_relaxed);") == (
        "  atomic_store_explicit((threadgroup atomic_int*)(A_s.w() + (o)), (A[j] + 1), memory_order_relaxed);"
    )
    # an atomic load is a read; read-modify-writes stay as they were
    assert mark("  x = atomic_load_explicit((const device atomic_float*)(A + (o)), memory_order_relaxed);") == (
        "  x = atomic_load_explicit((const device atomic_float*)(A + (o)), memory_order_relaxed);"
    )


def test_ternary_branches_are_predicated():
    line = "  *(threadgroup half4*)(A_s + o) = ((r < 25) ? *(const device half4*)(A + (o + 4)) : half4(z));"
    assert mark(line) == "  *(threadgroup half4*)(A_s.w() + o) = ((r < 25) ? *(const device half4*)(A.p() + (o + 4)) : half4(z));"
    assert mark("  C[i] = (c ? A[i] : A[0]) + A[1];") == "  C.w()[i] = (c ? A.p()[i] : A.p()[0]) + A[1];"


def test_if_blocks_open_a_predicated_scope():
    assert mark("  if ((r < 25) && (c < 9)) {") == "  if ((r < 25) && (c < 9)) { tlm::predicated_scope __tlm_pred_scope;"
    assert mark("  } else {") == "  } else { tlm::predicated_scope __tlm_pred_scope;"
    assert mark("  for (int i = 0; i < 4; ++i) {") == "  for (int i = 0; i < 4; ++i) {"
    assert mark("  {") == "  {"
    assert mark("  if (c) {", blocks=False) == "  if (c) {"


SRC = """#include <metal_stdlib>
using namespace metal;
[[kernel]] void k(
  const device float* __restrict A [[ buffer(0) ]],
  device float* __restrict C [[ buffer(1) ]],
  uint3 threadIdx [[thread_position_in_threadgroup]]) {
  threadgroup float S[64];
  float loc[4];
  S[((int)threadIdx.x)] = A[((int)threadIdx.x)];
  loc[0] = S[0];
  C[((int)threadIdx.x)] = loc[0];
}
"""


def test_flavours_rewrite_only_what_they_need():
    src = with_artifact(SRC)  # the front door's reading of the hand-written kernel
    plain = rewrite(src, checked=True).text
    assert ".w()" not in plain and "local_array" not in plain
    counting = rewrite(src, checked=True, instrument="counters").text.splitlines()
    assert counting[8] == "  S.w()[((int)threadIdx.x)] = A[((int)threadIdx.x)];"
    assert counting[9] == "  loc[0] = S[0];"  # thread arrays are registers for the counters
    race = rewrite(src, checked=True, instrument="racecheck").text.splitlines()
    assert race[7] == '  tlm::local_array<float, 4> loc("loc");'
    assert race[9] == "  loc.w()[0] = S[0];"
    assert len(race) == len(src.splitlines())


def test_the_printers_sentinels_become_the_records_marks():
    """codegen/access_marks.strip: the internal form loses every sentinel and says, per access, what
    the printer knew (the line counted from the first, the column in the stripped line)."""
    from tilelang_metal.codegen import access_marks as M

    printed = "\n".join([
        "[[kernel]] void k(",
        f"  {M.store('C')}[i] = ({M.load('A')}[j] + {M.load('A_s')}[0]);",
        f"  x = (c ? {M.predicated(M.load('A') + '[i] : ' + M.load('A') + '[0]')}) + {M.load('A')}[1];",
        f"  if (c) {M.BLOCK}{{",
        f"    y = simd_shuffle_xor({M.shuffled(M.load('A_frag') + '[0], (ushort)(1)')});",
        f"    z = (c ? {M.predicated('simd_shuffle(' + M.shuffled(M.load('A') + '[0], 3') + ') : 0.0f')});",
        "  }",
    ])
    text, marks, blocks = M.strip(printed)
    assert not M.SENTINELS & set(text)
    assert text.splitlines()[2] == "  x = (c ? A[i] : A[0]) + A[1];"
    assert marks == ((1, 2, 1, "w"), (2, 11, 1, "p"), (2, 18, 1, "p"), (4, 25, 6, "s"), (5, 26, 1, "ps"))
    assert blocks == ((3, 9),) and text.splitlines()[3][9] == "{"
    # what the front door's scan of the stripped text finds is the same
    lines = text.split("\n")
    assert [(k, *m) for k, ln in enumerate(lines) for m in scan_line(ln, NAMES)[0]] == list(marks)
    assert [(k, scan_line(ln, NAMES)[1]) for k, ln in enumerate(lines) if scan_line(ln, NAMES)[1] is not None] == list(blocks)
    with pytest.raises(AssertionError, match="unbalanced access marks"):
        M.strip(f"  x = (c ? {M.PRED}A[0] : 0);")
