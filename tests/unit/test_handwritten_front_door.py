"""The front door's reading of hand-written MSL in the printer's shape (emulator/handwritten.py): the
records it reads from free spelling, the printer's spelling it gives back on the same lines, and the
one-line refusals; the readers that now use records instead of the text (split_kernels,
needs_metal4, the record-only rewrite)."""

from __future__ import annotations

import pytest

from tilelang_metal.codegen import artifact as A
from tilelang_metal.codegen.kernel_text import split_kernels
from tilelang_metal.emulator import EmulatorCompileError
from tilelang_metal.emulator.handwritten import record_of, with_artifact
from tilelang_metal.emulator.signature import rewrite
from tilelang_metal.execution.metal4_launch import needs_metal4

# Free spelling: the `kernel` keyword, no __restrict, `device const`, parameters over several lines,
# comments after declarations, a pool view with its extent, an aligned thread array, a tile pointer.
FREE = """#include <metal_stdlib>
using namespace metal;

kernel void free_form(device const half *A [[buffer(0)]],
                      device float* Out   [[ buffer(1) ]],
                      constant int & n [[buffer(2)]],
                      uint3 tid [[ thread_position_in_threadgroup ]]) {
  threadgroup uchar pool[1024];  // the pool
  threadgroup half* A_s = (threadgroup half*)(pool + 0);  // 256 elements
  alignas(16) float acc[8];
  const device half* src = (A + (tid.x * 4));
  A_s[tid.x] = src[0];
  Out[tid.x] = float(A_s[tid.x]) + float(n) + acc[0];
}
"""


def test_records_read_from_free_spelling():
    record, _ = record_of(FREE)
    assert record.name == "free_form" and record.max_total_threads is None and record.block is None
    assert record.params == (
        A.BufferParam(0, "A", "half", True),
        A.BufferParam(1, "Out", "float", False),
        A.ScalarParam(2, "n", "int"),
        A.PositionParam("tid", "uint3", "thread_position_in_threadgroup"),
    )
    assert record.threadgroup_arrays == (A.ThreadgroupArrayDecl("pool", "uchar", 1024),)
    assert record.threadgroup_views == (A.ThreadgroupViewDecl("A_s", "half", "pool", "0", 256),)
    assert record.thread_arrays == (A.ThreadArrayDecl("acc", "float", 8, align=16),)
    assert record.tile_pointers == (A.TilePointerDecl("src", "half", True, "A"),)
    assert not record.prints and record.instructions == ()


def test_respelled_on_the_same_lines_with_the_artifact_last():
    out = with_artifact(FREE)
    before, after = FREE.splitlines(), out.splitlines()
    assert len(after) == len(before) + 1 and A.artifact_of(out).kernels == (record_of(FREE)[0],)
    assert after[-1].startswith(A.MARK) and A.find_artifact("\n".join(after[:-1])) is None
    assert after[3] == "[[kernel]] void free_form(const device half* __restrict A [[ buffer(0) ]],"
    assert after[6].strip() == "uint3 tid [[thread_position_in_threadgroup]]) {"
    assert after[7] == "  threadgroup uchar pool[1024];"  # the printer's spelling, comment dropped
    assert after[12:14] == before[12:14]  # statements are left alone
    sig = rewrite(out, checked=True).signature
    assert [p.name for p in sig.bound] == ["A", "Out", "n"] and sig.line == 4


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("[1024]", "[N * 4]"), "threadgroup array 'pool': its size must be a literal element count, got `N * 4`"),
        (("kernel void", "void"), "no kernel found"),
        (("constant int & n", "constant int4& n"), "scalar parameter 'n': unsupported type 'int4'"),
        (("device float* Out", "device double* Out"), "device buffer 'Out': unsupported element type 'double'"),
        (("  A_s[tid.x]", "  float acc[4];\n  A_s[tid.x]"), "'acc' is declared again with another type or size"),
        (("  A_s[tid.x]", "  threadgroup uchar pool[1024];\n  A_s[tid.x]"), "'pool' is declared more than once"),
        (("  A_s[tid.x]", "  half A_s[2];\n  A_s[tid.x]"), "'A_s' is declared more than once"),
    ],
)
def test_other_shapes_are_refused_in_one_line(edit, message):
    with pytest.raises(EmulatorCompileError) as err:
        with_artifact(FREE.replace(*edit))
    assert str(err.value).splitlines()[0].startswith(message)


