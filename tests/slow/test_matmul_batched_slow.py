"""kernels.matmul's elementwise epilogues (relu, gelu_tanh, silu, scale), batched and not, one
kernel each, alternating the targets: against torch with NaN / inf in A (relu keeps NaN, as
torch.relu; Metal's fmax would drop it). The batched routes and addmm / bias / residual run in
tests/numerics/test_matmul_batched.py."""

import math

import pytest
import torch

from tests.numerics.test_matmul_batched import batched_kernel, check, operands, reference


@pytest.mark.slow
@pytest.mark.parametrize("epilogue, chip, batch, alpha", [("relu", "M4", 2, None), ("gelu_tanh", "M5", 2, None), ("silu", "M4", None, None),
                                                    ("scale", "M5", None, -0.75)])
def test_elementwise_epilogue_matches_torch(epilogue, chip, batch, alpha):
    """Batched (B batched) and unbatched (2-D operands) on both targets."""
    M, N, K = 19, 70, 45
    options = {"epilogue": epilogue, **({"batch": batch} if batch else {}), **({"alpha": alpha} if alpha is not None else {})}
    choice, kernel = batched_kernel(M, N, K, chip, **options)
    a, b, _ = operands(batch, M, N, K, "float16", seed=7)
    a[..., 3, 0] = math.nan  # row 3 (of every batch): NaN through every epilogue
    a[..., 5, 2] = math.inf
    out = kernel(a, b)
    check(out, reference(a, b, epilogue, None, choice.alpha), "float16", K)
    assert torch.isnan(out[..., 3, :]).all()


@pytest.mark.slow
def test_batched_split_k_on_metal4_with_shared_b_matches_torch():
    """metal4's split-K (cooperative tensors on 8 simdgroups, staging bypassed), B shared by the batch:
    prime K (2053: the cost model splits it; at K = 601 one launch is cheaper), NaN in one row of the
    second batch only."""
    M, N, K, batch = 16, 40, 2053, 2
    choice, kernel = batched_kernel(M, N, K, "M5", batch=batch, shared_B=True)
    assert choice.route == "split_k" and choice.splits >= 2
    a, b, _ = operands(batch, M, N, K, "float16", shared_B=True, seed=9)
    a[1, 4, 1300] = math.nan
    out = kernel(a, b)
    check(out, reference(a, b), "float16", K)
    assert torch.isnan(out[1, 4]).all() and torch.isfinite(out[0]).all() and torch.isfinite(out[1, 5:]).all()
