// Parts of Metal's standard library that hand-written MSL uses and the plugin's printer does not
// (MLX's kernels, through compile_msl): METAL_FUNC, numeric_limits, the type traits of
// <metal_type_traits>, the `h` / `bf` literal suffixes, more simd collectives, and the compiler
// builtins (`__metal_fabs(x, mode)`, `__metal_simd_sum(x)`, ...) that MLX's bf16_math.h calls.
#pragma once

#include "atomic.h"
#include "math.h"
#include "sync.h"
#include "vector.h"

#ifndef METAL_FUNC
#define METAL_FUNC inline __attribute__((always_inline))
#endif
// Math modes passed to the __metal_* builtins; the emulator computes every mode the same way.
#define __METAL_MAYBE_FAST_MATH__ 0
#define __METAL_FAST_MATH__ 1
#define __METAL_PRECISE_MATH__ 2

// The half literal suffix: 1.0h (suffixes without `_` are the implementation's).
#pragma GCC diagnostic push
#if defined(__clang__)
#pragma GCC diagnostic ignored "-Wuser-defined-literals"
#else
#pragma GCC diagnostic ignored "-Wliteral-suffix"
#endif
constexpr half operator"" h(long double v) { return static_cast<half>(static_cast<float>(v)); }
constexpr half operator"" h(unsigned long long v) { return static_cast<half>(static_cast<float>(v)); }
#pragma GCC diagnostic pop

