// metal_integer bit counts: popcount, clz, ctz for 8/16/32/64-bit integers (scalar and vector);
// the result has the argument's type, as in MSL. clz(0) and ctz(0) are the bit width.
#pragma once

#include "vector.h"

namespace metal {

namespace tlm_detail {
template <class T>
using bits_of = std::make_unsigned_t<T>;
template <class T>
constexpr int width_of = static_cast<int>(sizeof(T) * 8);
}  // namespace tlm_detail

template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
TLM_INLINE T popcount(T x) {
  return static_cast<T>(__builtin_popcountll(static_cast<unsigned long long>(static_cast<tlm_detail::bits_of<T>>(x))));
}
template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
TLM_INLINE T clz(T x) {
  const auto u = static_cast<unsigned long long>(static_cast<tlm_detail::bits_of<T>>(x));
  if (u == 0) return static_cast<T>(tlm_detail::width_of<T>);
  return static_cast<T>(__builtin_clzll(u) - (64 - tlm_detail::width_of<T>));
}
template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
TLM_INLINE T ctz(T x) {
  const auto u = static_cast<unsigned long long>(static_cast<tlm_detail::bits_of<T>>(x));
  if (u == 0) return static_cast<T>(tlm_detail::width_of<T>);
  return static_cast<T>(__builtin_ctzll(u));
}
template <class T, int N>
TLM_INLINE tlm::vec<T, N> popcount(const tlm::vec<T, N>& v) { return tlm_detail::map<T>(v, [](T x) { return popcount(x); }); }
template <class T, int N>
TLM_INLINE tlm::vec<T, N> clz(const tlm::vec<T, N>& v) { return tlm_detail::map<T>(v, [](T x) { return clz(x); }); }
template <class T, int N>
TLM_INLINE tlm::vec<T, N> ctz(const tlm::vec<T, N>& v) { return tlm_detail::map<T>(v, [](T x) { return ctz(x); }); }

}  // namespace metal
