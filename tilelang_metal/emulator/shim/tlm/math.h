// metal:: math builtins. Float-like scalars compute in float (GCC builtins, no <cmath> so that
// nothing leaks into the global namespace next to `using namespace metal;`), then round back to
// the argument type. Vectors apply the scalar function lane by lane.
#pragma once

#include "vector.h"

// Float constants Metal's <metal_math> defines as macros (the printer writes INFINITY / NAN for
// non-finite literals, e.g. the -inf start of a max reduction).
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef MAXFLOAT
#define MAXFLOAT (__FLT_MAX__)
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf())
#endif

// <metal_math>'s float constants (MSL spec, "Math functions"): M_LOG2E_F, M_LN2_F ... (MLX's steel
// attention works in base 2 with them).
#define M_E_F 2.71828182845904523536028747135266250f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_LOG10E_F 0.434294481903251827651128918916605082f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LN10_F 2.30258509299404568401799145468436421f
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_PI_2_F 1.57079632679489661923132169163975144f
#define M_PI_4_F 0.785398163397448309615660845819875721f
#define M_1_PI_F 0.318309886183790671537767526745028724f
#define M_2_PI_F 0.636619772367581343075535053490057448f
#define M_2_SQRTPI_F 1.12837916709551257389615890312154517f
#define M_SQRT2_F 1.41421356237309504880168872420969808f
#define M_SQRT1_2_F 0.707106781186547524400844362104849039f

