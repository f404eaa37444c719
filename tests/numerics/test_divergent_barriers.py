"""No barrier in control flow that differs between threads (the emulator stops with "divergent
barrier"; on a GPU it is undefined): the device-memory barrier of a thread-guarded block (with or
without an else branch) splits the block, a per-thread `while` gets no threadgroup barrier, and what
cannot be ordered is refused in one line."""

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


@functools.lru_cache(maxsize=None)
def guarded_exchange_with_else(n: int = 64, active: int = 32):
    """A thread-guarded block with an else branch: the guarded threads read another thread's element
    of B (a device barrier, every thread must reach it), the others have no barrier."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if tx < active:
                v = A[tx] * 2.0  # bound before the barrier, used after it: bound again there
                B[tx] = v
                B[active - 1 - tx] = B[active - 1 - tx] + v
            else:
                B[tx] = A[tx] - 1.0

    return _compile(main)


def test_thread_guarded_block_with_an_else_is_split_around_its_device_barrier():
    kernel = guarded_exchange_with_else()
    body = kernel.get_kernel_source().split("{", 1)[1]
    assert body.count("threadgroup_barrier(mem_flags::mem_device") == 1
    a, b = torch.arange(64.0), torch.full((64,), -5.0)
    racecheck(kernel, a, b)
    kernel(a, b)
    want = torch.cat([a[:32] * 2.0 + (a[:32] * 2.0).flip(0), a[32:] - 1.0])
    torch.testing.assert_close(b, want)


@functools.lru_cache(maxsize=None)
def fused_pre_norm(dim: int = 256, norm_threads: int = 64, threads: int = 128):
    """A fused pre-normalization in TileLang's example style: the first `norm_threads` threads
    write partial sums of squares of x to a global workspace and, after every partial is there, read
    them all to scale their part of x by rsqrt(mean(x^2) + eps) * weight; the other threads add the
    residual (H = x + r) and write it reversed (another thread's element: a barrier of their own)."""
    per_norm, per_res = dim // norm_threads, dim // (threads - norm_threads)

    @T.prim_func
    def main(
        X: T.Tensor((dim,), "float32"),
        R: T.Tensor((dim,), "float32"),
        Weight: T.Tensor((dim,), "float32"),
        Out: T.Tensor((dim,), "float32"),
        H: T.Tensor((dim,), "float32"),
        Flipped: T.Tensor((dim,), "float32"),
        Workspace: T.Tensor((norm_threads,), "float32"),
    ):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            partial = T.alloc_var("float32")
            total = T.alloc_var("float32")
            if tx < norm_threads:
                partial = 0.0
                for j in T.serial(per_norm):
                    partial += X[tx + norm_threads * j] * X[tx + norm_threads * j]
                Workspace[tx] = partial
                total = 0.0
                for k in T.serial(norm_threads):
                    total += Workspace[k]  # every thread's partial: needs the barrier
                for j in T.serial(per_norm):
                    i = tx + norm_threads * j
                    Out[i] = X[i] * T.rsqrt(total / dim + 1e-6) * Weight[i]
            else:
                for j in T.serial(per_res):
                    i = (tx - norm_threads) + (threads - norm_threads) * j
                    H[i] = X[i] + R[i]
                for j in T.serial(per_res):
                    i = (tx - norm_threads) + (threads - norm_threads) * j
                    Flipped[i] = H[dim - 1 - i]  # another thread's element: needs the barrier

    return _compile(main)


def test_fused_pre_norm_with_a_workspace_in_a_thread_dependent_if_else_matches_torch():
    kernel = fused_pre_norm()
    body = kernel.get_kernel_source().split("{", 1)[1]
    assert body.count("threadgroup_barrier(") == 1  # both branches' barriers are one, outside the ifs
    g = torch.Generator().manual_seed(9)
    x, r, w = (torch.randn(256, generator=g) for _ in range(3))
    out, h, flipped, workspace = torch.empty(256), torch.empty(256), torch.empty(256), torch.empty(64)
    racecheck(kernel, x, r, w, out, h, flipped, workspace)
    kernel(x, r, w, out, h, flipped, workspace)
    torch.testing.assert_close(out, x * torch.rsqrt((x * x).mean() + 1e-6) * w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(flipped, (x + r).flip(0))


@functools.lru_cache(maxsize=None)
def threadgroup_pre_norm(dim: int = 256, norm_threads: int = 64, threads: int = 128):
    """The pre-normalization with its partial sums in threadgroup memory: tilelang's ThreadSync puts
    the barrier inside the branch as a named barrier over its 64 threads, which Metal lacks."""
    per_thread = dim // norm_threads

    @T.prim_func
    def main(X: T.Tensor((dim,), "float32"), Out: T.Tensor((dim,), "float32"), Res: T.Tensor((dim,), "float32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            partials = T.alloc_shared((norm_threads,), "float32")
            partial = T.alloc_var("float32")
            total = T.alloc_var("float32")
            if tx < norm_threads:
                partial = 0.0
                for j in T.serial(per_thread):
                    partial += X[tx + norm_threads * j] * X[tx + norm_threads * j]
                partials[tx] = partial
                total = 0.0
                for k in T.serial(norm_threads):
                    total += partials[k]
                for j in T.serial(per_thread):
                    Out[tx + norm_threads * j] = X[tx + norm_threads * j] * T.rsqrt(total / dim + 1e-6)
            else:
                for j in T.serial(per_thread):
                    Res[(tx - norm_threads) + norm_threads * j] = X[(tx - norm_threads) + norm_threads * j] + 1.0

    return _compile(main)


def test_threadgroup_exchange_in_a_thread_dependent_if_else_gets_a_whole_threadgroup_barrier():
    kernel = threadgroup_pre_norm()
    body = kernel.get_kernel_source().split("{", 1)[1]
    assert body.count("threadgroup_barrier(mem_flags::mem_threadgroup)") == 1
    x = torch.randn(256, generator=torch.Generator().manual_seed(4))
    out, res = torch.empty(256), torch.empty(256)
    racecheck(kernel, x, out, res)
    kernel(x, out, res)
    torch.testing.assert_close(out, x * torch.rsqrt((x * x).mean() + 1e-6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res, x + 1.0)


def test_device_exchange_inside_a_loop_of_a_guarded_branch_is_refused():
    n = 64

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if tx < 32:
                for k in T.serial(4):
                    B[tx] = A[tx] * k
                    C[tx] = B[(tx + 1) % 32]  # needs a barrier inside the loop, which only these threads run
            else:
                C[tx] = A[tx]

    with pytest.raises(MetalLoweringError, match=r"under `if tx < 32` .* inside a loop or nested block") as err:
        _compile(main)
    assert "\n" not in str(err.value)


def test_guarded_branch_that_writes_its_condition_is_refused():
    n = 64

    @T.prim_func
    def main(Flags: T.Tensor((n,), "int32"), A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if Flags[tx] > 0:
                Flags[tx] = 0  # the condition would read something else after the barrier
                B[tx] = A[tx]
                B[n - 1 - tx] = B[n - 1 - tx] + 1.0
            else:
                B[tx] = 0.0

    with pytest.raises(MetalLoweringError, match=r"writes a buffer its condition reads") as err:
        _compile(main)
    assert "\n" not in str(err.value)


def test_value_bound_from_written_memory_across_the_barrier_is_refused():
    n = 64

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            if tx < 32:
                B[tx] = A[tx]
                v = B[tx] * 2.0  # reads what the branch wrote: not the same after the barrier
                B[31 - tx] = B[31 - tx] + v
            else:
                B[tx] = 0.0

    with pytest.raises(MetalLoweringError, match=r"binds v before the barrier it needs \(device memory\) .* T\.alloc_var") as err:
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
