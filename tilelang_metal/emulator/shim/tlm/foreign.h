// Support for MSL the plugin did not write (tilelang_metal/emulator/foreign.py, compile_msl): the
// names the translated source and the generated driver use. Nothing here changes plugin kernels.
#pragma once

#include "runtime_api.h"
#include "scalar.h"
#include "vector.h"

namespace tlm::foreign {

// A member function qualified with a non-thread address space (`T f() threadgroup`) is translated
// to `T f() requires(other_address_space)`: C++ has no such overloads, and every object here is a
// thread object, so only the `thread` (unqualified) overload takes part in overload resolution.
// One variable per address space: identical constraints would make the overloads redeclarations.
template <int Space> inline constexpr bool other_address_space = false;
// The same for members the translation made templates (`template <int TlmSpace = 0>`).
template <int TlmSpace, int Space> inline constexpr bool other_address_space_of = false;

// `constant T name [[function_constant(Index)]];` given no value: declaring it is fine (Metal needs
// values only for the constants a specialised kernel uses; compile_msl refuses a kernel whose body
// names one), and reading it (from a helper) stops the launch with an error naming it.
template <class T>
struct missing_function_constant {
  const char* name;
  int index;
  operator T() const {
    char msg[200];
    __builtin_snprintf(msg, sizeof msg, "function constant '%s' (index %d) has no value: pass function_constants={%d: ...} to compile_msl",
                       name, index, index);
    tlm::rt::fatal(msg);
  }
};

// Every foreign threadgroup variable gets its own runtime slot when a threadgroup first reaches it.
// Slot numbers are process-wide per instantiation (a function-local static), so every worker
// lays out the same variables; the runtime shares a slot's storage between the threads of a
// threadgroup and counts it against Metal's threadgroup memory limit.
inline uint32_t fresh_slot() {
  static uint32_t next = 0;
  return __atomic_fetch_add(&next, 1u, __ATOMIC_RELAXED);
}

// `threadgroup T NAME[N][M];` becomes `auto& NAME = threadgroup_variable<T[N][M]>([] {});`. The
// closure type `Tag` differs per declaration and per template instantiation of the enclosing function.
template <class A, class Tag>
inline A& threadgroup_variable(Tag) {
  static const uint32_t slot = fresh_slot();
  return *static_cast<A*>(rt::threadgroup_slot(slot, sizeof(A)));
}

// The type of parameter I of the kernel (a function pointer type F).
template <int I, class... A> struct nth;
template <class A0, class... A> struct nth<0, A0, A...> { using type = A0; };
template <int I, class A0, class... A> struct nth<I, A0, A...> { using type = typename nth<I - 1, A...>::type; };
template <int I, class F> struct param;
template <int I, class R, class... A> struct param<I, R (*)(A...)> {
  using type = typename nth<I, A...>::type;
};
template <int I, class F> using param_t = typename param<I, F>::type;

// A [[buffer(i)]] binding: the buffer's address as a pointer, or the value behind it by reference.
template <class P>
TLM_INLINE P bind(void* p) {
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(p);
  } else {
    static_assert(std::is_reference_v<P>, "a [[buffer(n)]] parameter is a pointer or a reference");
    return *static_cast<std::remove_reference_t<P>*>(p);
  }
}

// A position attribute converted to the declared type (a scalar declaration takes x, as in MSL).
template <class P>
TLM_INLINE std::remove_cvref_t<P> position(uint32_t x, uint32_t y, uint32_t z) {
  using V = std::remove_cvref_t<P>;
  if constexpr (is_vec_v<V>) {
    using E = typename V::element_type;
    if constexpr (V::size == 2) return V(static_cast<E>(x), static_cast<E>(y));
    else return V(static_cast<E>(x), static_cast<E>(y), static_cast<E>(z));
  } else {
    return static_cast<V>(x);
  }
}

// Element type codes shared with foreign.py (_SCALAR_CODES).
template <class T> constexpr int64_t scalar_code() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return 1;
  else if constexpr (std::is_same_v<U, int8_t> || std::is_same_v<U, char>) return 2;
  else if constexpr (std::is_same_v<U, uint8_t>) return 3;
  else if constexpr (std::is_same_v<U, int16_t>) return 4;
  else if constexpr (std::is_same_v<U, uint16_t>) return 5;
  else if constexpr (std::is_same_v<U, int32_t>) return 6;
  else if constexpr (std::is_same_v<U, uint32_t>) return 7;
  else if constexpr (std::is_same_v<U, int64_t> || std::is_same_v<U, long long>) return 8;
  else if constexpr (std::is_same_v<U, uint64_t> || std::is_same_v<U, unsigned long long>) return 9;
  else if constexpr (std::is_same_v<U, half>) return 10;
  else if constexpr (std::is_same_v<U, bfloat>) return 11;
  else if constexpr (std::is_same_v<U, float>) return 12;
  else return 0;  // a struct
}

// out = {0 pointer / 1 reference, bytes of the pointee, element code, lanes, const pointee}.
template <class P>
inline void describe(int64_t* out) {
  using Q = std::conditional_t<std::is_pointer_v<P>, std::remove_pointer_t<P>, std::remove_reference_t<P>>;
  using E = std::remove_cv_t<Q>;
  out[0] = std::is_pointer_v<P> ? 0 : 1;
  out[1] = static_cast<int64_t>(sizeof(E));
  if constexpr (is_vec_v<E>) {
    out[2] = scalar_code<typename E::element_type>();
    out[3] = E::size;
  } else {
    out[2] = scalar_code<E>();
    out[3] = 1;
  }
  out[4] = std::is_const_v<Q> ? 1 : 0;
}

// Guarded device buffers of the next launch (tlm_set_guards).
struct guard_table {
  const rt::guard_region* regions = nullptr;
  uint32_t count = 0;
};
inline guard_table guards;

}  // namespace tlm::foreign
