"""What MLX's NAX kernels need from the shim, each on a small kernel of our own: matmul2d(16, 32, 16)
with transposed operands (held as the stored, transposed matrix: docs/lane_layouts.md section 2),
a cooperative tensor indexed past its capacity, metal::vec<T, 8>. The front door's attributes and
library additions MLX's headers need are tested in test_foreign.py."""

from __future__ import annotations

import functools

import pytest
import torch

from tilelang_metal.emulator import EmulatorRuntimeError, compile_msl

# One simdgroup computes D (16 x 32, float) = op(A) @ op(B) + D0. A and B are the stored row-major
# matrices (A: 16 x 16 either way; B: 16 x 32, or 32 x 16 when transposed). Every lane fills its
# operand elements the way MLX's BaseNAXFrag does, written out here: within a 16 x 16 block,
# element i sits at row ((l >> 2) & 4) + ((l >> 1) & 3) + 8 * (i >> 2) and column
# 4 * (((l >> 2) & 2) + (l & 1)) + (i & 3) of the *stored* block; elements 8..15 of B are the second
# block, to the right (not transposed) or below (transposed), as MLX's mma fills ct_b[8 + i] from Bn1.
MATMUL_T = r"""
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;

template <bool TL, bool TR>
[[kernel]] void mm(const device half* A [[buffer(0)]], const device half* B [[buffer(1)]],
                   device float* D [[buffer(2)]], ushort l [[thread_index_in_simdgroup]]) {
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, TL, TR, false,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
  auto a = op.template get_left_input_cooperative_tensor<half, half, float>();
  auto b = op.template get_right_input_cooperative_tensor<half, half, float>();
  auto d = op.template get_destination_cooperative_tensor<decltype(a), decltype(b), float>();
  const int fr = ((l >> 2) & 4) + ((l >> 1) & 3), fc = 4 * (((l >> 2) & 2) + (l & 1));
  for (int i = 0; i < 8; ++i) {
    const int r = fr + 8 * (i >> 2), c = fc + (i & 3);
    a[i] = A[r * 16 + c];
    b[i] = TR ? B[r * 16 + c] : B[r * 32 + c];
    b[8 + i] = TR ? B[(16 + r) * 16 + c] : B[r * 32 + 16 + c];
  }
  for (int i = 0; i < d.get_capacity(); ++i) {
    auto idx = d.get_multidimensional_index(i);
    d[i] = D[idx[1] * 32 + idx[0]];
  }
  op.run(a, b, d);
  for (int i = 0; i < d.get_capacity(); ++i) {
    auto idx = d.get_multidimensional_index(i);
    D[idx[1] * 32 + idx[0]] = d[i];
  }
}
template [[host_name("mm_nn")]] [[kernel]] decltype(mm<false, false>) mm<false, false>;
template [[host_name("mm_nt")]] [[kernel]] decltype(mm<false, true>) mm<false, true>;
template [[host_name("mm_tn")]] [[kernel]] decltype(mm<true, false>) mm<true, false>;
template [[host_name("mm_tt")]] [[kernel]] decltype(mm<true, true>) mm<true, true>;
"""


@functools.lru_cache(maxsize=None)
def _mm(name: str):
    return compile_msl(MATMUL_T, name)


@pytest.mark.parametrize("tl,tr", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul2d_transposed_operands_are_the_stored_transposed_matrices(tl, tr):
    torch.manual_seed(1)
    a = torch.randn(16, 16).half()  # op(A) = a.T when transposed
    b = (torch.randn(32, 16) if tr else torch.randn(16, 32)).half()
    d0 = torch.randn(16, 32)
    d = d0.clone()
    _mm(f"mm_{'t' if tl else 'n'}{'t' if tr else 'n'}").launch([a, b, d], grid=(1,), block=(32,))
    ref = (a.float().T if tl else a.float()) @ (b.float().T if tr else b.float()) + d0
    torch.testing.assert_close(d, ref, rtol=1e-5, atol=1e-4)


OUT_OF_RANGE = r"""
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
[[kernel]] void oob(device float* D [[buffer(0)]], ushort l [[thread_index_in_simdgroup]]) {
  constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16);
  mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
  auto a = op.get_left_input_cooperative_tensor<half, half, float>();
  for (int i = 0; i < 16; ++i) a[i] = half(1.0f);  // a 16 x 16 left input holds 8 elements per lane
  D[l] = float(a[0]);
}
"""


def test_cooperative_tensor_index_past_its_capacity_is_an_error():
    # MLX's second BaseNAXFrag::mma overload (TN == 1) writes ct_a[8 + i] with this descriptor; no
    # MLX GEMM instantiation reaches it (SN / 16 = 2 in all of them), but a kernel that does is wrong.
    with pytest.raises(EmulatorRuntimeError, match=r"cooperative tensor index out of range \(left input of matmul2d\)"):
        compile_msl(OUT_OF_RANGE, "oob").launch([torch.zeros(32)], grid=(1,), block=(32,))


# MLX's NAX fragments are metal::vec<T, 8> (Metal's vectors are clang ext_vector_types of any width).
VEC8 = r"""
#include <metal_stdlib>
using namespace metal;
[[kernel]] void vec8(const device half* x [[buffer(0)]], device float* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  metal::vec<half, 8> v(half(0));
  for (int j = 0; j < 8; ++j) v[j] = x[8 * i + j];
  metal::vec<half, 8> w = v * half(2) + v;  // 3 v, element-wise in half
  float acc = 0.0f;
  for (int j = 0; j < 8; ++j) acc += float(w[j]);
  out[i] = acc;
}
"""


def test_vec8_is_element_wise_in_its_type():
    x = torch.randn(4 * 8).half()
    out = torch.full((4,), float("nan"))
    compile_msl(VEC8, "vec8").launch([x, out], grid=(1,), block=(4,))
    ref = (x.view(-1, 8) * 2 + x.view(-1, 8)).float().sum(1)  # half arithmetic, then summed in float
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
