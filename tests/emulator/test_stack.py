"""Fiber stacks sized from the kernel's thread-private arrays; oversized arrays refused before building."""

from __future__ import annotations

import re

import pytest
import torch

from tilelang_metal.emulator import EmulatorStackError, compile_kernel
from tilelang_metal.emulator.kernel import DEFAULT_STACK_BYTES, stack_bytes
from tilelang_metal.emulator.signature import rewrite


def local_kernel(n: int, threads: int = 32):
    import tilelang
    import tilelang.language as T

    from tilelang_metal import kernels as examples

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((2 * threads,), "float32")):
        with T.Kernel(2, threads=threads) as bx:
            loc = T.alloc_local((n,), "float32")
            tx = T.get_thread_binding()
            for i in T.serial(n):
                loc[i] = A[i] * T.cast(tx + 1, "float32")
            B[bx * threads + tx] = loc[(tx * 7919 + bx) % n] + loc[n - 1 - tx]

    return tilelang.compile(main, out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator")


def test_100k_float_thread_array_runs():
    n, threads = 100_000, 32
    k = local_kernel(n, threads)
    sig = rewrite(k.get_kernel_source(), checked=True).signature
    assert sig.thread_array_bytes == 4 * n
    assert stack_bytes(sig) >= 4 * n > DEFAULT_STACK_BYTES
    a = torch.randn(n)
    out = k(a)
    tx = torch.arange(threads)
    expected = []
    for bx in range(2):
        expected.append(a[(tx * 7919 + bx) % n] * (tx + 1) + a[n - 1 - tx] * (tx + 1))
    assert torch.equal(out, torch.cat(expected))


def test_absurd_thread_array_is_refused_with_the_setting(monkeypatch):
    src = (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "[[kernel, max_total_threads_per_threadgroup(32)]] void huge(\n"
        "  device float* __restrict B [[ buffer(0) ]],\n"
        "  ushort __lane [[thread_index_in_simdgroup]]) {\n"
        "  float loc[1000000000];\n"
        "  loc[(99999 - ((int)__lane))] = ((float)((int)__lane));\n"
        "  B[((int)__lane)] = loc[(99999 - ((int)__lane))];\n"
        "}\n"
    )
    with pytest.raises(EmulatorStackError) as ei:
        compile_kernel(src)
    msg = str(ei.value)
    assert "\n" not in msg
    assert re.search(r"need 390\d+ KiB of stack per GPU thread \(largest: float loc\[1000000000\]", msg)
    assert "TILELANG_METAL_EMULATOR_STACK_KB" in msg
    # The setting moves the limit both ways.
    small = src.replace("1000000000", "100000")
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_STACK_KB", "256")
    with pytest.raises(EmulatorStackError, match="limit of 256 KiB"):
        compile_kernel(small)
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_STACK_KB", "1024")
    b = torch.zeros(32)
    compile_kernel(small).launch([b], (1, 1, 1), (32, 1, 1))
    assert torch.equal(b, torch.arange(32, dtype=torch.float32))


def test_stack_overflow_is_an_error_not_a_crash():
    # `(1 << 20)` is not a literal, so the sizing does not see the 4 MiB array: the fiber overflows
    # its default stack, faults on the guard page, and the launch reports it.
    src = (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "[[kernel, max_total_threads_per_threadgroup(32)]] void overflow(\n"
        "  device float* __restrict B [[ buffer(0) ]],\n"
        "  ushort __lane [[thread_index_in_simdgroup]]) {\n"
        "  float loc[(1 << 20)];\n"
        "  for (int i = 0; i < (1 << 20); ++i) {\n"
        "    loc[i] = ((float)(i + ((int)__lane)));\n"
        "  }\n"
        "  B[((int)__lane)] = loc[((((int)__lane) * 7919) & 1048575)];\n"
        "}\n"
    )
    from tilelang_metal.emulator import EmulatorRuntimeError

    k = compile_kernel(src)
    b = torch.zeros(32)
    for workers in (1, 2):
        with pytest.raises(EmulatorRuntimeError, match=r"stack overflow of a GPU thread \(256 KiB stack\): threadgroup \(0,0,0\), thread \(\d+,0,0\).*raise TILELANG_METAL_EMULATOR_STACK_KB"):
            k.launch([b], (2, 1, 1), (32, 1, 1), workers=workers)
    # the process is fine and the same library still runs other launches
    k2 = compile_kernel(src.replace("(1 << 20)", "1048576").replace("1048575", "1048575"))
    k2.launch([b], (1, 1, 1), (32, 1, 1))
    lane = torch.arange(32)
    assert torch.equal(b, (((lane * 7919) & 1048575) + lane).float())
