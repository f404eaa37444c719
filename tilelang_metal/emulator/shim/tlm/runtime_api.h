// Interface between the shim (compiled into each kernel) and the CPU runtime
// (tilelang_metal/emulator/runtime). Both sides include this header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tlm::rt {

// Everything a fiber knows about the GPU thread it currently plays.
struct lane_info {
  uint32_t tid[3];       // thread_position_in_threadgroup
  uint32_t tg[3];        // threadgroup_position_in_grid
  uint32_t grid[3];      // threadgroups_per_grid
  uint32_t block[3];     // threads_per_threadgroup
  uint32_t linear;       // thread_index_in_threadgroup
  uint32_t simd_group;   // simdgroup_index_in_threadgroup
  uint32_t lane;         // thread_index_in_simdgroup
  uint32_t simd_size;    // lanes in this simdgroup (32, or fewer for a trailing partial one)
  uint32_t simd_groups;  // simdgroups_per_threadgroup
};

// A device buffer of a foreign kernel (compile_msl) placed against PROT_NONE pages: a fault in
// [lo, hi) is an access outside the buffer's `bytes` bytes starting at `data`.
struct guard_region {
  const char* lo;
  const char* hi;
  const char* data;
  uint64_t bytes;
  const char* name;
  int32_t buffer;
  int32_t traced;  // a `device` binding: traced accesses inside [data, data + bytes) count (foreign counters)
};

// Runs one GPU thread: generated per kernel by the Python driver generator.
using entry_fn = void (*)(const lane_info& self, void* const* buffers, const int64_t* counts);

struct launch_params {
  entry_fn entry;
  void* const* buffers;
  const int64_t* counts;
  uint32_t grid[3];
  uint32_t block[3];
  int32_t workers;           // OS threads running threadgroups in parallel (>= 1)
  uint64_t stack_bytes;      // per-fiber stack, excluding the guard page
  uint64_t threadgroup_limit;  // bytes of threadgroup memory a threadgroup may declare
  char* error;               // receives the first error message (NUL terminated)
  uint64_t error_len;
  bool prints;               // the kernel calls T.print: keep its output in threadgroup order
  const guard_region* guards = nullptr;  // foreign kernels: faults here are out-of-bounds accesses
  uint32_t nguards = 0;
};

// Returns 0 on success, 1 when an error was recorded into params.error.
int launch(const launch_params& params) noexcept;

// The calling GPU thread.
const lane_info& self() noexcept;

// Counted, generation-based barrier over all threads of the threadgroup.
void threadgroup_barrier() noexcept;

// Simdgroup rendezvous in two steps. simd_deposit returns the scratch buffer of the current round
// (simd_scratch_bytes large, shared by the lanes of the calling simdgroup); the lane writes its
// contribution there, then simd_arrive blocks until every lane of the simdgroup arrived and returns
// the same buffer, now holding everyone's contributions. Rounds alternate between two buffers, so a
// buffer is reused only after every lane has passed the following rendezvous.
constexpr size_t simd_scratch_bytes = 4096;
void* simd_deposit(const char* op) noexcept;
const void* simd_arrive() noexcept;

// T.print (shim/tlm/debug.h): one value of the calling thread, formatted like TileLang's CUDA
// debug print and written to stdout as one whole line. `buffer` is null for a scalar print;
// print_message prints `msg` and the thread's position only. Lines of one threadgroup keep their
// order, and threadgroups' lines follow the order threadgroups are claimed (linear order; the seeded
// order under racecheck): the lowest unfinished one prints at once, the others when it is their turn.
enum print_kind : uint8_t { print_message, print_signed, print_unsigned, print_floating, print_boolean };
struct print_value {
  print_kind kind;
  const char* dtype;  // the MSL type name
  int64_t i;          // print_signed
  uint64_t u;         // print_unsigned, print_boolean (0 / 1)
  double f;           // print_floating
};
void debug_print(const char* msg, const char* buffer, int64_t index, const print_value& value) noexcept;

// Records an error for the current threadgroup and abandons it (never returns).
[[noreturn]] void fatal(const char* message) noexcept;

// Records an out-of-bounds access (first error wins) and returns scratch memory to redirect it to.
// `lanes` > 1 for a vector access starting at `index`.
void* out_of_bounds(const char* space, const char* name, int64_t index, int64_t lanes,
                    int64_t extent) noexcept;
void misaligned(const char* space, const char* name, int64_t index, int64_t lanes) noexcept;

// Storage of the `slot`-th threadgroup array of the kernel for the current threadgroup.
void* threadgroup_slot(uint32_t slot, uint64_t bytes) noexcept;

// ---------------------------------------------------------------- instrumented builds
// Kernels built with TLM_COUNTERS or TLM_RACECHECK (TLM_INSTRUMENTED) report every access of a
// device buffer, threadgroup array and (racecheck) thread array; plain builds never call these.

enum class space_kind : uint8_t { device_memory = 0, threadgroup_memory = 1, thread_memory = 2 };  // (device, threadgroup, thread are macros)
// access_shuffled: a lane's operand of simd_shuffle* / simd_broadcast (other lanes may not take it).
enum access_flags : uint8_t { access_store = 1, access_predicated = 2, access_atomic = 4, access_shuffled = 8 };