namespace metal {

// <metal_type_traits>: std's, with half and bfloat counted as floating point (as in MSL). Only names
// MSL has: `is_empty`, `void_t` and `make_void` are not among them, and MLX's steel/utils/type_traits.h
// defines them in namespace metal (a using-declaration of std's would conflict with that).
using std::bool_constant; using std::conditional; using std::conditional_t; using std::decay;
using std::decay_t; using std::enable_if; using std::enable_if_t; using std::false_type;
using std::integral_constant; using std::is_convertible; using std::is_convertible_v;
using std::is_integral; using std::is_integral_v;
using std::is_same; using std::is_same_v; using std::is_signed; using std::is_signed_v;
using std::is_unsigned; using std::is_unsigned_v; using std::make_signed; using std::make_signed_t;
using std::make_unsigned; using std::make_unsigned_t; using std::remove_const; using std::remove_const_t;
using std::remove_cv; using std::remove_cv_t; using std::remove_reference; using std::remove_reference_t;
using std::true_type; using std::is_pointer; using std::is_pointer_v;
// Metal's address-space trait (MLX's integral_constant.h): every type here is in the thread space.
template <class T> struct remove_addrspace { using type = T; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;
template <class T> struct is_floating_point : std::bool_constant<tlm::is_floating_v<std::remove_cv_t<T>>> {};
template <class T> inline constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic : std::bool_constant<tlm::is_scalar_v<T>> {};
template <class T> inline constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> struct is_scalar : std::bool_constant<tlm::is_scalar_v<T>> {};
template <class T> inline constexpr bool is_scalar_v = is_scalar<T>::value;
template <class T> struct is_vector : std::bool_constant<tlm::is_vec_v<T>> {};
template <class T> inline constexpr bool is_vector_v = is_vector<T>::value;

// Metal's internal spelling of std::disjunction (MLX's atomic.h uses it under `#pragma METAL internals`).
template <class... B> using _disjunction = std::disjunction<B...>;
template <class... B> using _conjunction = std::conjunction<B...>;

// atomic<T> (<metal_atomic>): the shim's atomic objects.
template <class T> using atomic = tlm_atomic<T>;

// metal::array<T, N> (<metal_array>): a fixed-size aggregate.
template <class T, size_t N>
struct array {
  T _elems[N];
  constexpr size_t size() const { return N; }
  constexpr T& operator[](size_t i) { return _elems[i]; }
  constexpr const T& operator[](size_t i) const { return _elems[i]; }
};

// uniform<T> (<metal_uniform>): a value the programmer promises is the same in every thread, a hint
// for the GPU compiler (MLX's gemv.h loop bounds). Here it is the value itself.
template <class T> using uniform = T;
template <class T> constexpr T make_uniform(T value) { return value; }

// numeric_limits for MSL's scalar types (IEEE values; half and bfloat from their bit patterns).
template <class T> struct numeric_limits;
template <class T, T Lo, T Hi>
struct tlm_integer_limits {
  static constexpr bool is_specialized = true, is_signed = Lo != 0, is_integer = true, has_infinity = false;
  static constexpr T min() { return Lo; }
  static constexpr T lowest() { return Lo; }
  static constexpr T max() { return Hi; }
};
template <> struct numeric_limits<bool> : tlm_integer_limits<bool, false, true> {};
template <> struct numeric_limits<char> : tlm_integer_limits<char, -128, 127> {};
template <> struct numeric_limits<signed char> : tlm_integer_limits<signed char, -128, 127> {};
template <> struct numeric_limits<uchar> : tlm_integer_limits<uchar, 0, 255> {};
template <> struct numeric_limits<short> : tlm_integer_limits<short, -32768, 32767> {};
template <> struct numeric_limits<ushort> : tlm_integer_limits<ushort, 0, 65535> {};
template <> struct numeric_limits<int> : tlm_integer_limits<int, (-2147483647 - 1), 2147483647> {};
template <> struct numeric_limits<uint> : tlm_integer_limits<uint, 0u, 4294967295u> {};
template <> struct numeric_limits<long> : tlm_integer_limits<long, (-9223372036854775807L - 1), 9223372036854775807L> {};
template <> struct numeric_limits<ulong> : tlm_integer_limits<ulong, 0ul, 18446744073709551615ul> {};
template <> struct numeric_limits<long long> : tlm_integer_limits<long long, (-9223372036854775807LL - 1), 9223372036854775807LL> {};
template <> struct numeric_limits<unsigned long long> : tlm_integer_limits<unsigned long long, 0ull, 18446744073709551615ull> {};

template <> struct numeric_limits<float> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, has_infinity = true;
  static constexpr float min() { return __FLT_MIN__; }
  static constexpr float max() { return __FLT_MAX__; }
  static constexpr float lowest() { return -__FLT_MAX__; }
  static constexpr float epsilon() { return __FLT_EPSILON__; }
  static constexpr float infinity() { return __builtin_inff(); }
  static constexpr float quiet_NaN() { return __builtin_nanf(""); }
  static constexpr float denorm_min() { return __FLT_DENORM_MIN__; }
};
template <> struct numeric_limits<half> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, has_infinity = true;
  static constexpr half min() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x0400)); }
  static constexpr half max() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x7BFF)); }
  static constexpr half lowest() { return __builtin_bit_cast(half, static_cast<uint16_t>(0xFBFF)); }
  static constexpr half epsilon() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x1400)); }
  static constexpr half infinity() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x7C00)); }
  static constexpr half quiet_NaN() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x7E00)); }
  static constexpr half denorm_min() { return __builtin_bit_cast(half, static_cast<uint16_t>(0x0001)); }
};
template <> struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, has_infinity = true;
  static constexpr bfloat min() { return bfloat::from_bits(0x0080); }
  static constexpr bfloat max() { return bfloat::from_bits(0x7F7F); }
  static constexpr bfloat lowest() { return bfloat::from_bits(0xFF7F); }
  static constexpr bfloat epsilon() { return bfloat::from_bits(0x3C00); }
  static constexpr bfloat infinity() { return bfloat::from_bits(0x7F80); }
  static constexpr bfloat quiet_NaN() { return bfloat::from_bits(0x7FC0); }
  static constexpr bfloat denorm_min() { return bfloat::from_bits(0x0001); }
};
template <class T> struct numeric_limits<const T> : numeric_limits<T> {};

