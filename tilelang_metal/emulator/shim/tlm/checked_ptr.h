// Bounds-checked pointer that replaces device-buffer parameters and threadgroup arrays in checked
// builds. It supports exactly the access forms the printer emits: NAME[i], NAME + off (another
// checked pointer) and an explicit cast of such a pointer to a raw (vector) pointer, which checks
// that the whole vector lies inside the buffer and is aligned as MSL requires.
#pragma once

#include "runtime_api.h"
#include "scalar.h"

namespace tlm {

template <class T>
struct checked_ptr {
  T* base;            // start of the buffer
  int64_t extent;     // elements in the buffer
  int64_t offset;     // elements from base this pointer designates
  const char* name;   // parameter / array name, for messages
  const char* space;  // "device buffer" or "threadgroup array"
  int64_t align0;     // element offset of `base` from an aligned origin (a view inside a threadgroup pool)

  checked_ptr(T* b, int64_t n, const char* nm, const char* sp, int64_t a0 = 0)
      : base(b), extent(n), offset(0), name(nm), space(sp), align0(a0) {}

  TLM_INLINE T& operator[](int64_t i) const {
    int64_t j = offset + i;
    if (__builtin_expect(static_cast<uint64_t>(j) >= static_cast<uint64_t>(extent), 0))
      return *static_cast<T*>(rt::out_of_bounds(space, name, j, 1, extent));
    return base[j];
  }
  TLM_INLINE T& operator*() const { return (*this)[0]; }

  TLM_INLINE checked_ptr operator+(int64_t d) const { checked_ptr r = *this; r.offset += d; return r; }
  TLM_INLINE checked_ptr operator-(int64_t d) const { checked_ptr r = *this; r.offset -= d; return r; }
  friend TLM_INLINE checked_ptr operator+(int64_t d, const checked_ptr& p) { return p + d; }
  TLM_INLINE checked_ptr& operator+=(int64_t d) { offset += d; return *this; }
  TLM_INLINE checked_ptr& operator-=(int64_t d) { offset -= d; return *this; }

  // `(device half4*)(NAME + off)`: the vector must lie inside the buffer.
  template <class V>
  TLM_INLINE explicit operator V*() const {
    using E = std::remove_cv_t<T>;
    static_assert(sizeof(V) % sizeof(E) == 0, "vector cast of a checked pointer: size is not a multiple of the element");
    constexpr int64_t lanes = static_cast<int64_t>(sizeof(V) / sizeof(E));
    if (__builtin_expect(offset < 0 || offset + lanes > extent, 0))
      return static_cast<V*>(rt::out_of_bounds(space, name, offset, lanes, extent));
    if constexpr (lanes > 1 && (lanes & (lanes - 1)) == 0) {
      // MSL aligns an N-lane vector to N elements (buffers themselves are aligned).
      if (__builtin_expect(((align0 + offset) & (lanes - 1)) != 0, 0)) rt::misaligned(space, name, offset, lanes);
    }
    return reinterpret_cast<V*>(const_cast<E*>(base + offset));
  }
};

// Unchecked twin used when kernels are built with checked=False.
template <class T> using raw_ptr = T*;

// Storage for the slot-th `threadgroup T NAME[COUNT];` declaration of the kernel.
template <class T>
TLM_INLINE checked_ptr<T> threadgroup_array(uint32_t slot, int64_t count, const char* name) {
  return checked_ptr<T>(static_cast<T*>(rt::threadgroup_slot(slot, sizeof(T) * static_cast<uint64_t>(count))),
                        count, name, "threadgroup array");
}
template <class T>
TLM_INLINE T* threadgroup_array_raw(uint32_t slot, int64_t count) {
  return static_cast<T*>(rt::threadgroup_slot(slot, sizeof(T) * static_cast<uint64_t>(count)));
}

// `threadgroup T* NAME = (threadgroup T*)(POOL + byte_off);`: a typed view into a merged threadgroup
// pool (`shared.dyn`). The view covers [byte_off, byte_end) of the pool, byte_end being the next view's
// offset (computed by the rewrite) or, when negative, the end of the pool. It is checked against its
// own extent, so an access that would land in a neighbouring view is reported.
template <class T, class P>
inline checked_ptr<T> threadgroup_view(const checked_ptr<P>& pool, int64_t byte_off, int64_t byte_end,
                                       const char* name) {
  const int64_t pool_bytes = pool.extent * static_cast<int64_t>(sizeof(P));
  if (byte_end < 0 || byte_end > pool_bytes) byte_end = pool_bytes;
  const bool outside = byte_off < 0 || byte_off > pool_bytes;
  if (outside || byte_off % static_cast<int64_t>(sizeof(T)) != 0) {
    char msg[240];
    __builtin_snprintf(msg, sizeof msg, "threadgroup view '%s' starts at byte %lld of pool '%s' (%lld bytes): %s %d",
                       name, static_cast<long long>(byte_off), pool.name, static_cast<long long>(pool_bytes),
                       outside ? "outside the pool; element size" : "not a multiple of its element size",
                       static_cast<int>(sizeof(T)));
    rt::fatal(msg);
  }
  const int64_t n = byte_end > byte_off ? (byte_end - byte_off) / static_cast<int64_t>(sizeof(T)) : 0;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(pool.base) + byte_off;
  return checked_ptr<T>(reinterpret_cast<T*>(bytes), n, name, "threadgroup array",
                        byte_off / static_cast<int64_t>(sizeof(T)));
}

template <class T>
TLM_INLINE checked_ptr<T> device_buffer(void* p, int64_t count, const char* name) {
  return checked_ptr<T>(static_cast<T*>(p), count, name, "device buffer");
}

}  // namespace tlm
