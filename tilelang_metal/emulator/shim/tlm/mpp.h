// MetalPerformancePrimitives subset: matmul2d over one simdgroup with cooperative tensors.
// Only the descriptor the printer emits is supported: (16, 32, 16), no transposes, destination
// float; accumulation is fp32. relaxed_precision=true is simulated as a bound, not as Apple's
// behaviour (which is unspecified): every input is rounded to 10 explicit mantissa bits first.
#pragma once

#include "layouts.h"
#include "runtime_api.h"
#include "vector.h"

namespace metal {
struct execution_simdgroup {};
template <int N> struct execution_simdgroups {};
}  // namespace metal

namespace mpp::tensor_ops {

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };

  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;

  constexpr matmul2d_descriptor(int m_, int n_, int k_ = -1, bool transpose_left_ = false,
                                bool transpose_right_ = false, bool relaxed_precision_ = false,
                                mode matmul_mode_ = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(transpose_left_), transpose_right(transpose_right_),
        relaxed_precision(relaxed_precision_), matmul_mode(matmul_mode_) {}
};

namespace tlm_detail {

enum class role { left, right, destination };

// The 2-d index of an element: [0] = column (innermost), [1] = row.
struct index2 {
  int v[2];
  constexpr int operator[](int i) const { return v[i]; }
};

template <class T, role R>
struct cooperative_tensor {
  static constexpr int capacity = (R == role::left) ? 8 : 16;
  using element_type = T;
  alignas(16) T elems[capacity];  // runs of 4 are read as `*(thread float4*)(&ct[4 * q])`

  // Contents are unspecified on the GPU; NaN here so that reads before writes show up.
  cooperative_tensor() {
    for (int i = 0; i < capacity; ++i) {
      if constexpr (tlm::is_floating_v<T>) elems[i] = static_cast<T>(__builtin_nanf(""));
      else elems[i] = static_cast<T>(0);
    }
  }

  TLM_INLINE T& operator[](int i) { return elems[i]; }
  TLM_INLINE const T& operator[](int i) const { return elems[i]; }
  static constexpr int get_capacity() { return capacity; }
  static constexpr bool is_valid_element(int i) { return i >= 0 && i < capacity; }
  TLM_INLINE index2 get_multidimensional_index(int i) const {
    const int lane = static_cast<int>(tlm::rt::self().lane);
    return index2{{tlm::layout::ct_col(lane, i), tlm::layout::ct_row(lane, i)}};
  }
};

// An input of a relaxed matmul2d: rounded to nearest-even at 10 explicit mantissa bits, the
// precision of half (and of TF32), exponent range kept. half and bfloat already fit; inf / NaN pass.
// Error: at most 2^-11 relative per input.
template <class T>
TLM_INLINE float relaxed_input(T value) {
  float x = static_cast<float>(value);
  if constexpr (sizeof(T) < sizeof(float)) {
    return x;
  } else {
    uint32_t bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u) return x;
    uint32_t rounded = (bits + 0x0fffu + ((bits >> 13) & 1u)) & ~0x1fffu;
    // the largest floats would round up to inf: truncate them instead (the bound stays finite)
    bits = (rounded & 0x7f800000u) == 0x7f800000u ? (bits & ~0x1fffu) : rounded;
    __builtin_memcpy(&x, &bits, sizeof bits);
    return x;
  }
}

template <bool Relaxed, class T>
TLM_INLINE float matmul_input(T value) {
  if constexpr (Relaxed) return relaxed_input(value);
  else return static_cast<float>(value);
}

template <class T> struct is_tensor_of_role_left : std::false_type {};
template <class T> struct is_tensor_of_role_left<cooperative_tensor<T, role::left>> : std::true_type {};
template <class T> struct is_tensor_of_role_right : std::false_type {};
template <class T> struct is_tensor_of_role_right<cooperative_tensor<T, role::right>> : std::true_type {};

}  // namespace tlm_detail

template <matmul2d_descriptor D, class Scope>
struct matmul2d {
  static_assert(std::is_same_v<Scope, metal::execution_simdgroup>,
                "emulator: matmul2d supports metal::execution_simdgroup only");
  static_assert(D.m == 16 && D.n == 32 && D.k == 16 && !D.transpose_left && !D.transpose_right,
                "emulator: only matmul2d_descriptor(16, 32, 16, false, false, ...) is supported");

  template <class A, class B, class C>
  TLM_INLINE tlm_detail::cooperative_tensor<A, tlm_detail::role::left> get_left_input_cooperative_tensor() const {
    return {};
  }
  template <class A, class B, class C>
  TLM_INLINE tlm_detail::cooperative_tensor<B, tlm_detail::role::right> get_right_input_cooperative_tensor() const {
    return {};
  }
  // Takes the operand tensor types in run()'s order: left first, then right.
  template <class L, class R, class E>
  TLM_INLINE tlm_detail::cooperative_tensor<E, tlm_detail::role::destination> get_destination_cooperative_tensor() const {
    static_assert(tlm_detail::is_tensor_of_role_left<L>::value,
                  "get_destination_cooperative_tensor: first template argument must be the left input tensor type");
    static_assert(tlm_detail::is_tensor_of_role_right<R>::value,
                  "get_destination_cooperative_tensor: second template argument must be the right input tensor type");
    return {};
  }

  // Collective over the simdgroup: dest = left * right (+ dest), fp32.
  template <class TA, class TB, class TD>
  TLM_INLINE void run(const tlm_detail::cooperative_tensor<TA, tlm_detail::role::left>& left,
                      const tlm_detail::cooperative_tensor<TB, tlm_detail::role::right>& right,
                      tlm_detail::cooperative_tensor<TD, tlm_detail::role::destination>& dest) const {
    using namespace tlm::layout;
    const tlm::rt::lane_info& me = tlm::rt::self();
    if (__builtin_expect(me.simd_size != 32, 0)) tlm::rt::fatal("matmul2d::run needs a full simdgroup of 32 lanes");
    const int l = static_cast<int>(me.lane);
    // Scratch: A as 16x16 floats at [0, 256), B as 16x32 floats at [256, 768).
    float* s = static_cast<float*>(tlm::rt::simd_deposit("matmul2d::run"));
    constexpr bool relaxed = D.relaxed_precision;
    for (int e = 0; e < 8; ++e) s[ct_row(l, e) * 16 + ct_col(l, e)] = tlm_detail::matmul_input<relaxed>(left.elems[e]);
    for (int e = 0; e < 16; ++e) s[256 + ct_row(l, e) * 32 + ct_col(l, e)] = tlm_detail::matmul_input<relaxed>(right.elems[e]);
    const float* g = static_cast<const float*>(tlm::rt::simd_arrive());
    const float* A = g;
    const float* B = g + 256;
    typedef float f4 __attribute__((vector_size(16)));
    // Elements 4q..4q+3 are four consecutive columns of one row (checked in layouts.h).
    for (int q = 0; q < 4; ++q) {
      const int r = ct_row(l, 4 * q), c = ct_col(l, 4 * q);
      f4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate) {
        for (int j = 0; j < 4; ++j) acc[j] = static_cast<float>(dest.elems[4 * q + j]);
      }
      for (int kk = 0; kk < 16; ++kk) {
        f4 b;
        __builtin_memcpy(&b, B + kk * 32 + c, sizeof b);
        acc += A[r * 16 + kk] * b;
      }
      for (int j = 0; j < 4; ++j) dest.elems[4 * q + j] = static_cast<TD>(acc[j]);
    }
  }
};

}  // namespace mpp::tensor_ops
