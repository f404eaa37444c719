"""No barrier in control flow that differs between threads (the emulator stops with "divergent
barrier"; on a GPU it is undefined): the device-memory barrier of a thread-guarded block splits the
block, a per-thread `while` gets no threadgroup barrier, and what cannot be ordered is refused in one
line."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import MetalLoweringError
from tilelang_metal.emulator import racecheck


def _compile(func):
    return tilelang.compile(func, target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def guarded_device_exchange(n: int = 64, active: int = 32):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if tx < active:
                B[tx] = A[tx] * 2.0
                B[active - 1 - tx] = B[active - 1 - tx] + 1.0  # another thread's element

    return _compile(main)


def test_thread_guarded_block_is_split_around_its_device_barrier():
    kernel = guarded_device_exchange()
    source = kernel.get_kernel_source()
    body = source[source.index("{") :]
    assert body.count("if (") == 2 and "threadgroup_barrier(mem_flags::mem_device" in body
    a, b = torch.arange(64.0), torch.full((64,), -5.0)
    racecheck(kernel, a, b)
    kernel(a, b)
    want = torch.cat([a[:32] * 2.0 + 1.0, torch.full((32,), -5.0)])
    torch.testing.assert_close(b, want)


@functools.lru_cache(maxsize=None)
def per_thread_while(n: int = 64):
    @T.prim_func
    def main(A: T.Tensor((n,), "int32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            s = T.alloc_shared((n,), "float32")
            i = T.alloc_var("int32")
            i = 0
            s[tx] = 0.5
            while i < A[tx]:  # a different trip count per thread
                s[tx] = s[tx] * 2.0
                i = i + 1
            B[tx] = s[tx]

    return _compile(main)


def test_per_thread_while_on_own_elements_runs_without_a_barrier():
    kernel = per_thread_while()
    a = torch.randint(0, 6, (64,), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    a[5] = 0
    b = torch.zeros(64)
    racecheck(kernel, a, b)
    kernel(a, b)
    torch.testing.assert_close(b, 0.5 * 2.0 ** a.float())


def test_per_thread_while_exchanging_through_threadgroup_memory_is_refused():
    n = 64

    @T.prim_func
    def main(A: T.Tensor((n,), "int32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            s = T.alloc_shared((n,), "float32")
            i = T.alloc_var("int32")
            i = 0
            s[tx] = 1.0
            while i < A[tx]:
                s[tx] = s[(tx + 1) % n] + 1.0
                i = i + 1
            B[tx] = s[tx]

    with pytest.raises(MetalLoweringError, match=r"differs between threads writes threadgroup buffer s") as err:
        _compile(main)
    assert "\n" not in str(err.value)


def test_thread_guarded_block_with_an_else_exchanging_is_refused():
    n = 64

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if tx < 32:
                B[tx] = A[tx]
                B[31 - tx] = B[31 - tx] + 1.0
            else:
                B[tx] = A[tx] - 1.0

    with pytest.raises(MetalLoweringError, match=r"two ifs with opposite conditions") as err:
        _compile(main)
    assert "\n" not in str(err.value)


@functools.lru_cache(maxsize=None)
def grid_stride_scale(numel: int = 301, blocks: int = 2, threads: int = 64):
    """A grid-stride loop (TileLang's `T.serial(start, stop, step=...)` with a per-thread start):
    the trip count differs between threads; every element has one owner."""

    @T.prim_func
    def main(A: T.Tensor((numel,), "float32"), B: T.Tensor((numel,), "float32")):
        with T.Kernel(blocks, threads=threads) as bx:
            tx = T.get_thread_binding()
            for i in T.serial(bx * threads + tx, numel, step=blocks * threads):
                B[i] = A[i] * 3.0
                B[i] = B[i] + 1.0  # reads back its own element

    return _compile(main)


def test_grid_stride_loop_on_own_elements_runs_without_a_barrier():
    kernel = grid_stride_scale()
    assert "threadgroup_barrier" not in kernel.get_kernel_source()
    a, b = torch.randn(301, generator=torch.Generator().manual_seed(5)), torch.full((301,), -7.0)
    racecheck(kernel, a, b, seeds=(0, 1))
    torch.testing.assert_close(b, a * 3.0 + 1.0)


def test_grid_stride_loop_exchanging_through_device_memory_is_refused():
    numel, threads = 100, 32

    @T.prim_func
    def main(A: T.Tensor((numel,), "float32"), B: T.Tensor((numel,), "float32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            for i in T.serial(tx, numel, step=threads):
                B[i] = A[i]
                A[(i + 1) % numel] = B[i] + 1.0  # another thread's element

    with pytest.raises(MetalLoweringError, match=r"loop whose range .* differs between threads exchanges device buffer A between threads") as err:
        _compile(main)
    assert "\n" not in str(err.value)
