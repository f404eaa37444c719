"""`tilelang_metal.execution.mlx_emulated.metal_kernel`: MLX kernel authors' own `mx.fast.metal_kernel`
bodies, run on `mx.array`s in the emulator where MLX has no Metal GPU (Linux CI), with MLX's
arguments: inputs and outputs by name, grid in threads, template arguments."""

import os

import numpy as np
import pytest

if not os.environ.get("CI"):
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install -e '.[mlx]')")
import mlx.core as mx  # noqa: E402

from tilelang_metal.execution.mlx_emulated import metal_kernel  # noqa: E402

SOFTPLUS = """
    uint i = thread_position_in_grid.x;
    if (i < n) {
        T x = inp[i];
        out[i] = x > T(20) ? x : T(metal::log(1.0f + metal::exp(float(x))));
        scaled[i] = inp[i] * T(SCALE);
    }
"""


def test_user_kernel_with_template_arguments_matches_numpy():
    kernel = metal_kernel(name="softplus", input_names=["inp", "n"], output_names=["out", "scaled"], source=SOFTPLUS)
    x = mx.array(np.linspace(-6, 30, 37, dtype=np.float32))
    out, scaled = kernel(
        inputs=[x, mx.array(37, dtype=mx.uint32)], template=[("T", mx.float32), ("SCALE", 3)],
        grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(37,), (37,)], output_dtypes=[mx.float32, mx.float32],
    )
    xs = np.array(x)
    np.testing.assert_allclose(np.array(out), np.where(xs > 20, xs, np.log1p(np.exp(xs))), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.array(scaled), xs * 3)


def test_the_template_type_follows_the_argument():
    kernel = metal_kernel(name="softplus_half", input_names=["inp", "n"], output_names=["out", "scaled"], source=SOFTPLUS)
    x = mx.array(np.linspace(-3, 3, 16, dtype=np.float32)).astype(mx.float16)
    out, scaled = kernel(
        inputs=[x, mx.array(16, dtype=mx.uint32)], template=[("T", mx.float16), ("SCALE", 2)],
        grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(16,), (16,)], output_dtypes=[mx.float16, mx.float16],
    )
    assert out.dtype == mx.float16
    xs = np.array(x.astype(mx.float32))
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), np.log1p(np.exp(xs)), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(np.array(scaled.astype(mx.float32)), xs * 2)


def test_a_template_argument_of_another_kind_is_refused_in_one_line():
    kernel = metal_kernel(name="bad", input_names=["inp", "n"], output_names=["out", "scaled"], source=SOFTPLUS)
    with pytest.raises(ValueError, match=r"^\[metal_kernel\] template argument T='float': use an MLX dtype, an int or a bool$"):
        kernel(inputs=[mx.zeros((4,)), mx.array(4, dtype=mx.uint32)], template=[("T", "float")], grid=(32, 1, 1),
               threadgroup=(32, 1, 1), output_shapes=[(4,), (4,)], output_dtypes=[mx.float32, mx.float32])
