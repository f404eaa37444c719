// MSL atomics (<metal_atomic>): atomic_int / atomic_uint / atomic_float and the *_explicit functions
// the printer emits (docs/msl_contract.md, "Atomics"). Threadgroups run in parallel on worker
// threads, so every read-modify-write is a real atomic on the element's own storage (GCC's __atomic
// builtins, relaxed order: <atomic> cannot be included after config.h's address-space macros).
// An `atomic_T` is layout-compatible with `T`, and the kernel reaches it by casting a buffer pointer
// (`(device atomic_int*)(H + i)`), which checked builds bounds-check like any vector cast.
#pragma once

#include "config.h"
#include "scalar.h"
// Hook for the emulator's access checking: every atomic access passes through here with its address,
// size and kind (tlm::rt::atomic_kind: load, store or read-modify-write), so the race detector can
// tell atomics (never a race with each other) from plain accesses. Racecheck builds route it to the
// runtime; otherwise it is empty unless defined before this header.
#ifndef TLM_ATOMIC_ACCESS
#ifdef TLM_RACECHECK
#include "runtime_api.h"
#define TLM_ATOMIC_ACCESS(address, bytes, kind) ::tlm::rt::on_atomic_access((address), (bytes), (kind))
#else
#define TLM_ATOMIC_ACCESS(address, bytes, kind) ((void)0)
#endif
#endif
// Second hook: each value an atomic access observes or leaves in memory (racecheck bounds the
// rounding of float atomic sums with their magnitudes; runtime_api.h, on_atomic_value).
#ifndef TLM_ATOMIC_VALUE
#ifdef TLM_RACECHECK
#define TLM_ATOMIC_VALUE(address, value_ptr) ::tlm::rt::on_atomic_value((address), sizeof(*(value_ptr)), (value_ptr))
#else
#define TLM_ATOMIC_VALUE(address, value_ptr) ((void)0)
#endif
#endif

namespace metal {

// MSL accepts memory_order_relaxed for these functions; the printer emits nothing else.
enum memory_order { memory_order_relaxed = 0 };

template <class T>
struct tlm_atomic {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == 4, "MSL atomics here are 32-bit");
  T value;
};
using atomic_int = tlm_atomic<int32_t>;
using atomic_uint = tlm_atomic<uint32_t>;
using atomic_float = tlm_atomic<float>;

}  // namespace metal

namespace tlm {
// True for the atomic object types: the kernel reaches them through `checked_ptr`'s explicit cast
// (`(device atomic_int*)(H + i)`), so an access checker hooked into that cast can tell an atomic
// access (never a race) from a plain vector access with `tlm::is_atomic_object_v<V>`.
template <class V> inline constexpr bool is_atomic_object_v = false;
template <class T> inline constexpr bool is_atomic_object_v<metal::tlm_atomic<T>> = true;
template <class T> inline constexpr bool is_atomic_object_v<const metal::tlm_atomic<T>> = true;
}  // namespace tlm

