// Bounds-checked pointer that replaces device-buffer parameters and threadgroup arrays in checked
// builds. It supports exactly the access forms the printer emits: NAME[i], NAME + off (another
// checked pointer) and an explicit cast of such a pointer to a raw (vector) pointer, which checks
// that the whole vector lies inside the buffer and is aligned as MSL requires.
#pragma once

#include "atomic.h"  // tlm::is_atomic_object_v
#include "runtime_api.h"
#include "scalar.h"
#include "vector.h"  // tlm::is_packed_vec_v

namespace tlm {

template <class T>
struct checked_ptr {
  T* base;            // start of the buffer
  int64_t extent;     // elements in the buffer
  int64_t offset;     // elements from base this pointer designates
  const char* name;   // parameter / array name, for messages
  const char* space;  // "device buffer" or "threadgroup array"
  int64_t align0;     // element offset of `base` from an aligned origin (a view inside a threadgroup pool)

#ifdef TLM_INSTRUMENTED
  rt::space_kind kind = rt::space_kind::device_memory;
  uint8_t flags = 0;      // rt::access_flags of accesses through this pointer (set by the rewrite)
  int32_t buf = -1;       // device buffer index
  uint8_t* init = nullptr;  // thread arrays (racecheck): written flags, parallel to base
  uint16_t view = 0;        // pool views: 1 + the view's index (threadgroup_view), else 0
#endif

  checked_ptr(T* b, int64_t n, const char* nm, const char* sp, int64_t a0 = 0)
      : base(b), extent(n), offset(0), name(nm), space(sp), align0(a0) {}

  // Instrumented builds: the rewrite marks stores (`C.w()[i] = ...`) and accesses under a `?:`
  // (`c ? A.p()[i] : 0`). Plain builds never see these calls.
  TLM_INLINE checked_ptr w() const { return with_flags(1); }
  TLM_INLINE checked_ptr p() const { return with_flags(2); }
  TLM_INLINE checked_ptr wp() const { return with_flags(3); }
  TLM_INLINE checked_ptr s() const { return with_flags(8); }  // operand of a shuffle (access_marks.py)
  TLM_ACCESS checked_ptr with_flags([[maybe_unused]] uint8_t f) const {
    checked_ptr r = *this;
#ifdef TLM_INSTRUMENTED
    r.flags |= f;
#endif
    return r;
  }

  // `site`: the code address the access was made from (the caller of an out-of-line accessor), which
  // the counters use as the program point when they group the lanes of a simdgroup.
  TLM_INLINE void note([[maybe_unused]] int64_t j, [[maybe_unused]] int64_t lanes,
                       [[maybe_unused]] const void* site, [[maybe_unused]] bool atomic_object = false) const {
#ifdef TLM_INSTRUMENTED
    const rt::access a{base + j, name, j, init ? init + j : nullptr, buf, static_cast<uint16_t>(lanes),
                       static_cast<uint16_t>(sizeof(T) > 0xffff ? 0xffff : sizeof(T)), kind, flags, view, site};
#ifdef TLM_RACECHECK
    // An atomic object: the atomic function that receives the pointer reports the access(es).
    if (atomic_object) return rt::atomic_target(a);
#endif
    rt::on_access(a);
#endif
  }

  TLM_ACCESS T& operator[](int64_t i) const {
    int64_t j = offset + i;
    if (__builtin_expect(static_cast<uint64_t>(j) >= static_cast<uint64_t>(extent), 0))
      return *static_cast<T*>(rt::out_of_bounds(space, name, j, 1, extent));
    note(j, 1, TLM_SITE());
    return base[j];
  }
  TLM_INLINE T& operator*() const { return (*this)[0]; }

  // `lanes` consecutive elements from element i, accessed as one (a simdgroup matrix lane's pair of
  // adjacent elements): bounds-checked as a whole, counted once, no vector alignment required.
  TLM_ACCESS T* span(int64_t i, int64_t lanes) const {
    int64_t j = offset + i;
    if (__builtin_expect(j < 0 || j + lanes > extent, 0))
      return static_cast<T*>(rt::out_of_bounds(space, name, j, lanes, extent));
    note(j, lanes, TLM_SITE());
    return base + j;
  }

  TLM_INLINE checked_ptr operator+(int64_t d) const { checked_ptr r = *this; r.offset += d; return r; }
  TLM_INLINE checked_ptr operator-(int64_t d) const { checked_ptr r = *this; r.offset -= d; return r; }
  friend TLM_INLINE checked_ptr operator+(int64_t d, const checked_ptr& p) { return p + d; }
  TLM_INLINE checked_ptr& operator+=(int64_t d) { offset += d; return *this; }
  TLM_INLINE checked_ptr& operator-=(int64_t d) { offset -= d; return *this; }

