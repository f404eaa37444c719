"""kernels.rope in the emulator against a float64 torch reference of MLX's formula and against
mx.fast.rope (MLX's CPU build): both pair layouts (halves, traditional adjacent pairs), a base, scale
and offset other than the defaults, head dims whose half is a multiple of 4, of 2 only, odd (runs of
4, 2, 1 pairs), NaN / inf in x, fp16 / bf16, the metal4 target, the race checker, one-line errors."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.emulator import counters, racecheck

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SHAPE = (2, 5, 3)  # batch, seq_len, heads
CUSTOM = {"base": 500.0, "scale": 0.5, "offset": 3}


@functools.lru_cache(maxsize=None)
def rope_kernel(head_dim: int, traditional: bool, dtype: str = "float32", custom: bool = True, metal4: bool = False):
    options = CUSTOM if custom else {}
    target = kernels.metal4_target() if metal4 else None
    return kernels.rope(*SHAPE, head_dim, traditional=traditional, dtype=dtype, target=target, execution_backend="emulator", **options)


def reference(x: torch.Tensor, traditional: bool, base: float = 10000.0, scale: float = 1.0, offset: int = 0) -> torch.Tensor:
    """MLX's rope in float64: angle = (offset + s) * scale * base^(-i / (d / 2)) for pair i."""
    seq_len, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = ((offset + torch.arange(seq_len, dtype=torch.float64)) * scale)[:, None] * inv_freq[None, :]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    wide = x.double()
    a, b = (wide[..., 0::2], wide[..., 1::2]) if traditional else (wide[..., :half], wide[..., half:])
    first, second = a * cos - b * sin, a * sin + b * cos
    out = torch.stack([first, second], -1).reshape(x.shape) if traditional else torch.cat([first, second], -1)
    return out.to(x.dtype)


def random_x(head_dim: int, dtype: str = "float32", seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return (torch.randn(*SHAPE, head_dim) * 2).to(TORCH[dtype])


@pytest.mark.parametrize("head_dim, traditional", [(8, False), (8, True), (12, False), (6, True)])  # runs of 4, 2, 1 pairs
def test_float32_matches_reference(head_dim, traditional):
    x = random_x(head_dim, seed=head_dim)
    out = rope_kernel(head_dim, traditional)(x)
    torch.testing.assert_close(out, reference(x, traditional, **CUSTOM), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("traditional", [False, True])
def test_mlx_fast_rope_agrees(traditional):
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build is the second reference")
    import numpy as np

    x = random_x(8, seed=1)
    # mx.fast.rope takes positions from the second-to-last axis: (batch, heads, seq_len, head_dim)
    expected = mx.fast.rope(mx.array(x.transpose(1, 2).numpy()), 8, traditional=traditional, **CUSTOM)
    expected = torch.from_numpy(np.array(expected)).transpose(1, 2)
    torch.testing.assert_close(rope_kernel(8, traditional)(x), expected, rtol=1e-5, atol=1e-5)


def test_non_finite_inputs_propagate_as_in_the_reference():
    x = random_x(8, seed=2)
    x[0, 0, 0, 1] = math.nan
    x[0, 1, 2, 0] = math.inf
    x[1, 4, 1, 6] = -math.inf
    out = rope_kernel(8, False)(x)
    torch.testing.assert_close(out, reference(x, False, **CUSTOM), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isnan(out[0, 0, 0, [1, 5]]).all() and torch.isfinite(out[1, :4]).all()


@pytest.mark.parametrize("dtype, traditional", [("float16", False), ("bfloat16", True)])
def test_half_inputs_with_default_frequencies(dtype, traditional):
    x = random_x(8, dtype, seed=3)
    out = rope_kernel(8, traditional, dtype, custom=False)(x)
    assert out.dtype == TORCH[dtype]
    ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    torch.testing.assert_close(out.float(), reference(x, traditional).float(), rtol=ulp, atol=ulp)


def test_race_free_vector_loads_without_threadgroup_memory():
    kernel = rope_kernel(8, True)
    x = random_x(8, seed=4)
    torch.testing.assert_close(racecheck(kernel, x, seeds=(0, 1)), reference(x, True, **CUSTOM), rtol=1e-5, atol=1e-5)
    total = counters(kernel, x).total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0, total
    assert total["device_load_instructions"] == x.numel() // 4 and total["narrow_device_loads"] == 0, total  # float4 runs


@functools.lru_cache(maxsize=None)
def rope_at_offset_kernel():
    return kernels.rope(*SHAPE, 8, offset=None, base=CUSTOM["base"], scale=CUSTOM["scale"], dtype="float32", execution_backend="emulator")


def test_offset_at_call_time_serves_every_decoding_step():
    """offset=None: kernel(x, offset), one kernel for every cache length (MLX's rope takes it at run
    time too); the positions 4000.. lose float32 angle bits, as MLX's do: compared with MLX's at 2e-4."""
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build is the second reference")
    import numpy as np

    kernel = rope_at_offset_kernel()
    x = random_x(8, seed=6)
    for offset in (0, 3, 4000):
        out = kernel(x, offset)
        expected = mx.fast.rope(mx.array(x.transpose(1, 2).numpy()), 8, traditional=False, base=CUSTOM["base"], scale=CUSTOM["scale"], offset=offset)
        torch.testing.assert_close(out, torch.from_numpy(np.array(expected)).transpose(1, 2), rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(out, reference(x, False, CUSTOM["base"], CUSTOM["scale"], offset), rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(kernel(x, 3), rope_kernel(8, False)(x), rtol=0, atol=0)  # the same angles as a built-in offset 3


def test_metal4_target_matches_plain_metal():
    x = random_x(8, seed=5)
    torch.testing.assert_close(rope_kernel(8, False, metal4=True)(x), rope_kernel(8, False)(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.rope(1, 4, 2, 7, dtype="float32"), r"rope head_dim=7 must be a positive even number"),
        (lambda: kernels.rope(0, 4, 2, 8, dtype="float32"), r"rope needs batch >= 1 \(got 0\)"),
        (lambda: kernels.rope(1, 4, 2, 8, offset=-1, dtype="float32"), r"rope offset=-1 must be >= 0"),
        (lambda: kernels.rope(1, 4, 2, 8, base=0.0, dtype="float32"), r"rope base=0.0 must be a finite number > 0"),
        (lambda: kernels.rope(1, 4, 2, 8, scale=math.inf, dtype="float32"), r"rope scale=inf must be a finite number > 0"),
        (lambda: kernels.rope(1, 4, 2, 8, dtype="int8"), r"rope dtype='int8' is not supported"),
        (lambda: kernels.rope(1, 4.0, 2, 8, dtype="float32"), r"rope seq_len=4.0 must be an integer"),
        (lambda: kernels.rope(1, 4, 2, 8, traditional="yes", dtype="float32"), r"rope traditional='yes' must be True or False"),
        (lambda: kernels.rope(2**16, 2**10, 32, 128, dtype="float16"), r"rope x has 274877906944 elements, over 2147483647"),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
