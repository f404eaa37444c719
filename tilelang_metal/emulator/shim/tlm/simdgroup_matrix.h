// simdgroup_matrix<T, Rows, Cols>: each lane holds `elems` adjacent elements of one row (the layout,
// tlm::layout::simdgroup_layout in layouts.h, exists for 8x8 only: the one shape MSL has). Loads and
// stores are per lane; multiply-accumulate is a collective: every lane deposits its A and B elements
// into the simdgroup scratch, and after the rendezvous computes its own results in fp32.
#pragma once

#include "checked_ptr.h"
#include "layouts.h"
#include "runtime_api.h"
#include "vector.h"

namespace metal {

template <class T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "the emulator implements 8x8 simdgroup matrices only");
  using layout = tlm::layout::simdgroup_layout<Rows, Cols>;
  static constexpr int elems_per_lane = layout::elems;
  static_assert(elems_per_lane * 32 == Rows * Cols, "a simdgroup matrix is spread over 32 lanes");
  tlm::vec<T, elems_per_lane> elems;

  // Unspecified on the GPU; NaN here (for float types) so reads before writes show up.
  simdgroup_matrix() {
    if constexpr (tlm::is_floating_v<T>) elems = tlm::vec<T, elems_per_lane>(static_cast<T>(__builtin_nanf("")));
    else elems = tlm::vec<T, elems_per_lane>(static_cast<T>(0));
  }

  TLM_INLINE tlm::vec<T, elems_per_lane>& thread_elements() { return elems; }
  TLM_INLINE const tlm::vec<T, elems_per_lane>& thread_elements() const { return elems; }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int R, int C>
TLM_INLINE simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, R, C> m;
  m.elems = tlm::vec<T, simdgroup_matrix<T, R, C>::elems_per_lane>(value);
  return m;
}

namespace tlm_detail {
// A store through a checked pointer is marked as one (instrumented builds count / race-check it).
template <class P> TLM_INLINE P for_store(const P& p) { return p; }
template <class T> TLM_INLINE tlm::checked_ptr<T> for_store(const tlm::checked_ptr<T>& p) { return p.w(); }

// A lane's `n` adjacent elements at element offset i: one access (counted once). Through a raw
// pointer (foreign MSL) in a memory-traced build, the access is reported here as one of n elements
// and the element-wise copy that follows runs inside a `quiet` scope, so it is not traced again.
template <class E> TLM_INLINE E* run_at(E* p, int64_t i, [[maybe_unused]] int n, [[maybe_unused]] bool store) {
#ifdef TLM_TRACE_MEMORY
  tlm::rt::traced_access(p + i, sizeof(E) * static_cast<uint64_t>(n), store);
#endif
  return p + i;
}
template <class T> TLM_INLINE T* run_at(const tlm::checked_ptr<T>& p, int64_t i, int n, bool) { return p.span(i, n); }

struct quiet {
#ifdef TLM_TRACE_MEMORY
  quiet() { tlm::rt::trace_quiet(1); }
  ~quiet() { tlm::rt::trace_quiet(-1); }
#endif
};

// Linear element offset of matrix position (r, c) in memory (origin = (column, row) of the source).
TLM_INLINE int64_t sg_offset(int r, int c, uint64_t stride, ulong2 origin, bool transpose) {
  int64_t base = static_cast<int64_t>(origin.y) * static_cast<int64_t>(stride) + static_cast<int64_t>(origin.x);
  return transpose ? base + static_cast<int64_t>(c) * static_cast<int64_t>(stride) + r
                   : base + static_cast<int64_t>(r) * static_cast<int64_t>(stride) + c;
}

TLM_INLINE void require_full_simdgroup(const tlm::rt::lane_info& me, const char* op) {
  if (__builtin_expect(me.simd_size != 32, 0)) {
    char msg[160];
    __builtin_snprintf(msg, sizeof msg, "%s needs a full simdgroup of 32 lanes; simdgroup %u has %u lanes",
                       op, me.simd_group, me.simd_size);
    tlm::rt::fatal(msg);
  }
}
}  // namespace tlm_detail

// src: threadgroup / device pointer expression (raw or checked pointer).
template <class T, int R, int C, class P>
TLM_OUTLINE void simdgroup_load(simdgroup_matrix<T, R, C>& d, P src, uint64_t elements_per_row = C,
                                ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false) {
  using L = typename simdgroup_matrix<T, R, C>::layout;
  const int lane = static_cast<int>(tlm::rt::self().lane);
  const int r = L::row(lane), c = L::col(lane);
  if (!transpose_matrix) {  // the lane's elements are adjacent in memory: one access
    auto* q = tlm_detail::run_at(src, tlm_detail::sg_offset(r, c, elements_per_row, matrix_origin, false), L::elems, false);
    tlm_detail::quiet counted_above;
    for (int j = 0; j < L::elems; ++j) d.elems.e_[j] = static_cast<T>(q[j]);
    return;
  }
  for (int j = 0; j < L::elems; ++j)
    d.elems.e_[j] = static_cast<T>(src[tlm_detail::sg_offset(r, c + j, elements_per_row, matrix_origin, transpose_matrix)]);
}