namespace metal {

namespace tlm_detail {
// Kinds passed to TLM_ATOMIC_ACCESS (same values as tlm::rt::atomic_kind).
enum access_kind : unsigned { atomic_load_access = 0, atomic_store_access = 1, atomic_rmw_access = 2 };

template <class T>
TLM_INLINE T* cell(tlm_atomic<T>* object, access_kind kind = atomic_rmw_access) {
  TLM_ATOMIC_ACCESS(static_cast<void*>(object), sizeof(T), kind);
  return &object->value;
}

// One relaxed compare-and-swap loop for every read-modify-write: new = update(old).
template <class T, class Update>
TLM_INLINE T fetch_update(tlm_atomic<T>* object, Update update) {
  T* p = cell(object);
  T seen;
  __atomic_load(p, &seen, __ATOMIC_RELAXED);
  for (;;) {
    T next = update(seen);
    // the result stands even when it equals the old value (a float add that rounds back to it)
    if (__builtin_memcmp(&next, &seen, sizeof(T)) == 0 ||
        __atomic_compare_exchange(p, &seen, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      TLM_ATOMIC_VALUE(object, &next);
      return seen;
    }
  }
}
}  // namespace tlm_detail

// MSL declares the load on `const` objects too (an atomic load from a read-only buffer).
template <class T>
TLM_INLINE T atomic_load_explicit(const tlm_atomic<T>* object, memory_order) {
  T out;
  __atomic_load(tlm_detail::cell(const_cast<tlm_atomic<T>*>(object), tlm_detail::atomic_load_access), &out,
                __ATOMIC_RELAXED);
  TLM_ATOMIC_VALUE(object, &out);
  return out;
}

template <class T, class U>
TLM_INLINE void atomic_store_explicit(tlm_atomic<T>* object, U desired, memory_order) {
  T v = static_cast<T>(desired);
  __atomic_store(tlm_detail::cell(object, tlm_detail::atomic_store_access), &v, __ATOMIC_RELAXED);
  TLM_ATOMIC_VALUE(object, &v);
}

template <class T, class U>
TLM_INLINE T atomic_exchange_explicit(tlm_atomic<T>* object, U desired, memory_order) {
  T v = static_cast<T>(desired), out;
  __atomic_exchange(tlm_detail::cell(object), &v, &out, __ATOMIC_RELAXED);
  TLM_ATOMIC_VALUE(object, &v);
  return out;
}

// MSL's weak compare-exchange: on failure `*expected` receives the current value.
template <class T, class U>
TLM_INLINE bool atomic_compare_exchange_weak_explicit(tlm_atomic<T>* object, T* expected, U desired, memory_order,
                                                      memory_order) {
  T v = static_cast<T>(desired);
  const bool swapped =
      __atomic_compare_exchange(tlm_detail::cell(object), expected, &v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  TLM_ATOMIC_VALUE(object, swapped ? &v : expected);  // what the memory holds now
  return swapped;
}

template <class T, class U>
TLM_INLINE T atomic_fetch_add_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  const T v = static_cast<T>(operand);
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(tlm_detail::cell(object), v, __ATOMIC_RELAXED);
  } else {  // atomic_float: no float fetch_add builtin
    return tlm_detail::fetch_update(object, [v](T old) { return static_cast<T>(old + v); });
  }
}

template <class T, class U>
TLM_INLINE T atomic_fetch_sub_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  const T v = static_cast<T>(operand);
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_sub(tlm_detail::cell(object), v, __ATOMIC_RELAXED);
  } else {
    return tlm_detail::fetch_update(object, [v](T old) { return static_cast<T>(old - v); });
  }
}

// MSL has atomic_fetch_max/min/and/or for atomic_int and atomic_uint only.
template <class T, class U>
TLM_INLINE T atomic_fetch_max_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  static_assert(std::is_integral_v<T>, "atomic_fetch_max_explicit takes atomic_int or atomic_uint");
  const T v = static_cast<T>(operand);
  return tlm_detail::fetch_update(object, [v](T old) { return old < v ? v : old; });
}

template <class T, class U>
TLM_INLINE T atomic_fetch_min_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  static_assert(std::is_integral_v<T>, "atomic_fetch_min_explicit takes atomic_int or atomic_uint");
  const T v = static_cast<T>(operand);
  return tlm_detail::fetch_update(object, [v](T old) { return v < old ? v : old; });
}

template <class T, class U>
TLM_INLINE T atomic_fetch_and_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  static_assert(std::is_integral_v<T>, "atomic_fetch_and_explicit takes atomic_int or atomic_uint");
  return __atomic_fetch_and(tlm_detail::cell(object), static_cast<T>(operand), __ATOMIC_RELAXED);
}

template <class T, class U>
TLM_INLINE T atomic_fetch_or_explicit(tlm_atomic<T>* object, U operand, memory_order) {
  static_assert(std::is_integral_v<T>, "atomic_fetch_or_explicit takes atomic_int or atomic_uint");
  return __atomic_fetch_or(tlm_detail::cell(object), static_cast<T>(operand), __ATOMIC_RELAXED);
}

}  // namespace metal