// More simd collectives. Segments of `modulo` lanes: shuffle_and_fill_down gives lane i (position p
// in its segment) the value of lane i + delta while p + delta < modulo, else `fill` of the lane
// p + delta - modulo of the segment; _up mirrors it. rotate_* wrap around the simdgroup. Prefix
// sums and products combine the lanes in lane order, in the element type.
namespace tlm_detail {
template <class T>
TLM_INLINE void simd_gather2(const char* op, const T& a, const T& b, T* all_a, T* all_b) {
  static_assert(2 * sizeof(T) * 32 <= tlm::rt::simd_scratch_bytes, "simd collective value too large");
  const tlm::rt::lane_info& me = tlm::rt::self();
  T* slots = static_cast<T*>(tlm::rt::simd_deposit(op));
  __builtin_memcpy(static_cast<void*>(slots + me.lane), &a, sizeof(T));
  __builtin_memcpy(static_cast<void*>(slots + 32 + me.lane), &b, sizeof(T));
  const T* all = static_cast<const T*>(tlm::rt::simd_arrive());
  for (uint32_t i = 0; i < me.simd_size; ++i) {
    all_a[i] = all[i];
    all_b[i] = all[32 + i];
  }
}
template <class T, class F>
TLM_INLINE T simd_prefix(const char* op, const T& v, bool inclusive, T identity, F combine) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  const T* all = simd_gather(op, v, me.lane);
  T acc = identity;
  const uint32_t last = inclusive ? me.lane + 1 : me.lane;
  for (uint32_t i = 0; i < last; ++i) acc = combine(acc, all[i]);
  return acc;
}
}  // namespace tlm_detail

template <class T> TLM_INLINE T simd_shuffle_and_fill_down(T data, T fill, ushort delta, ushort modulo) {
  T a[32], f[32];
  tlm_detail::simd_gather2("simd_shuffle_and_fill_down", data, fill, a, f);
  const uint32_t lane = tlm::rt::self().lane, m = modulo ? modulo : 32, base = lane - lane % m, p = lane % m + delta;
  return p < m ? a[base + p] : f[base + p - m];
}
template <class T> TLM_INLINE T simd_shuffle_and_fill_down(T data, T fill, ushort delta) {
  return simd_shuffle_and_fill_down(data, fill, delta, ushort(32));
}
template <class T> TLM_INLINE T simd_shuffle_and_fill_up(T data, T fill, ushort delta, ushort modulo) {
  T a[32], f[32];
  tlm_detail::simd_gather2("simd_shuffle_and_fill_up", data, fill, a, f);
  const int32_t lane = static_cast<int32_t>(tlm::rt::self().lane), m = modulo ? modulo : 32, base = lane - lane % m;
  const int32_t p = lane % m - static_cast<int32_t>(delta);
  return p >= 0 ? a[base + p] : f[base + p + m];
}
template <class T> TLM_INLINE T simd_shuffle_and_fill_up(T data, T fill, ushort delta) {
  return simd_shuffle_and_fill_up(data, fill, delta, ushort(32));
}
template <class T> TLM_INLINE T simd_shuffle_rotate_down(T v, ushort delta) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  return tlm_detail::simd_from_lane("simd_shuffle_rotate_down", v, (me.lane + delta) % me.simd_size);
}
template <class T> TLM_INLINE T simd_shuffle_rotate_up(T v, ushort delta) {
  const tlm::rt::lane_info& me = tlm::rt::self();
  return tlm_detail::simd_from_lane("simd_shuffle_rotate_up", v, (me.lane + me.simd_size - delta % me.simd_size) % me.simd_size);
}
template <class T> TLM_INLINE T simd_product(T v) {
  return tlm_detail::simd_reduce("simd_product", v, [](const T& a, const T& b) { return static_cast<T>(a * b); });
}
template <class T> TLM_INLINE T simd_prefix_inclusive_sum(T v) {
  return tlm_detail::simd_prefix("simd_prefix_inclusive_sum", v, true, T(0), tlm_detail::add<T>);
}
template <class T> TLM_INLINE T simd_prefix_exclusive_sum(T v) {
  return tlm_detail::simd_prefix("simd_prefix_exclusive_sum", v, false, T(0), tlm_detail::add<T>);
}
template <class T> TLM_INLINE T simd_prefix_inclusive_product(T v) {
  return tlm_detail::simd_prefix("simd_prefix_inclusive_product", v, true, T(1), [](const T& a, const T& b) { return static_cast<T>(a * b); });
}
template <class T> TLM_INLINE T simd_prefix_exclusive_product(T v) {
  return tlm_detail::simd_prefix("simd_prefix_exclusive_product", v, false, T(1), [](const T& a, const T& b) { return static_cast<T>(a * b); });
}

}  // namespace metal

