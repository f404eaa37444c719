// MSL vector types as plain structs: 2, 3 and 4 lanes with .xyzw names; metal::vec<T, N> of other
// widths (Metal's vectors are clang ext_vector_types: MLX's NAX fragments are vec<T, 8>) by index only.
//
// Deliberately *not* over-aligned: a cast like `*(thread float4*)(local + 4)` must be valid on any
// element-aligned address, and the checked pointers verify MSL's vector alignment themselves.
#pragma once

#include "scalar.h"

namespace tlm {

template <class T, int N> struct vec;

template <class T, int N> struct vec_storage {
  static_assert(N >= 2 && N <= 64, "metal::vec<T, N>: N from 2 to 64 in the emulator");
  T e_[N];
};
template <class T> struct vec_storage<T, 2> {
  union { T e_[2]; struct { T x, y; }; };
};
template <class T> struct vec_storage<T, 3> {
  union { T e_[3]; struct { T x, y, z; }; };
};
template <class T> struct vec_storage<T, 4> {
  union { T e_[4]; struct { T x, y, z, w; }; };
};

template <class T> struct is_vec : std::false_type {};
template <class T, int N> struct is_vec<vec<T, N>> : std::true_type {};
template <class T> inline constexpr bool is_vec_v = is_vec<std::remove_cvref_t<T>>::value;

// Number of scalar lanes an argument contributes to a vector constructor.
template <class A> constexpr int lanes_of() {
  if constexpr (is_vec_v<A>) return std::remove_cvref_t<A>::size;
  else return 1;
}

template <class T, int N>
struct vec : vec_storage<T, N> {
  static constexpr int size = N;
  using element_type = T;
  using vec_storage<T, N>::e_;

  vec() = default;

  // Scalar broadcast; implicit so that `v * 2.0f` and `float4 v = 0.0f` work as in MSL.
  template <class U, std::enable_if_t<is_scalar_v<U>, int> = 0>
  constexpr vec(U s) {
    for (int i = 0; i < N; ++i) e_[i] = static_cast<T>(s);
  }

  // Element-type conversion between vectors of the same width: `half4(float4_value)`.
  template <class U>
  explicit constexpr vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) e_[i] = static_cast<T>(o.e_[i]);
  }

  // Component-wise construction from scalars and smaller vectors: float4(a, b, c, d), float4(f2, f2).
  template <class A0, class A1, class... As,
            std::enable_if_t<(lanes_of<A0>() + lanes_of<A1>() + (0 + ... + lanes_of<As>())) == N, int> = 0>
  constexpr vec(const A0& a0, const A1& a1, const As&... as) {
    int i = 0;
    put(i, a0);
    put(i, a1);
    (put(i, as), ...);
  }

  constexpr T& operator[](int i) { return e_[i]; }
  constexpr const T& operator[](int i) const { return e_[i]; }

#define TLM_VEC_ARITH(op)                                                                   \
  friend constexpr vec operator op(const vec& a, const vec& b) {                            \
    vec r;                                                                                  \
    for (int i = 0; i < N; ++i) r.e_[i] = static_cast<T>(a.e_[i] op b.e_[i]);               \
    return r;                                                                               \
  }                                                                                         \
  constexpr vec& operator op##=(const vec& b) {                                             \
    for (int i = 0; i < N; ++i) e_[i] = static_cast<T>(e_[i] op b.e_[i]);                   \
    return *this;                                                                           \
  }
  TLM_VEC_ARITH(+)
  TLM_VEC_ARITH(-)
  TLM_VEC_ARITH(*)
  TLM_VEC_ARITH(/)
  TLM_VEC_ARITH(%)
  TLM_VEC_ARITH(&)
  TLM_VEC_ARITH(|)
  TLM_VEC_ARITH(^)
  TLM_VEC_ARITH(<<)
  TLM_VEC_ARITH(>>)
#undef TLM_VEC_ARITH