def test_a_thread_array_may_be_declared_again_as_it_was():
    again = FREE.replace("  A_s[tid.x]", "  for (int i = 0; i < 2; ++i) {\n    alignas(16)  float acc[ 8 ];\n  }\n  A_s[tid.x]")
    record, _ = record_of(again)
    assert record.thread_arrays == (A.ThreadArrayDecl("acc", "float", 8, align=16),)
    assert with_artifact(again).count("alignas(16) float acc[8];") == 2  # both lines in the printer's spelling


def test_the_rewrite_reads_only_records():
    with pytest.raises(EmulatorCompileError, match="no tilelang_metal artifact: compile_kernel reads hand-written MSL through the front door"):
        rewrite(FREE, checked=True)


def _module(*records: A.KernelRecord, order: tuple[int, ...], artifact_last: bool) -> str:
    art = A.KernelArtifact(A.STANDARD, tuple(records))
    kernels = "".join(f"{records[i].opening()}device float* __restrict X [[ buffer(0) ]]) {{ X[0] = {i}; }}\n" for i in order)
    if artifact_last:  # where the printer writes it
        return f"// banner\n#include <metal_stdlib>\n{kernels}{art.line()}\n"
    return f"// banner\n{art.line()}\n#include <metal_stdlib>\n{kernels}"  # where it was until session 16


@pytest.mark.parametrize("artifact_last", [True, False])
def test_split_kernels_finds_kernels_by_their_records(artifact_last):
    x = (A.BufferParam(0, "X", "float", False),)
    first, second = A.KernelRecord("k_b", x, None, 64), A.KernelRecord("k_a", x, None, None)
    source = _module(first, second, order=(0, 1), artifact_last=artifact_last)
    parts = split_kernels(source)
    assert list(parts) == ["k_b", "k_a"]  # in the text's order
    for name, part in parts.items():  # each piece a file of its own: the header, its kernel, its own record's line last
        line = A.KernelArtifact(A.STANDARD, (first if name == "k_b" else second,)).line()
        assert part.startswith("// banner\n#include <metal_stdlib>\n") and part.endswith(f"\n{line}\n") and part.count(A.MARK) == 1, name
    # a kernel's piece does not depend on the module's other kernels (the emulator builds it once)
    other = A.KernelRecord("k_b", x, None, 128)
    assert split_kernels(_module(other, second, order=(0, 1), artifact_last=artifact_last))["k_a"] == parts["k_a"]
    assert A.strip_artifact(parts["k_b"]).endswith("X[0] = 0; }\n") and "k_a" not in parts["k_b"].split(A.MARK)[0]
    assert A.strip_artifact(parts["k_a"]).endswith("[[kernel]] void k_a(device float* __restrict X [[ buffer(0) ]]) { X[0] = 1; }\n")
    with pytest.raises(A.ArtifactError, match="carries no tilelang_metal artifact"):
        split_kernels("kernel void f(device float* X [[buffer(0)]]) {}\n")
    missing = A.KernelRecord("k_c", x, None, None)  # recorded, not in the text
    with pytest.raises(ValueError, match="kernel k_c: its artifact's opening line"):
        split_kernels(_module(first, missing, order=(0,), artifact_last=True))


def test_needs_metal4_reads_the_recorded_instructions():
    def art(*instructions: str) -> A.KernelArtifact:
        return A.KernelArtifact(A.STANDARD, (A.KernelRecord("k", (), None, None, instructions=instructions),))

    assert needs_metal4(art("matmul2d_16x32x16"))
    assert not needs_metal4(art("simdgroup_multiply_accumulate_8x8x8")) and not needs_metal4(art())
    with pytest.raises(ValueError, match="matrix instruction tensor_core_9x9x9, which this tilelang_metal does not know"):
        needs_metal4(art("tensor_core_9x9x9"))