// Compiler builtins behind Metal's library functions, as MLX's bf16_math.h calls them: the math
// ones take the math mode as a last argument (ignored: every mode computes the same here).
#define TLM_METAL_BUILTIN_1(name, fn) \
  template <class T, class M> TLM_INLINE auto __metal_##name(T x, M) { return metal::fn(x); }
#define TLM_METAL_BUILTIN_2(name, fn) \
  template <class T, class U, class M> TLM_INLINE auto __metal_##name(T x, U y, M) { return metal::fn(x, y); }
TLM_METAL_BUILTIN_1(fabs, fabs) TLM_METAL_BUILTIN_1(acos, acos) TLM_METAL_BUILTIN_1(acosh, acosh)
TLM_METAL_BUILTIN_1(asin, asin) TLM_METAL_BUILTIN_1(asinh, asinh) TLM_METAL_BUILTIN_1(atan, atan)
TLM_METAL_BUILTIN_1(atanh, atanh) TLM_METAL_BUILTIN_1(ceil, ceil) TLM_METAL_BUILTIN_1(cos, cos)
TLM_METAL_BUILTIN_1(cosh, cosh) TLM_METAL_BUILTIN_1(exp, exp) TLM_METAL_BUILTIN_1(exp2, exp2)
TLM_METAL_BUILTIN_1(exp10, exp10) TLM_METAL_BUILTIN_1(floor, floor) TLM_METAL_BUILTIN_1(log, log)
TLM_METAL_BUILTIN_1(log2, log2) TLM_METAL_BUILTIN_1(log10, log10) TLM_METAL_BUILTIN_1(rint, rint)
TLM_METAL_BUILTIN_1(round, round) TLM_METAL_BUILTIN_1(rsqrt, rsqrt) TLM_METAL_BUILTIN_1(sin, sin)
TLM_METAL_BUILTIN_1(sinh, sinh) TLM_METAL_BUILTIN_1(sqrt, sqrt) TLM_METAL_BUILTIN_1(tan, tan)
TLM_METAL_BUILTIN_1(tanh, tanh) TLM_METAL_BUILTIN_1(trunc, trunc)
TLM_METAL_BUILTIN_2(atan2, atan2) TLM_METAL_BUILTIN_2(fmax, fmax) TLM_METAL_BUILTIN_2(fmin, fmin)
TLM_METAL_BUILTIN_2(fmod, fmod) TLM_METAL_BUILTIN_2(pow, pow) TLM_METAL_BUILTIN_2(powr, powr)
TLM_METAL_BUILTIN_2(divide, divide)
#undef TLM_METAL_BUILTIN_1
#undef TLM_METAL_BUILTIN_2
template <class T, class M> TLM_INLINE auto __metal_cospi(T x, M) { return metal::cos(static_cast<float>(x) * 3.14159265358979f); }
template <class T, class M> TLM_INLINE auto __metal_sinpi(T x, M) { return metal::sin(static_cast<float>(x) * 3.14159265358979f); }
template <class T, class M> TLM_INLINE auto __metal_tanpi(T x, M) { return metal::tan(static_cast<float>(x) * 3.14159265358979f); }
template <class T, class M> TLM_INLINE T __metal_fract(T x, M) { return x - metal::floor(x); }
template <class T, class U, class M> TLM_INLINE auto __metal_fmax3(T x, U y, U z, M) { return metal::fmax(metal::fmax(x, y), z); }
template <class T, class U, class M> TLM_INLINE auto __metal_fmin3(T x, U y, U z, M) { return metal::fmin(metal::fmin(x, y), z); }
template <class T, class U, class M> TLM_INLINE auto __metal_fmedian3(T x, U y, U z, M) {
  return metal::fmax(metal::fmin(x, y), metal::fmin(metal::fmax(x, y), z));
}
template <class T, class U, class V> TLM_INLINE auto __metal_fma(T x, U y, V z) { return metal::fma(x, y, z); }
template <class T, class K, class M> TLM_INLINE auto __metal_ldexp(T x, K k, M) { return metal::ldexp(x, k); }
template <class T, class U> TLM_INLINE T __metal_nextafter(T x, U y) { return __builtin_nextafterf(x, y); }
template <class T, class K> TLM_INLINE T __metal_frexp(T x, K* e) { int ee; T r = __builtin_frexpf(x, &ee); *e = ee; return r; }