  // `(device half4*)(NAME + off)` / `(device packed_half4*)(NAME + off)`: the vector must lie
  // inside the buffer.
  template <class V>
  TLM_ACCESS explicit operator V*() const {
    using E = std::remove_cv_t<T>;
    static_assert(sizeof(V) % sizeof(E) == 0, "vector cast of a checked pointer: size is not a multiple of the element");
    constexpr int64_t lanes = static_cast<int64_t>(sizeof(V) / sizeof(E));
    if (__builtin_expect(offset < 0 || offset + lanes > extent, 0))
      return static_cast<V*>(rt::out_of_bounds(space, name, offset, lanes, extent));
    if constexpr (is_vec_v<V> && lanes > 1 && (lanes & (lanes - 1)) == 0) {
      // MSL aligns an N-lane vector to N elements (buffers themselves are aligned); packed_T4 (not a
      // vec) only to its element.
      if (__builtin_expect(((align0 + offset) & (lanes - 1)) != 0, 0)) rt::misaligned(space, name, offset, lanes);
    } else if constexpr (!is_vec_v<V> && !is_packed_vec_v<std::remove_cv_t<V>> && alignof(V) > sizeof(E)) {
      // any other type (a struct of elements, a scalar wider than the element) to its own alignment
      constexpr int64_t align = static_cast<int64_t>(alignof(V) / sizeof(E));
      if (__builtin_expect(((align0 + offset) % align) != 0, 0)) rt::misaligned(space, name, offset, align);
    }
    note(offset, lanes, TLM_SITE(), is_atomic_object_v<std::remove_cv_t<V>>);
    return reinterpret_cast<V*>(const_cast<E*>(base + offset));
  }
};

// Unchecked twin used when kernels are built with checked=False.
template <class T> using raw_ptr = T*;

// Storage for the slot-th `threadgroup T NAME[COUNT];` declaration of the kernel.
template <class T>
TLM_INLINE checked_ptr<T> threadgroup_array(uint32_t slot, int64_t count, const char* name) {
  checked_ptr<T> r(static_cast<T*>(rt::threadgroup_slot(slot, sizeof(T) * static_cast<uint64_t>(count))), count, name,
                   "threadgroup array");
#ifdef TLM_INSTRUMENTED
  r.kind = rt::space_kind::threadgroup_memory;
#endif
  return r;
}
template <class T>
TLM_INLINE T* threadgroup_array_raw(uint32_t slot, int64_t count) {
  return static_cast<T*>(rt::threadgroup_slot(slot, sizeof(T) * static_cast<uint64_t>(count)));
}

// `threadgroup T* NAME = (threadgroup T*)(POOL + byte_off);`: a typed view into a merged threadgroup
// pool (`shared.dyn`). The view covers [byte_off, byte_end) of the pool, byte_end being the next view's
// offset (computed by the rewrite) or, when negative, the end of the pool. It is checked against its
// own extent, so an access that would land in a neighbouring view is reported. `view_id` (1 + the
// view's index in the kernel) lets racecheck tell the buffers the planner placed on the same bytes
// apart: a read through one view of bytes last written through another is a read before write.
template <class T, class P>
inline checked_ptr<T> threadgroup_view(const checked_ptr<P>& pool, int64_t byte_off, int64_t byte_end,
                                       const char* name, [[maybe_unused]] uint16_t view_id = 0) {
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
  checked_ptr<T> r(reinterpret_cast<T*>(bytes), n, name, "threadgroup array", byte_off / static_cast<int64_t>(sizeof(T)));
#ifdef TLM_INSTRUMENTED
  r.kind = rt::space_kind::threadgroup_memory;
  r.view = view_id;
#endif
  return r;
}

template <class T>
TLM_INLINE checked_ptr<T> device_buffer(void* p, int64_t count, const char* name, [[maybe_unused]] int32_t index = -1) {
  checked_ptr<T> r(static_cast<T*>(p), count, name, "device buffer");
#ifdef TLM_INSTRUMENTED
  r.buf = index;
#endif
  return r;
}

// Checked builds: a thread-private array `T NAME[N];` whose indices are checked, so an index out of
// range (a runtime value) is reported instead of writing over the thread's stack (which could crash
// the process). Vector casts go through a checked pointer; accesses are not traffic (counters skip them).
template <class T, int64_t N>
struct bounded_local {
  T data[N];
  const char* name;
  explicit bounded_local(const char* nm) : name(nm) {}
  TLM_INLINE T& operator[](int64_t i) {
    if (__builtin_expect(static_cast<uint64_t>(i) >= static_cast<uint64_t>(N), 0))
      return *static_cast<T*>(rt::out_of_bounds("thread array", name, i, 1, N));
    return data[i];
  }
  TLM_INLINE checked_ptr<T> operator+(int64_t d) {
    checked_ptr<T> r(data, N, name, "thread array");
#ifdef TLM_INSTRUMENTED
    r.kind = rt::space_kind::thread_memory;
#endif
    return r + d;
  }
};

#ifdef TLM_INSTRUMENTED
// Racecheck builds: a thread-private array `T NAME[N];` with a "written" flag per element, so reads
// of never-written elements are reported. Accessed like a checked pointer.
template <class T, int64_t N>
struct local_array {
  T data[N];
  uint8_t written[N];
  const char* name;
  explicit local_array(const char* nm) : name(nm) { __builtin_memset(written, 0, sizeof written); }
  TLM_ACCESS checked_ptr<T> ptr() {
    checked_ptr<T> r(data, N, name, "thread array");
    r.kind = rt::space_kind::thread_memory;
    r.init = written;
    return r;
  }
  TLM_ACCESS T& operator[](int64_t i) { return ptr()[i]; }
  TLM_INLINE checked_ptr<T> operator+(int64_t d) { return ptr() + d; }
  TLM_INLINE checked_ptr<T> w() { return ptr().w(); }
  TLM_INLINE checked_ptr<T> p() { return ptr().p(); }
  TLM_INLINE checked_ptr<T> wp() { return ptr().wp(); }
  TLM_INLINE checked_ptr<T> s() { return ptr().s(); }
};

// `if (...) {` blocks of the kernel (counters: accesses inside are predicated).
struct predicated_scope {
  predicated_scope() { rt::predicate_enter(); }
  ~predicated_scope() { rt::predicate_exit(); }
};
#endif

}  // namespace tlm