#define TLM_VEC_CMP(op)                                                                     \
  friend constexpr vec<bool, N> operator op(const vec& a, const vec& b) {                   \
    vec<bool, N> r;                                                                         \
    for (int i = 0; i < N; ++i) r.e_[i] = a.e_[i] op b.e_[i];                               \
    return r;                                                                               \
  }
  TLM_VEC_CMP(==)
  TLM_VEC_CMP(!=)
  TLM_VEC_CMP(<)
  TLM_VEC_CMP(>)
  TLM_VEC_CMP(<=)
  TLM_VEC_CMP(>=)
  TLM_VEC_CMP(&&)
  TLM_VEC_CMP(||)
#undef TLM_VEC_CMP

  constexpr vec operator-() const {
    vec r;
    for (int i = 0; i < N; ++i) r.e_[i] = static_cast<T>(-e_[i]);
    return r;
  }
  constexpr vec operator+() const { return *this; }
  constexpr vec operator~() const {
    vec r;
    for (int i = 0; i < N; ++i) r.e_[i] = static_cast<T>(~e_[i]);
    return r;
  }
  constexpr vec<bool, N> operator!() const {
    vec<bool, N> r;
    for (int i = 0; i < N; ++i) r.e_[i] = !e_[i];
    return r;
  }

 private:
  template <class A>
  constexpr void put(int& i, const A& a) {
    if constexpr (is_vec_v<A>) {
      for (int j = 0; j < A::size; ++j) e_[i++] = static_cast<T>(a.e_[j]);
    } else {
      e_[i++] = static_cast<T>(a);
    }
  }
};

template <class T> inline constexpr bool is_trivial_vec_v =
    std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T>;

// MSL's packed_T2 / T3 / T4: the lanes of a vector with only the element's alignment. Converts to
// and from the vector of the same type (what MSL allows: `half4 v = p;`, `p = v;`); a checked
// pointer cast to one skips the vector-alignment check and counts one access of all its lanes.
template <class T, int N>
struct packed_vec : vec<T, N> {
  packed_vec() = default;
  constexpr packed_vec(const vec<T, N>& v) : vec<T, N>(v) {}
};
template <class V> inline constexpr bool is_packed_vec_v = false;
template <class T, int N> inline constexpr bool is_packed_vec_v<packed_vec<T, N>> = true;

}  // namespace tlm

#define TLM_VEC_TYPES(T)                        \
  typedef tlm::vec<T, 2> T##2;                  \
  typedef tlm::vec<T, 3> T##3;                  \
  typedef tlm::vec<T, 4> T##4;                  \
  typedef tlm::packed_vec<T, 2> packed_##T##2;  \
  typedef tlm::packed_vec<T, 3> packed_##T##3;  \
  typedef tlm::packed_vec<T, 4> packed_##T##4;
TLM_VEC_TYPES(bool)
TLM_VEC_TYPES(char)
TLM_VEC_TYPES(uchar)
TLM_VEC_TYPES(short)
TLM_VEC_TYPES(ushort)
TLM_VEC_TYPES(int)
TLM_VEC_TYPES(uint)
TLM_VEC_TYPES(long)
TLM_VEC_TYPES(ulong)
TLM_VEC_TYPES(half)
TLM_VEC_TYPES(bfloat)
TLM_VEC_TYPES(float)
#undef TLM_VEC_TYPES

static_assert(sizeof(half4) == 8 && sizeof(float4) == 16 && sizeof(bfloat2) == 4);
static_assert(tlm::is_trivial_vec_v<half4> && tlm::is_trivial_vec_v<bfloat4>);
static_assert(sizeof(packed_half4) == 8 && alignof(packed_half4) == alignof(half) && tlm::is_trivial_vec_v<packed_float4>);

namespace metal {
#define TLM_VEC_USING(T) \
  using ::T##2; using ::T##3; using ::T##4; using ::packed_##T##2; using ::packed_##T##3; using ::packed_##T##4;
TLM_VEC_USING(bool)
TLM_VEC_USING(char)
TLM_VEC_USING(uchar)
TLM_VEC_USING(short)
TLM_VEC_USING(ushort)
TLM_VEC_USING(int)
TLM_VEC_USING(uint)
TLM_VEC_USING(long)
TLM_VEC_USING(ulong)
TLM_VEC_USING(half)
TLM_VEC_USING(bfloat)
TLM_VEC_USING(float)
#undef TLM_VEC_USING
template <class T, int N> using vec = tlm::vec<T, N>;
}  // namespace metal
