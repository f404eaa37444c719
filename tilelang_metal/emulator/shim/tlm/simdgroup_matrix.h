// simdgroup_matrix<T, 8, 8>: each lane holds two elements (layout in layouts.h). Loads and stores
// are per lane; multiply-accumulate is a collective: every lane deposits its A and B elements into
// the simdgroup scratch, and after the rendezvous computes its own two results in fp32.
#pragma once

#include "checked_ptr.h"
#include "layouts.h"
#include "runtime_api.h"
#include "vector.h"

namespace metal {

template <class T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "the emulator implements 8x8 simdgroup matrices only");
  tlm::vec<T, 2> elems;

  // Unspecified on the GPU; NaN here (for float types) so reads before writes show up.
  simdgroup_matrix() {
    if constexpr (tlm::is_floating_v<T>) elems = tlm::vec<T, 2>(static_cast<T>(__builtin_nanf("")));
    else elems = tlm::vec<T, 2>(static_cast<T>(0));
  }

  TLM_INLINE tlm::vec<T, 2>& thread_elements() { return elems; }
  TLM_INLINE const tlm::vec<T, 2>& thread_elements() const { return elems; }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int R, int C>
TLM_INLINE simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, R, C> m;
  m.elems = tlm::vec<T, 2>(value);
  return m;
}

namespace tlm_detail {
// A store through a checked pointer is marked as one (instrumented builds count / race-check it).
template <class P> TLM_INLINE P for_store(const P& p) { return p; }
template <class T> TLM_INLINE tlm::checked_ptr<T> for_store(const tlm::checked_ptr<T>& p) { return p.w(); }

// A lane's two adjacent elements at element offset i: one access of two elements (counted once).
template <class E> TLM_INLINE E* pair_at(E* p, int64_t i) { return p + i; }
template <class T> TLM_INLINE T* pair_at(const tlm::checked_ptr<T>& p, int64_t i) { return p.span(i, 2); }

// Linear element offset of matrix position (r, c) in memory (origin = (column, row) of the source).
TLM_INLINE int64_t sg8_offset(int r, int c, uint64_t stride, ulong2 origin, bool transpose) {
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
TLM_INLINE void simdgroup_load(simdgroup_matrix<T, R, C>& d, P src, uint64_t elements_per_row = 8,
                               ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false) {
  const int lane = static_cast<int>(tlm::rt::self().lane);
  const int r = tlm::layout::sg8_row(lane), c = tlm::layout::sg8_col(lane);
  if (!transpose_matrix) {  // the lane's two elements are adjacent in memory: one access
    auto* q = tlm_detail::pair_at(src, tlm_detail::sg8_offset(r, c, elements_per_row, matrix_origin, false));
    for (int j = 0; j < 2; ++j) d.elems.e_[j] = static_cast<T>(q[j]);
    return;
  }
  for (int j = 0; j < 2; ++j)
    d.elems.e_[j] = static_cast<T>(src[tlm_detail::sg8_offset(r, c + j, elements_per_row, matrix_origin, transpose_matrix)]);
}

template <class T, int R, int C, class P>
TLM_INLINE void simdgroup_store(const simdgroup_matrix<T, R, C>& s, P dst, uint64_t elements_per_row = 8,
                                ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false) {
  const int lane = static_cast<int>(tlm::rt::self().lane);
  const int r = tlm::layout::sg8_row(lane), c = tlm::layout::sg8_col(lane);
  if (!transpose_matrix) {  // the lane's two elements are adjacent in memory: one access
    auto* q = tlm_detail::pair_at(tlm_detail::for_store(dst), tlm_detail::sg8_offset(r, c, elements_per_row, matrix_origin, false));
    for (int j = 0; j < 2; ++j) q[j] = static_cast<std::remove_reference_t<decltype(q[j])>>(s.elems.e_[j]);
    return;
  }
  for (int j = 0; j < 2; ++j) {
    auto& slot = tlm_detail::for_store(dst)[tlm_detail::sg8_offset(r, c + j, elements_per_row, matrix_origin, transpose_matrix)];
    slot = static_cast<std::remove_reference_t<decltype(slot)>>(s.elems.e_[j]);
  }
}

namespace tlm_detail {
// d = a * b (+ c): collective over the simdgroup, fp32 accumulation.
template <class TD, class TA, class TB, class TC, bool Accumulate>
TLM_INLINE void sg8_mma(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                        const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>* c,
                        const char* op) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  require_full_simdgroup(me, op);
  const int lane = static_cast<int>(me.lane);
  const int r = tlm::layout::sg8_row(lane), col = tlm::layout::sg8_col(lane);
  float* s = static_cast<float*>(tlm::rt::simd_deposit(op));  // [0, 64): A, [64, 128): B
  for (int j = 0; j < 2; ++j) {
    s[r * 8 + col + j] = static_cast<float>(a.elems.e_[j]);
    s[64 + r * 8 + col + j] = static_cast<float>(b.elems.e_[j]);
  }
  const float* g = static_cast<const float*>(tlm::rt::simd_arrive());
  float acc[2];
  for (int j = 0; j < 2; ++j) {
    acc[j] = Accumulate ? static_cast<float>(c->elems.e_[j]) : 0.0f;
    for (int k = 0; k < 8; ++k) acc[j] += g[r * 8 + k] * g[64 + k * 8 + col + j];
  }
  for (int j = 0; j < 2; ++j) d.elems.e_[j] = static_cast<TD>(acc[j]);
}
}  // namespace tlm_detail

template <class TD, class TA, class TB, class TC>
TLM_INLINE void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                              const simdgroup_matrix<TB, 8, 8>& b,
                                              const simdgroup_matrix<TC, 8, 8>& c) {
  tlm_detail::sg8_mma<TD, TA, TB, TC, true>(d, a, b, &c, "simdgroup_multiply_accumulate");
}

template <class TD, class TA, class TB>
TLM_INLINE void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                   const simdgroup_matrix<TB, 8, 8>& b) {
  tlm_detail::sg8_mma<TD, TA, TB, TD, false>(d, a, b, static_cast<const simdgroup_matrix<TD, 8, 8>*>(nullptr),
                                             "simdgroup_multiply");
}

}  // namespace metal
