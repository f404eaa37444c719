"""`T.loop_break()` leaves the innermost loop (the Metal printer refused the call `tl.loop_break`
with a CodegenError; found by the adversarial sweep, tests/slow/test_adversarial.py): a serial loop
each thread leaves at its own iteration, after a data-dependent number of steps."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools

import tilelang
import tilelang.language as T
import torch

from tilelang_metal.kernels import plain_metal_target


@functools.lru_cache(maxsize=None)
def running_sum_until():
    """Z[i] = X[i] + (X[i] + 1) + ... summed until the running sum exceeds `limit` (at most 1000 terms)."""
    n = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((n,), "int32"), limit: T.int32, Z: T.Tensor((n,), "int32")):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for t in T.Parallel(64):
                i = bx * 64 + t
                if i < n:
                    total = T.alloc_var("int32")
                    total = 0
                    for k in T.serial(1000):
                        if total > limit:
                            T.loop_break()
                        total = total + X[i] + k
                    Z[i] = total

    return tilelang.compile(main, out_idx=[2], target=plain_metal_target(), execution_backend="emulator")


def reference(x: int, limit: int) -> int:
    total = 0
    for k in range(1000):
        if total > limit:
            break
        total += x + k
    return total


def test_each_thread_leaves_its_loop_at_its_own_iteration():
    kernel = running_sum_until()
    assert "break;" in kernel.get_kernel_source()
    gen = torch.Generator().manual_seed(5)
    for n, limit in ((1, 0), (37, 100), (70, -5), (130, 10**6)):
        x = torch.randint(1, 500, (n,), dtype=torch.int32, generator=gen)
        want = torch.tensor([reference(int(v), limit) for v in x], dtype=torch.int32)
        assert torch.equal(kernel(x, limit), want), f"n={n}, limit={limit}"