struct access {
  const void* addr;   // first byte accessed
  const char* name;   // buffer / array name
  int64_t index;      // element index inside that buffer / array
  uint8_t* init;      // thread arrays: one "written" flag per element (racecheck), else null
  int32_t buf;        // device buffer index
  uint16_t lanes;     // elements accessed (vector width)
  uint16_t elem_bytes;
  space_kind kind;
  uint8_t flags;      // access_flags
  uint16_t view;      // threadgroup memory: 1 + index of the pool view accessed through (threadgroup_view), 0 for none
  const void* site;   // code address of the access (counters: lanes at the same site form one simdgroup access)
};
// Racecheck tracks the last view that wrote each byte of threadgroup memory for views with ids
// below this (the storage planner gives dead buffers' bytes to later ones).
constexpr uint32_t kMaxTrackedViews = 4096;
void on_access(const access& a) noexcept;

// Atomics (racecheck). A cast to an atomic object pointer, `(device atomic_int*)(H + i)`, names the
// memory (`atomic_target`, the buffer / array, element and width); the atomic functions then report
// each access through TLM_ATOMIC_ACCESS (`on_atomic_access`, by address) with its kind.
enum atomic_kind : unsigned { atomic_load = 0, atomic_store = 1, atomic_rmw = 2 };
void atomic_target(const access& a) noexcept;
void on_atomic_access(const void* addr, size_t bytes, unsigned kind) noexcept;
// Every value an atomic access of that memory observes or leaves behind (`bits`: `bytes` of it):
// loaded, stored, exchanged, compare-exchanged (the desired value, or the current one on failure),
// the result of a read-modify-write. On float device buffers racecheck sums their magnitudes per
// element: every rounded partial sum of a float atomic sum is one of them, which bounds how far
// two schedules' sums may differ (float_atomic_magnitudes).
void on_atomic_value(const void* addr, size_t bytes, const void* bits) noexcept;

// Racecheck: where to sum the magnitudes of the values float atomics leave in device buffers
// (instrument.py allocates and reads them; passed to tlm_instrument in racecheck mode).
enum magnitude_type : uint8_t { magnitude_none = 0, magnitude_float = 1, magnitude_half = 2, magnitude_bfloat = 3 };
constexpr uint32_t kMagnitudeBuffers = 256;
struct float_atomic_magnitudes {
  double* sum_abs[kMagnitudeBuffers];       // per device buffer index: one double per element, or null
  uint8_t elem_type[kMagnitudeBuffers];     // magnitude_type of that buffer's elements
};

// Accesses inside `if`/`else` blocks of the kernel count as predicated (counters).
void predicate_enter() noexcept;
void predicate_exit() noexcept;

// threadgroup_barrier with its mem_flags (racecheck: opens a new epoch per ordered memory kind).
void threadgroup_barrier_flags(unsigned mem_flags) noexcept;

// Foreign kernels' counters flavour with memory tracing (TLM_TRACE_MEMORY: built with clang's
// -fsanitize=thread instrumentation at -O0, foreign.py): every load, store and memcpy of the kernel
// reaches the runtime by address and size, and counts when it lands in a traced device buffer or in
// the running threadgroup's threadgroup memory. Shim helpers that access memory on the kernel's
// behalf silence the tracing (`trace_quiet`) and report their access as the plugin's counters count
// it (`traced_access`: one access of `bytes` bytes).
void traced_access(const void* addr, uint64_t bytes, bool store, const void* site = nullptr) noexcept;
void trace_quiet(int delta) noexcept;

// Counters, one row per threadgroup (names in tilelang_metal/emulator/instrument.py, same order).
enum counter : uint32_t {
  c_device_load_instructions,
  c_device_load_bytes,
  c_device_store_instructions,
  c_device_store_bytes,
  c_predicated_device_loads,
  c_predicated_device_stores,
  c_threadgroup_load_instructions,
  c_threadgroup_load_bytes,
  c_threadgroup_store_instructions,
  c_threadgroup_store_bytes,
  c_threadgroup_barriers,
  c_simdgroup_barriers,
  c_simd_collectives,
  c_narrow_device_loads,  // device loads of 2 bytes or less (scalar half/bfloat16/char/short)
  // GPU-level counts (docs/emulator.md, "GPU-level counts"): what the GPU would issue once a
  // compiler has merged each thread's adjacent accesses, per simdgroup-wide access.
  c_load_instructions,           // device + threadgroup loads after merging and dropping repeated reads
  c_store_instructions,          // device + threadgroup stores after merging
  c_unique_device_load_bytes,    // device bytes loaded, a repeated read of unchanged bytes counted once
  c_device_transactions,         // distinct 128-byte segments per simdgroup-wide device access, summed
  c_threadgroup_replays,         // extra bank passes per simdgroup-wide threadgroup access, summed
  c_memory_barriers,             // threadgroup barriers with a memory flag (device / threadgroup / texture)
  c_lockstep_barriers,           // threadgroup barriers with mem_none: execution order only
  c_matmul2d_16x32x16,
  c_simdgroup_multiply_accumulate_8x8x8,
  c_simdgroup_multiply_8x8x8,
  c_counter_count
};

}  // namespace tlm::rt
