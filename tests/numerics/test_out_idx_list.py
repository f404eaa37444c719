"""`tilelang.compile(..., out_idx=a_list)` leaves the caller's list as it was.

tilelang's adapter base class turns negative indices into positions by writing into the list it
is given: a list shared by compiles of kernels with different parameter counts named another
parameter in the second compile. With [-1] used for a two-parameter kernel first, it became [1],
and the three-parameter `C = A + B * 2` kernel then took B as its output and wrote C into the
caller's second tensor (silently wrong; found by the adversarial sweep, tests/slow/test_adversarial.py).
"""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import tilelang.language as T
import torch
from test_calling_convention import compile_emulated, symbolic_rows


def tripled(n: int = 32):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32):
            for i in T.Parallel(n):
                B[i] = A[i] * 3.0

    return main


def test_a_shared_out_idx_list_names_the_last_parameter_in_every_compile():
    outputs = [-1]
    triple = compile_emulated(tripled(), out_idx=outputs)  # A, B
    assert outputs == [-1]
    rows = compile_emulated(symbolic_rows(), out_idx=outputs)  # A, B, C
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    b_before = b.clone()
    c = rows(a, b)
    torch.testing.assert_close(c, a + b_before * 2, rtol=0, atol=0)
    assert torch.equal(b, b_before)
    x = torch.randn(32, generator=gen)
    torch.testing.assert_close(triple(x), x * 3, rtol=0, atol=0)
