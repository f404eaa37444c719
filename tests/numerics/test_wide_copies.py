"""16-byte vectorized copies in the emulator: one `uint4` move where both ends are provably aligned
(legalize.UseWideCopies), 4-lane parts where an odd offset breaks the proof (legalize.SplitWideVectors).
Copies are bit-exact, NaN payloads and infinities included, and race-free."""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck

THREADS = 32
BLOCKS = 3


@functools.lru_cache(maxsize=None)
def copy_kernel(dtype: str, lanes: int, offset: int):
    n = BLOCKS * THREADS * lanes

    @T.prim_func
    def main(A: T.Tensor((n + offset,), dtype), B: T.Tensor((n + offset,), dtype)):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            tx = T.get_thread_binding()
            for v in T.vectorized(lanes):
                B[offset + (bx * THREADS + tx) * lanes + v] = A[offset + (bx * THREADS + tx) * lanes + v]

    return tilelang.compile(main, target="metal", execution_backend="emulator"), n


def _inputs(dtype: str, count: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(count)
    if dtype == "int8":
        return torch.randint(-128, 128, (count,), generator=g, dtype=torch.int8)
    a = torch.randn(count, generator=g).half()
    bits = a.view(torch.int16)
    bits[1::7] = 0x7E01  # a NaN with a payload: a float move might canonicalize it, a uint4 move does not
    a[2::11] = float("inf")
    a[3::13] = float("-inf")
    return a


@pytest.mark.parametrize("dtype,lanes", [("float16", 8), ("int8", 16)])
@pytest.mark.parametrize("offset", [0, 3])
def test_wide_copy_is_bit_exact(dtype, lanes, offset):
    kernel, n = copy_kernel(dtype, lanes, offset)
    source = kernel.get_kernel_source()
    assert ("uint4*" in source) == (offset == 0), source
    a = _inputs(dtype, n + offset)
    sentinel = torch.full_like(a, 7)
    b = sentinel.clone()
    racecheck(kernel, a, b)
    b = sentinel.clone()
    kernel(a, b)
    bits = torch.int16 if dtype == "float16" else torch.int8
    assert torch.equal(b[offset:].view(bits), a[offset:].view(bits))
    assert torch.equal(b[:offset], sentinel[:offset])  # nothing before the copied range is written