namespace metal {

namespace tlm_detail {
template <class R, class T, int N, class F>
constexpr tlm::vec<R, N> map(const tlm::vec<T, N>& v, F f) {
  tlm::vec<R, N> r;
  for (int i = 0; i < N; ++i) r.e_[i] = f(v.e_[i]);
  return r;
}
template <class R, class T, int N, class F>
constexpr tlm::vec<R, N> map2(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b, F f) {
  tlm::vec<R, N> r;
  for (int i = 0; i < N; ++i) r.e_[i] = f(a.e_[i], b.e_[i]);
  return r;
}
}  // namespace tlm_detail

// Unary float functions: float, half, bfloat (and double, which in MSL source is a float literal).
#define TLM_MATH_UNARY(name, impl)                                                          \
  TLM_INLINE float name(float x) { return impl(x); }                                        \
  TLM_INLINE float name(double x) { return impl(static_cast<float>(x)); }                   \
  TLM_INLINE half name(half x) { return static_cast<half>(impl(static_cast<float>(x))); }   \
  template <class B, std::enable_if_t<std::is_same_v<B, bfloat>, int> = 0> /* MLX defines */ \
  TLM_INLINE B name(B x) { return bfloat(impl(static_cast<float>(x))); }                    \
  template <class T, int N>                                                                 \
  TLM_INLINE tlm::vec<T, N> name(const tlm::vec<T, N>& v) {                                 \
    return tlm_detail::map<T>(v, [](T x) { return static_cast<T>(name(x)); });              \
  }

namespace tlm_impl {
TLM_INLINE float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
TLM_INLINE float rint_away(float x) { return __builtin_roundf(x); }
}  // namespace tlm_impl

TLM_MATH_UNARY(exp, __builtin_expf)
TLM_MATH_UNARY(exp2, __builtin_exp2f)
TLM_MATH_UNARY(exp10, [](float v) { return __builtin_powf(10.0f, v); })
TLM_MATH_UNARY(log, __builtin_logf)
TLM_MATH_UNARY(log2, __builtin_log2f)
TLM_MATH_UNARY(log10, __builtin_log10f)
TLM_MATH_UNARY(sqrt, __builtin_sqrtf)
TLM_MATH_UNARY(rsqrt, tlm_impl::rsqrt)
TLM_MATH_UNARY(tanh, __builtin_tanhf)
TLM_MATH_UNARY(sinh, __builtin_sinhf)
TLM_MATH_UNARY(cosh, __builtin_coshf)
TLM_MATH_UNARY(sin, __builtin_sinf)
TLM_MATH_UNARY(cos, __builtin_cosf)
TLM_MATH_UNARY(tan, __builtin_tanf)
TLM_MATH_UNARY(asin, __builtin_asinf)
TLM_MATH_UNARY(acos, __builtin_acosf)
TLM_MATH_UNARY(atan, __builtin_atanf)
TLM_MATH_UNARY(acosh, __builtin_acoshf)
TLM_MATH_UNARY(asinh, __builtin_asinhf)
TLM_MATH_UNARY(atanh, __builtin_atanhf)
TLM_MATH_UNARY(fabs, __builtin_fabsf)
TLM_MATH_UNARY(floor, __builtin_floorf)
TLM_MATH_UNARY(ceil, __builtin_ceilf)
TLM_MATH_UNARY(round, tlm_impl::rint_away)  // MSL round: halfway cases away from zero
TLM_MATH_UNARY(rint, __builtin_rintf)
TLM_MATH_UNARY(trunc, __builtin_truncf)
#undef TLM_MATH_UNARY

// abs: float-like via fabs, integers directly.
TLM_INLINE float abs(float x) { return __builtin_fabsf(x); }
TLM_INLINE float abs(double x) { return __builtin_fabsf(static_cast<float>(x)); }
TLM_INLINE half abs(half x) { return static_cast<half>(__builtin_fabsf(static_cast<float>(x))); }
// bfloat overloads are templates, so that a header defining its own (MLX's bf16_math.h, as Metal
// has none) takes precedence instead of redefining them.
template <class B, std::enable_if_t<std::is_same_v<B, bfloat>, int> = 0>
TLM_INLINE B abs(B x) { return bfloat::from_bits(static_cast<uint16_t>(x.bits & 0x7fffu)); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
TLM_INLINE T abs(T x) { return x < 0 ? static_cast<T>(-x) : x; }
template <class T, int N>
TLM_INLINE tlm::vec<T, N> abs(const tlm::vec<T, N>& v) {
  return tlm_detail::map<T>(v, [](T x) { return static_cast<T>(abs(x)); });
}

// Mixed-type scalar arguments promote like C++ arithmetic (`max(h, 0.0f)` is a float).
template <class A, class B>
using binary_result_t =
    std::conditional_t<std::is_same_v<A, B>, A, decltype(std::declval<A>() + std::declval<B>())>;

template <class R> TLM_INLINE R tlm_float_result(float v) { return static_cast<R>(v); }

#define TLM_MATH_BINARY(name, scalar_expr)                                                   \
  template <class A, class B, std::enable_if_t<tlm::is_scalar_v<A> && tlm::is_scalar_v<B>, int> = 0> \
  TLM_INLINE binary_result_t<A, B> name(A a_, B b_) {                                        \
    using R = binary_result_t<A, B>;                                                         \
    R a = static_cast<R>(a_), b = static_cast<R>(b_);                                        \
    return scalar_expr;                                                                      \
  }                                                                                          \
  template <class T, int N>                                                                  \
  TLM_INLINE tlm::vec<T, N> name(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b) {         \
    return tlm_detail::map2<T>(a, b, [](T x, T y) { return static_cast<T>(name(x, y)); });   \
  }                                                                                          \
  template <class T, int N>                                                                  \
  TLM_INLINE tlm::vec<T, N> name(const tlm::vec<T, N>& a, std::type_identity_t<T> b) {       \
    return name(a, tlm::vec<T, N>(b));                                                       \
  }                                                                                          \
  template <class T, int N>                                                                  \
  TLM_INLINE tlm::vec<T, N> name(std::type_identity_t<T> a, const tlm::vec<T, N>& b) {       \
    return name(tlm::vec<T, N>(a), b);                                                       \
  }

// Metal's max / min / fmax / fmin on floats (and simd_max / simd_min, built on them): when exactly
// one operand is NaN the other one is the result (IEEE 754 maxNum / minNum), two NaNs give NaN.
// Zeros compare by sign (+0 is the larger), so the result never depends on operand order and a
// reduction gives the same value in any element order. Integers compare plainly.
namespace tlm_detail {
template <class R> TLM_INLINE bool is_nan_value(R v) { return v != v; }
template <class R> TLM_INLINE bool sign_bit(R v) { return __builtin_signbit(static_cast<float>(v)); }
template <class R> TLM_INLINE R max_number(R a, R b) {
  if constexpr (tlm::is_floating_v<R>) {
    if (is_nan_value(a)) return b;
    if (is_nan_value(b)) return a;
    if (a == b) return sign_bit(a) ? b : a;
  }
  return a < b ? b : a;
}
template <class R> TLM_INLINE R min_number(R a, R b) {
  if constexpr (tlm::is_floating_v<R>) {
    if (is_nan_value(a)) return b;
    if (is_nan_value(b)) return a;
    if (a == b) return sign_bit(a) ? a : b;
  }
  return b < a ? b : a;
}
}  // namespace tlm_detail

TLM_MATH_BINARY(max, (tlm_detail::max_number<R>(a, b)))
TLM_MATH_BINARY(min, (tlm_detail::min_number<R>(a, b)))
TLM_MATH_BINARY(fmax, (tlm_detail::max_number<R>(a, b)))
TLM_MATH_BINARY(fmin, (tlm_detail::min_number<R>(a, b)))
TLM_MATH_BINARY(pow, (R(__builtin_powf(static_cast<float>(a), static_cast<float>(b)))))
TLM_MATH_BINARY(powr, (R(__builtin_powf(static_cast<float>(a), static_cast<float>(b)))))
TLM_MATH_BINARY(fmod, (R(__builtin_fmodf(static_cast<float>(a), static_cast<float>(b)))))
TLM_MATH_BINARY(atan2, (R(__builtin_atan2f(static_cast<float>(a), static_cast<float>(b)))))
TLM_MATH_BINARY(divide, (a / b))
TLM_MATH_BINARY(copysign, (R(__builtin_copysignf(static_cast<float>(a), static_cast<float>(b)))))
#undef TLM_MATH_BINARY

template <class A, class B, class C,
          std::enable_if_t<tlm::is_scalar_v<A> && tlm::is_scalar_v<B> && tlm::is_scalar_v<C>, int> = 0>
TLM_INLINE auto fma(A a, B b, C c) {
  using R = binary_result_t<binary_result_t<A, B>, C>;
  return static_cast<R>(__builtin_fmaf(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)));
}
template <class T, int N>
TLM_INLINE tlm::vec<T, N> fma(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b, const tlm::vec<T, N>& c) {
  tlm::vec<T, N> r;
  for (int i = 0; i < N; ++i) r.e_[i] = static_cast<T>(fma(a.e_[i], b.e_[i], c.e_[i]));
  return r;
}

// ldexp(x, k): x * 2^k with an integer exponent (MSL has no float-exponent form).
template <class T, class K, std::enable_if_t<tlm::is_floating_v<T> && std::is_integral_v<K>, int> = 0>
TLM_INLINE T ldexp(T x, K k) { return static_cast<T>(__builtin_ldexpf(static_cast<float>(x), static_cast<int>(k))); }
template <class T, class K, int N>
TLM_INLINE tlm::vec<T, N> ldexp(const tlm::vec<T, N>& x, const tlm::vec<K, N>& k) {
  tlm::vec<T, N> r;
  for (int i = 0; i < N; ++i) r.e_[i] = ldexp(x.e_[i], k.e_[i]);
  return r;
}

template <class T, class L, class H>
TLM_INLINE auto clamp(T x, L lo, H hi) { return min(max(x, lo), hi); }

// Classification.
template <class T, std::enable_if_t<tlm::is_scalar_v<T>, int> = 0>
TLM_INLINE bool isnan(T x) { return __builtin_isnan(static_cast<float>(x)); }
template <class T, std::enable_if_t<tlm::is_scalar_v<T>, int> = 0>
TLM_INLINE bool isinf(T x) { return __builtin_isinf(static_cast<float>(x)); }
template <class T, std::enable_if_t<tlm::is_scalar_v<T>, int> = 0>
TLM_INLINE bool isfinite(T x) { return __builtin_isfinite(static_cast<float>(x)); }
template <class T, int N>
TLM_INLINE tlm::vec<bool, N> isnan(const tlm::vec<T, N>& v) { return tlm_detail::map<bool>(v, [](T x) { return isnan(x); }); }
template <class T, int N>
TLM_INLINE tlm::vec<bool, N> isinf(const tlm::vec<T, N>& v) { return tlm_detail::map<bool>(v, [](T x) { return isinf(x); }); }
template <class T, int N>
TLM_INLINE tlm::vec<bool, N> isfinite(const tlm::vec<T, N>& v) { return tlm_detail::map<bool>(v, [](T x) { return isfinite(x); }); }

// select(a, b, c) = c ? b : a, lane-wise for vectors.
template <class A, class B, std::enable_if_t<tlm::is_scalar_v<A> && tlm::is_scalar_v<B>, int> = 0>
TLM_INLINE binary_result_t<A, B> select(A a, B b, bool c) {
  using R = binary_result_t<A, B>;
  return c ? static_cast<R>(b) : static_cast<R>(a);
}
template <class T, int N>
TLM_INLINE tlm::vec<T, N> select(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b, const tlm::vec<bool, N>& c) {
  tlm::vec<T, N> r;
  for (int i = 0; i < N; ++i) r.e_[i] = c.e_[i] ? b.e_[i] : a.e_[i];
  return r;
}
template <class T, int N>
TLM_INLINE tlm::vec<T, N> select(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b, bool c) {
  return c ? b : a;
}

template <int N> TLM_INLINE bool all(const tlm::vec<bool, N>& v) {
  for (int i = 0; i < N; ++i) if (!v.e_[i]) return false;
  return true;
}
template <int N> TLM_INLINE bool any(const tlm::vec<bool, N>& v) {
  for (int i = 0; i < N; ++i) if (v.e_[i]) return true;
  return false;
}
TLM_INLINE bool all(bool v) { return v; }
TLM_INLINE bool any(bool v) { return v; }

template <class T, int N>
TLM_INLINE T dot(const tlm::vec<T, N>& a, const tlm::vec<T, N>& b) {
  T s = static_cast<T>(0);
  for (int i = 0; i < N; ++i) s = static_cast<T>(s + a.e_[i] * b.e_[i]);
  return s;
}

// MSL reinterpretation between same-size types.
template <class To, class From>
TLM_INLINE To as_type(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of equal size");
  return __builtin_bit_cast(To, v);
}

// precise:: and fast:: variants compute the same way on the CPU.
// Using-declarations, not a using-directive: a header that adds its own overload to fast:: (MLX's
// bf16_math.h adds bfloat ones) must not hide the float ones from qualified lookup.
#define TLM_MATH_NAMES                                                                           \
  using metal::cos; using metal::exp; using metal::exp2; using metal::log; using metal::log2;    \
  using metal::pow; using metal::rsqrt; using metal::sin; using metal::sqrt; using metal::tan;   \
  using metal::tanh; using metal::fmax; using metal::fmin; using metal::max; using metal::min;   \
  using metal::fabs; using metal::abs; using metal::exp10; using metal::log10; using metal::sinh; \
  using metal::cosh; using metal::powr; using metal::divide; using metal::acos; using metal::asin; \
  using metal::atan; using metal::acosh; using metal::asinh; using metal::atanh; using metal::atan2; \
  using metal::floor; using metal::ceil; using metal::round; using metal::rint; using metal::trunc; \
  using metal::fmod; using metal::fma; using metal::ldexp; using metal::copysign; using metal::clamp; \
  using metal::isnan; using metal::isinf; using metal::isfinite;
namespace precise {
TLM_MATH_NAMES
}  // namespace precise
namespace fast {
TLM_MATH_NAMES
}  // namespace fast
#undef TLM_MATH_NAMES

}  // namespace metal

