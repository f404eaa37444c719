"""`constant T& NAME [[ buffer(i) ]]` scalar parameters: parsed, passed by value, checked at launch."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal.emulator import EmulatorLaunchError, compile_kernel

SCALED_ADD = """#include <metal_stdlib>
using namespace metal;

[[kernel, max_total_threads_per_threadgroup(32)]] void scaled_add(
  const device float* __restrict A [[ buffer(0) ]],
  constant float& alpha [[ buffer(1) ]],
  device float* __restrict B [[ buffer(2) ]],
  constant int& n [[ buffer(3) ]],
  constant half& beta [[ buffer(4) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint tid [[thread_index_in_threadgroup]]) {
  int i = ((int)blockIdx.x) * 32 + (int)tid;
  if (i < n) {
    B[i] = A[i] * alpha + (float)beta;
  }
}
"""


@pytest.fixture(scope="module")
def scaled_add():
    return compile_kernel(SCALED_ADD)


def test_scalars_are_passed_by_value_in_buffer_order(scaled_add):
    sig = scaled_add.signature
    assert [p.name for p in sig.bound] == ["A", "alpha", "B", "n", "beta"]
    a = torch.randn(70)
    b = torch.full((70,), float("nan"))
    scaled_add.launch([a, 1.5, b, 61, 0.25], grid=(3, 1, 1), block=(32, 1, 1))
    torch.testing.assert_close(b[:61], a[:61] * 1.5 + 0.25, rtol=0, atol=0)
    assert torch.isnan(b[61:]).all()  # n bounds the writes


def test_scalar_accepts_a_one_element_tensor(scaled_add):
    a = torch.randn(32)
    b = torch.zeros(32)
    scaled_add.launch([a, torch.tensor(-2.0), b, torch.tensor([32], dtype=torch.int32), 0.0], grid=(1, 1, 1), block=(32, 1, 1))
    torch.testing.assert_close(b, a * -2.0, rtol=0, atol=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda a, b: [a, "x", b, 4, 0.0], "parameter 'alpha' (buffer 1, constant float&): expected a number, got str"),
        (lambda a, b: [a, 1.0, b, 2**40, 0.0], "parameter 'n' (buffer 3, constant int&): 1099511627776 does not fit in torch.int32"),
        (lambda a, b: [a, 1.0, b, 4], "kernel scaled_add takes 5 buffer(s) (A, alpha, B, n, beta), got 4 argument(s)"),
        (lambda a, b: [a, torch.ones(2), b, 4, 0.0], "expected a number or a one-element CPU torch.float32 tensor"),
    ],
)
def test_bad_scalar_arguments_are_refused(scaled_add, args, message):
    a, b = torch.zeros(32), torch.zeros(32)
    with pytest.raises(EmulatorLaunchError) as err:
        scaled_add.launch(args(a, b), grid=(1, 1, 1), block=(32, 1, 1))
    assert message in str(err.value)