template <class T, int R, int C, class P>
TLM_OUTLINE void simdgroup_store(const simdgroup_matrix<T, R, C>& s, P dst, uint64_t elements_per_row = C,
                                 ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false) {
  using L = typename simdgroup_matrix<T, R, C>::layout;
  const int lane = static_cast<int>(tlm::rt::self().lane);
  const int r = L::row(lane), c = L::col(lane);
  if (!transpose_matrix) {  // the lane's elements are adjacent in memory: one access
    auto* q = tlm_detail::run_at(tlm_detail::for_store(dst), tlm_detail::sg_offset(r, c, elements_per_row, matrix_origin, false), L::elems, true);
    tlm_detail::quiet counted_above;
    for (int j = 0; j < L::elems; ++j) q[j] = static_cast<std::remove_reference_t<decltype(q[j])>>(s.elems.e_[j]);
    return;
  }
  for (int j = 0; j < L::elems; ++j) {
    auto& slot = tlm_detail::for_store(dst)[tlm_detail::sg_offset(r, c + j, elements_per_row, matrix_origin, transpose_matrix)];
    slot = static_cast<std::remove_reference_t<decltype(slot)>>(s.elems.e_[j]);
  }
}

namespace tlm_detail {
// d (M x N) = a (M x K) * b (K x N) (+ c): collective over the simdgroup, fp32 accumulation.
template <class TD, class TA, class TB, class TC, int M, int N, int K, bool Accumulate>
TLM_OUTLINE void sg_mma(simdgroup_matrix<TD, M, N>& d, const simdgroup_matrix<TA, M, K>& a,
                        const simdgroup_matrix<TB, K, N>& b, const simdgroup_matrix<TC, M, N>* c,
                        const char* op) {
  using LA = typename simdgroup_matrix<TA, M, K>::layout;
  using LB = typename simdgroup_matrix<TB, K, N>::layout;
  using LD = typename simdgroup_matrix<TD, M, N>::layout;
  static_assert((M * K + K * N) * sizeof(float) <= tlm::rt::simd_scratch_bytes, "simdgroup matrix operands exceed the scratch");
  const tlm::rt::lane_info& me = tlm::rt::self();
  require_full_simdgroup(me, op);
  const int lane = static_cast<int>(me.lane);
  float* s = static_cast<float*>(tlm::rt::simd_deposit(op));  // [0, M*K): A, [M*K, M*K + K*N): B
  for (int j = 0; j < LA::elems; ++j) s[LA::row(lane) * K + LA::col(lane) + j] = static_cast<float>(a.elems.e_[j]);
  for (int j = 0; j < LB::elems; ++j) s[M * K + LB::row(lane) * N + LB::col(lane) + j] = static_cast<float>(b.elems.e_[j]);
  const float* g = static_cast<const float*>(tlm::rt::simd_arrive());
  const int r = LD::row(lane), col = LD::col(lane);
  float acc[LD::elems];
  for (int j = 0; j < LD::elems; ++j) {
    acc[j] = Accumulate ? static_cast<float>(c->elems.e_[j]) : 0.0f;
    for (int k = 0; k < K; ++k) acc[j] += g[r * K + k] * g[M * K + k * N + col + j];
  }
  for (int j = 0; j < LD::elems; ++j) d.elems.e_[j] = static_cast<TD>(acc[j]);
}
}  // namespace tlm_detail

template <class TD, class TA, class TB, class TC, int M, int N, int K>
TLM_INLINE void simdgroup_multiply_accumulate(simdgroup_matrix<TD, M, N>& d, const simdgroup_matrix<TA, M, K>& a,
                                              const simdgroup_matrix<TB, K, N>& b,
                                              const simdgroup_matrix<TC, M, N>& c) {
  tlm_detail::sg_mma<TD, TA, TB, TC, M, N, K, true>(d, a, b, &c, "simdgroup_multiply_accumulate");
}

template <class TD, class TA, class TB, int M, int N, int K>
TLM_INLINE void simdgroup_multiply(simdgroup_matrix<TD, M, N>& d, const simdgroup_matrix<TA, M, K>& a,
                                   const simdgroup_matrix<TB, K, N>& b) {
  tlm_detail::sg_mma<TD, TA, TB, TD, M, N, K, false>(d, a, b, static_cast<const simdgroup_matrix<TD, M, N>*>(nullptr),
                                                     "simdgroup_multiply");
}

}  // namespace metal
