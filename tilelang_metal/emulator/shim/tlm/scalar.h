// MSL scalar types: half (_Float16), bfloat (16-bit storage, float arithmetic), uint & co.
#pragma once

#include "config.h"

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;  // 64 bits on LP64, as in MSL
typedef _Float16 half;

namespace tlm {

// float -> bfloat bits with round-to-nearest-even; every NaN becomes the canonical quiet NaN.
constexpr uint16_t float_to_bfloat_bits(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

constexpr float bfloat_bits_to_float(uint16_t b) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16);
}

}  // namespace tlm

struct bfloat;

namespace tlm {
// Arithmetic element types of MSL (std::is_arithmetic does not know _Float16 / bfloat in g++ 12).
template <class T> struct is_scalar : std::bool_constant<std::is_arithmetic_v<T>> {};
template <> struct is_scalar<_Float16> : std::true_type {};
template <> struct is_scalar<bfloat> : std::true_type {};
template <class T> inline constexpr bool is_scalar_v = is_scalar<std::remove_cv_t<T>>::value;

template <class T> inline constexpr bool is_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<T, _Float16> || std::is_same_v<T, bfloat>;

template <class T> inline constexpr bool is_arith_v = is_scalar_v<T> && !std::is_same_v<std::remove_cv_t<T>, bfloat>;
}  // namespace tlm

// 16-bit brain float: stored as bits, computed in float, rounded back after every operation.
struct bfloat {
  uint16_t bits;

  bfloat() = default;
  constexpr bfloat(float f) : bits(tlm::float_to_bfloat_bits(f)) {}
  template <class U, std::enable_if_t<tlm::is_arith_v<U> && !std::is_same_v<U, float>, int> = 0>
  constexpr bfloat(U v) : bits(tlm::float_to_bfloat_bits(static_cast<float>(v))) {}
  constexpr operator float() const { return tlm::bfloat_bits_to_float(bits); }

  static constexpr bfloat from_bits(uint16_t b) { bfloat r; r.bits = b; return r; }

  constexpr bfloat operator-() const { return from_bits(static_cast<uint16_t>(bits ^ 0x8000u)); }
  constexpr bfloat operator+() const { return *this; }

  // bfloat (op) bfloat -> bfloat; bfloat (op) float-like -> float; bfloat (op) integer -> bfloat.
#define TLM_BF_ARITH(op)                                                                      \
  friend constexpr bfloat operator op(bfloat a, bfloat b) { return bfloat(float(a) op float(b)); } \
  template <class U, std::enable_if_t<tlm::is_arith_v<U>, int> = 0>                           \
  friend constexpr auto operator op(bfloat a, U b) {                                          \
    if constexpr (std::is_integral_v<U>) return bfloat(float(a) op static_cast<float>(b));    \
    else return float(a) op static_cast<float>(b);                                            \
  }                                                                                           \
  template <class U, std::enable_if_t<tlm::is_arith_v<U>, int> = 0>                           \
  friend constexpr auto operator op(U a, bfloat b) {                                          \
    if constexpr (std::is_integral_v<U>) return bfloat(static_cast<float>(a) op float(b));    \
    else return static_cast<float>(a) op float(b);                                            \
  }                                                                                           \
  template <class U, std::enable_if_t<tlm::is_scalar_v<U>, int> = 0>                          \
  constexpr bfloat& operator op##=(U b) { *this = bfloat(float(*this) op static_cast<float>(b)); return *this; }
  TLM_BF_ARITH(+)
  TLM_BF_ARITH(-)
  TLM_BF_ARITH(*)
  TLM_BF_ARITH(/)
#undef TLM_BF_ARITH

#define TLM_BF_CMP(op)                                                                       \
  friend constexpr bool operator op(bfloat a, bfloat b) { return float(a) op float(b); }     \
  template <class U, std::enable_if_t<tlm::is_arith_v<U>, int> = 0>                          \
  friend constexpr bool operator op(bfloat a, U b) { return float(a) op static_cast<float>(b); } \
  template <class U, std::enable_if_t<tlm::is_arith_v<U>, int> = 0>                          \
  friend constexpr bool operator op(U a, bfloat b) { return static_cast<float>(a) op float(b); }
  TLM_BF_CMP(==)
  TLM_BF_CMP(!=)
  TLM_BF_CMP(<)
  TLM_BF_CMP(>)
  TLM_BF_CMP(<=)
  TLM_BF_CMP(>=)
#undef TLM_BF_CMP

  bfloat& operator++() { return *this += 1; }
  bfloat& operator--() { return *this -= 1; }
};

static_assert(sizeof(bfloat) == 2 && std::is_trivially_copyable_v<bfloat> &&
              std::is_trivially_default_constructible_v<bfloat>);
static_assert(tlm::float_to_bfloat_bits(1.0f) == 0x3f80);
static_assert(tlm::float_to_bfloat_bits(__builtin_nanf("")) == 0x7fc0);
// 1 + 2^-8 is exactly half-way between two bfloats: ties go to the even one (1.0).
static_assert(tlm::float_to_bfloat_bits(1.00390625f) == 0x3f80);
static_assert(tlm::float_to_bfloat_bits(1.01171875f) == 0x3f82);

namespace metal {
using ::bfloat;
using ::half;
using ::uchar;
using ::uint;
using ::ulong;
using ::ushort;
}  // namespace metal