#define TLM_METAL_SIMD_1(name) template <class T> TLM_INLINE T __metal_##name(T x) { return metal::name(x); }
#define TLM_METAL_SIMD_2(name) template <class T, class U> TLM_INLINE T __metal_##name(T x, U y) { return metal::name(x, static_cast<ushort>(y)); }
TLM_METAL_SIMD_1(simd_sum) TLM_METAL_SIMD_1(simd_max) TLM_METAL_SIMD_1(simd_min) TLM_METAL_SIMD_1(simd_product)
TLM_METAL_SIMD_1(simd_prefix_inclusive_sum) TLM_METAL_SIMD_1(simd_prefix_exclusive_sum)
TLM_METAL_SIMD_1(simd_prefix_inclusive_product) TLM_METAL_SIMD_1(simd_prefix_exclusive_product)
TLM_METAL_SIMD_2(simd_broadcast) TLM_METAL_SIMD_2(simd_shuffle) TLM_METAL_SIMD_2(simd_shuffle_down)
TLM_METAL_SIMD_2(simd_shuffle_up) TLM_METAL_SIMD_2(simd_shuffle_xor) TLM_METAL_SIMD_2(simd_shuffle_rotate_down)
TLM_METAL_SIMD_2(simd_shuffle_rotate_up)
#undef TLM_METAL_SIMD_1
#undef TLM_METAL_SIMD_2
// simd_xor of a float value combines the bit patterns (MLX's bfloat simd_xor passes a float).
template <class T> TLM_INLINE T __metal_simd_xor(T x) {
  if constexpr (std::is_integral_v<T>) {
    return metal::simd_xor(x);
  } else {
    using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    return __builtin_bit_cast(T, metal::simd_xor(__builtin_bit_cast(Bits, x)));
  }
}
template <class T, class D, class M>
TLM_INLINE T __metal_simd_shuffle_and_fill_down(T d, T f, D delta, M modulo) {
  return metal::simd_shuffle_and_fill_down(d, f, static_cast<ushort>(delta), static_cast<ushort>(modulo));
}
template <class T, class D, class M>
TLM_INLINE T __metal_simd_shuffle_and_fill_up(T d, T f, D delta, M modulo) {
  return metal::simd_shuffle_and_fill_up(d, f, static_cast<ushort>(delta), static_cast<ushort>(modulo));
}
// The simdgroup's width (threads_per_simdgroup): 32 on Apple GPUs.
template <class T> TLM_INLINE T __metal_get_simdgroup_size(T) { return static_cast<T>(32); }
