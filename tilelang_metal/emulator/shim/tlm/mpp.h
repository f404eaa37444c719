// MetalPerformancePrimitives subset: matmul2d over one simdgroup with cooperative tensors.
// Descriptor (16, 32, 16) with either transpose flag (the printer sets them for transpose_A / transpose_B; MLX's NAX
// kernels use all four); accumulation is fp32. A transposed operand's cooperative tensor holds the
// stored (transposed) matrix in the layout of tlm::layout::ct_block_row/col (docs/lane_layouts.md). relaxed_precision=true is simulated as a bound, not as Apple's
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

// A cooperative tensor holding a stored Rows x Cols matrix (the transposed one for a transposed
// operand), Rows * Cols / 32 elements per lane.
template <class T, role R, int Rows, int Cols>
struct cooperative_tensor {
  static constexpr int capacity = Rows * Cols / 32;
  using element_type = T;
  alignas(16) T elems[capacity];  // runs of 4 are read as `*(thread float4*)(&ct[4 * q])`

  // Contents are unspecified on the GPU; NaN here so that reads before writes show up.
  cooperative_tensor() {
    for (int i = 0; i < capacity; ++i) {
      if constexpr (tlm::is_floating_v<T>) elems[i] = static_cast<T>(__builtin_nanf(""));
      else elems[i] = static_cast<T>(0);
    }
  }

  // An index past the capacity would write the next variable of the lane on a GPU too: an error.
  TLM_INLINE T& operator[](int i) { return elems[checked(i)]; }
  TLM_INLINE const T& operator[](int i) const { return elems[checked(i)]; }
  static constexpr int get_capacity() { return capacity; }
  static constexpr bool is_valid_element(int i) { return i >= 0 && i < capacity; }
  TLM_INLINE index2 get_multidimensional_index(int i) const {
    const int lane = static_cast<int>(tlm::rt::self().lane);
    return index2{{tlm::layout::ct_block_col(lane, i, Cols), tlm::layout::ct_block_row(lane, i, Cols)}};
  }

 private:
  static TLM_INLINE int checked(int i) {
    if (__builtin_expect(static_cast<unsigned>(i) >= static_cast<unsigned>(capacity), 0)) {
      tlm::rt::fatal(R == role::left    ? "cooperative tensor index out of range (left input of matmul2d)"
                     : R == role::right ? "cooperative tensor index out of range (right input of matmul2d)"
                                        : "cooperative tensor index out of range (destination of matmul2d)");
    }
    return i;
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
template <class T, int R, int C> struct is_tensor_of_role_left<cooperative_tensor<T, role::left, R, C>> : std::true_type {};
template <class T> struct is_tensor_of_role_right : std::false_type {};
template <class T, int R, int C> struct is_tensor_of_role_right<cooperative_tensor<T, role::right, R, C>> : std::true_type {};

}  // namespace tlm_detail

template <matmul2d_descriptor D, class Scope>
struct matmul2d {
  static_assert(std::is_same_v<Scope, metal::execution_simdgroup>,
                "emulator: matmul2d supports metal::execution_simdgroup only");
  static_assert(D.m == 16 && D.n == 32 && D.k == 16,
                "emulator: only matmul2d_descriptor(16, 32, 16, transpose_left, transpose_right, ...) is supported");

  // Stored shapes of the operands: a transposed operand is held as the transposed matrix.
  static constexpr int left_rows = D.transpose_left ? D.k : D.m, left_cols = D.transpose_left ? D.m : D.k;
  static constexpr int right_rows = D.transpose_right ? D.n : D.k, right_cols = D.transpose_right ? D.k : D.n;
  template <class T> using left_t = tlm_detail::cooperative_tensor<T, tlm_detail::role::left, left_rows, left_cols>;
  template <class T> using right_t = tlm_detail::cooperative_tensor<T, tlm_detail::role::right, right_rows, right_cols>;
  template <class T> using destination_t = tlm_detail::cooperative_tensor<T, tlm_detail::role::destination, D.m, D.n>;

  template <class A, class B, class C>
  TLM_INLINE left_t<A> get_left_input_cooperative_tensor() const {
    return {};
  }
  template <class A, class B, class C>
  TLM_INLINE right_t<B> get_right_input_cooperative_tensor() const {
    return {};
  }
  // Takes the operand tensor types in run()'s order: left first, then right.
  template <class L, class R, class E>
  TLM_INLINE destination_t<E> get_destination_cooperative_tensor() const {
    static_assert(tlm_detail::is_tensor_of_role_left<L>::value,
                  "get_destination_cooperative_tensor: first template argument must be the left input tensor type");
    static_assert(tlm_detail::is_tensor_of_role_right<R>::value,
                  "get_destination_cooperative_tensor: second template argument must be the right input tensor type");
    return {};
  }

  // Collective over the simdgroup: dest = op(left) * op(right) (+ dest), fp32, op = transpose
  // where the descriptor says so.
  template <class TA, class TB, class TD>
  TLM_OUTLINE void run(const left_t<TA>& left, const right_t<TB>& right, destination_t<TD>& dest) const {
    using namespace tlm::layout;
    constexpr int M = D.m, N = D.n, K = D.k;
    static_assert((M * K + K * N) * sizeof(float) <= tlm::rt::simd_scratch_bytes, "matmul2d operands exceed the simd scratch");
    const tlm::rt::lane_info& me = tlm::rt::self();
    if (__builtin_expect(me.simd_size != 32, 0)) tlm::rt::fatal("matmul2d::run needs a full simdgroup of 32 lanes");
    const int l = static_cast<int>(me.lane);
    // Scratch: op(left) as M x K floats at [0, M*K), op(right) as K x N floats after it.
    float* s = static_cast<float*>(tlm::rt::simd_deposit("matmul2d::run"));
    constexpr bool relaxed = D.relaxed_precision;
    for (int e = 0; e < left_t<TA>::capacity; ++e) {
      const int r = ct_block_row(l, e, left_cols), c = ct_block_col(l, e, left_cols);
      const int m = D.transpose_left ? c : r, k = D.transpose_left ? r : c;
      s[m * K + k] = tlm_detail::matmul_input<relaxed>(left.elems[e]);
    }
    for (int e = 0; e < right_t<TB>::capacity; ++e) {
      const int r = ct_block_row(l, e, right_cols), c = ct_block_col(l, e, right_cols);
      const int k = D.transpose_right ? c : r, n = D.transpose_right ? r : c;
      s[M * K + k * N + n] = tlm_detail::matmul_input<relaxed>(right.elems[e]);
    }
    const float* g = static_cast<const float*>(tlm::rt::simd_arrive());
    const float* A = g;
    const float* B = g + M * K;
    typedef float f4 __attribute__((vector_size(16)));
    // Elements 4q..4q+3 are four consecutive columns of one row (checked in layouts.h).
    for (int q = 0; q < destination_t<TD>::capacity / 4; ++q) {
      const int r = ct_block_row(l, 4 * q, N), c = ct_block_col(l, 4 * q, N);
      f4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate) {
        for (int j = 0; j < 4; ++j) acc[j] = static_cast<float>(dest.elems[4 * q + j]);
      }
      for (int kk = 0; kk < K; ++kk) {
        f4 b;
        __builtin_memcpy(&b, B + kk * N + c, sizeof b);
        acc += A[r * K + kk] * b;
      }
      for (int j = 0; j < 4; ++j) dest.elems[4 * q + j] = static_cast<TD>(acc[j]);
    }
  }
};

}  // namespace mpp::tensor_ops
