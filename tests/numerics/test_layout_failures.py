"""Layout-inference failures are one line naming the buffer, its shape and thread counts that work
for it (transform/layout_failures.py), and those counts really lower and run.

Once: a column reducer of a 32x3, 32x5 or 32x6 fragment ended in TVM's bare `Layout ... has errors`, and a row
reduction of 4x1000 on 128 threads suggested "48 or 96", which fail for it too (issue #32)."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import functools
import re

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.errors import MetalLoweringError


@functools.lru_cache(maxsize=None)
def column_max_reducer(rows: int, cols: int, threads: int):
    @T.prim_func
    def main(A: T.Tensor((rows, cols), "float32"), Out: T.Tensor((cols,), "float32")):
        with T.Kernel(1, threads=threads):
            acc = T.alloc_reducer((cols,), "float32", op="max")
            out = T.alloc_fragment((cols,), "float32")
            T.reducer_init(acc, -1e30)
            for i, j in T.Parallel(rows, cols):
                T.reducer_update(acc[j], A[i, j])
            T.finalize_reducer(acc, out)
            T.copy(out, Out)

    return main


@functools.lru_cache(maxsize=None)
def row_sums(rows: int, cols: int, threads: int):
    @T.prim_func
    def main(A: T.Tensor((rows, cols), "float32"), S: T.Tensor((rows,), "float32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((rows, cols), "float32")
            s = T.alloc_fragment((rows,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, s, dim=1)
            T.copy(s, S)

    return main


def _suggested(program, what: str) -> list[int]:
    with pytest.raises(MetalLoweringError) as info:
        tilelang.lower(program, target="metal")
    text = str(info.value)
    assert "\n" not in text and "has errors" not in text and "Check failed" not in text
    assert what in text, text
    return [int(n) for n in re.findall(r"threads=(\d+)", text)]


CASES = {
    # name: (program builder, shape, failing threads, the text naming the buffer, the reference)
    "column reducer 16x3": (column_max_reducer, (16, 3), 32, "reducer acc (3 float32) on 32 threads", lambda a: a.amax(0)),
    "row sums 4x1000": (row_sums, (4, 1000), 128, "fragment a (4x1000 float32) on 128 threads", lambda a: a.sum(1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_no_layout_names_the_buffer_and_thread_counts_that_run(name):
    build, shape, threads, what, reference = CASES[name]
    counts = _suggested(build(*shape, threads), what)
    assert len(counts) == 2 and threads not in counts
    # the nearer count runs and matches torch (lowering the farther one too would double the cost:
    # the message already ran layout inference and the reductions' lowering on both)
    kernel = tilelang.compile(build(*shape, counts[0]), target="metal", execution_backend="emulator")
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(len(name)))
    out = torch.empty(reference(a).shape)
    kernel(a, out)
    torch.testing.assert_close(out, reference(a), rtol=1e-5, atol=1e-4)
