// Barriers and simdgroup collectives. All of them are rendezvous points handled by the runtime:
// a threadgroup barrier waits for every thread of the threadgroup, a simd collective for the lanes
// of the caller's simdgroup. Reaching one with only part of the group is reported as an error.
#pragma once

#include "runtime_api.h"
#include "vector.h"

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}

#ifdef TLM_INSTRUMENTED
TLM_INLINE void threadgroup_barrier(mem_flags f = mem_flags::mem_none) {
  tlm::rt::threadgroup_barrier_flags(static_cast<unsigned>(f));
}
#else
TLM_INLINE void threadgroup_barrier(mem_flags = mem_flags::mem_none) { tlm::rt::threadgroup_barrier(); }
#endif

TLM_INLINE void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  tlm::rt::simd_deposit("simdgroup_barrier");
  tlm::rt::simd_arrive();
}

namespace tlm_detail {

// Every lane publishes `v` in its slot; returns the slots of all lanes of the simdgroup.
template <class T>
TLM_INLINE const T* simd_gather(const char* op, const T& v, uint32_t lane) {
  static_assert(sizeof(T) * 32 <= tlm::rt::simd_scratch_bytes, "simd collective value too large");
  T* slots = static_cast<T*>(tlm::rt::simd_deposit(op));
  __builtin_memcpy(static_cast<void*>(slots + lane), &v, sizeof(T));
  return static_cast<const T*>(tlm::rt::simd_arrive());
}

// Pairwise (tree) reduction in the element type, identical on every lane.
template <class T, class F>
TLM_INLINE T simd_reduce(const char* op, const T& v, F combine) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  const T* all = simd_gather(op, v, me.lane);
  T buf[32];
  uint32_t n = me.simd_size;
  for (uint32_t i = 0; i < n; ++i) buf[i] = all[i];
  while (n > 1) {
    uint32_t half_n = (n + 1) / 2;
    for (uint32_t i = 0; i + half_n < n; ++i) buf[i] = combine(buf[i], buf[i + half_n]);
    n = half_n;
  }
  return buf[0];
}

template <class T> TLM_INLINE T add(const T& a, const T& b) { return static_cast<T>(a + b); }
template <class T> TLM_INLINE T vmax(const T& a, const T& b) { return metal::max(a, b); }
template <class T> TLM_INLINE T vmin(const T& a, const T& b) { return metal::min(a, b); }

// Value of lane `src`, or the caller's own value when `src` is not a lane of the simdgroup.
template <class T>
TLM_INLINE T simd_from_lane(const char* op, const T& v, int64_t src) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  const T* all = simd_gather(op, v, me.lane);
  return (src >= 0 && src < static_cast<int64_t>(me.simd_size)) ? all[src] : v;
}

}  // namespace tlm_detail

template <class T> TLM_INLINE T simd_shuffle(T v, ushort lane) {
  return tlm_detail::simd_from_lane("simd_shuffle", v, lane);
}
template <class T> TLM_INLINE T simd_broadcast(T v, ushort lane) {
  return tlm_detail::simd_from_lane("simd_broadcast", v, lane);
}
template <class T> TLM_INLINE T simd_shuffle_xor(T v, ushort mask) {
  return tlm_detail::simd_from_lane("simd_shuffle_xor", v, tlm::rt::self().lane ^ mask);
}
// Lanes whose source would fall outside the simdgroup keep their own value.
template <class T> TLM_INLINE T simd_shuffle_up(T v, ushort delta) {
  return tlm_detail::simd_from_lane("simd_shuffle_up", v, static_cast<int64_t>(tlm::rt::self().lane) - delta);
}
template <class T> TLM_INLINE T simd_shuffle_down(T v, ushort delta) {
  return tlm_detail::simd_from_lane("simd_shuffle_down", v, static_cast<int64_t>(tlm::rt::self().lane) + delta);
}

template <class T> TLM_INLINE T simd_sum(T v) { return tlm_detail::simd_reduce("simd_sum", v, tlm_detail::add<T>); }
template <class T> TLM_INLINE T simd_max(T v) { return tlm_detail::simd_reduce("simd_max", v, tlm_detail::vmax<T>); }
template <class T> TLM_INLINE T simd_min(T v) { return tlm_detail::simd_reduce("simd_min", v, tlm_detail::vmin<T>); }
// Bitwise reductions over the simdgroup (integer types).
template <class T> TLM_INLINE T simd_and(T v) {
  return tlm_detail::simd_reduce("simd_and", v, [](const T& a, const T& b) { return static_cast<T>(a & b); });
}
template <class T> TLM_INLINE T simd_or(T v) {
  return tlm_detail::simd_reduce("simd_or", v, [](const T& a, const T& b) { return static_cast<T>(a | b); });
}
template <class T> TLM_INLINE T simd_xor(T v) {
  return tlm_detail::simd_reduce("simd_xor", v, [](const T& a, const T& b) { return static_cast<T>(a ^ b); });
}
// simd_ballot: bit n of the vote is lane n's predicate (lanes past a partial simdgroup are 0).
struct simd_vote {
  using vote_t = ulong;
  vote_t bits;
  explicit constexpr operator vote_t() const { return bits; }
  constexpr bool any() const { return bits != 0; }
};
TLM_INLINE simd_vote simd_ballot(bool v) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  const bool* all = tlm_detail::simd_gather("simd_ballot", v, me.lane);
  simd_vote::vote_t bits = 0;
  for (uint32_t i = 0; i < me.simd_size; ++i) bits |= static_cast<simd_vote::vote_t>(all[i]) << i;
  return simd_vote{bits};
}
TLM_INLINE bool simd_any(bool v) {
  return tlm_detail::simd_reduce("simd_any", v, [](bool a, bool b) { return a || b; });
}
TLM_INLINE bool simd_all(bool v) {
  return tlm_detail::simd_reduce("simd_all", v, [](bool a, bool b) { return a && b; });
}

}  // namespace metal

// The lane index as a function (the spelling of spec section 1.4, used by the printer instead of a
// [[thread_index_in_simdgroup]] parameter): the calling thread's lane in its simdgroup.
template <class T>
TLM_INLINE T __metal_get_thread_index_in_simdgroup(T) {
  return static_cast<T>(tlm::rt::self().lane);
}
