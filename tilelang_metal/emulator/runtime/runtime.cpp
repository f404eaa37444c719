// CPU runtime of the tilelang_metal emulator.
//
// A launch runs threadgroups on a few OS worker threads (claimed in increasing linear order). Within
// a worker, the threads of one threadgroup are fibers on that OS thread, scheduled cooperatively: a
// fiber runs until it blocks at a barrier or simd rendezvous (or returns), then the next runnable
// fiber continues. Barriers are counted; when nothing is runnable but the threadgroup is not done,
// the threads disagree about which barrier/collective comes next, which is reported as an error.
//
// Only C headers and <atomic> on purpose: this file is compiled on first use of the emulator.
#undef _FORTIFY_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "fiber.h"
#include "tlm/runtime_api.h"

namespace tlm::rt {
namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreads = 1024;
constexpr uint32_t kMaxSimdGroups = kMaxThreads / kSimdWidth;
constexpr uint32_t kMaxSlots = 256;
constexpr size_t kArenaCapacity = 1u << 20;  // hard cap; the Metal limit is enforced separately
constexpr size_t kInitialPoison = 64 * 1024;
constexpr size_t kMessage = 1024;

enum class fstate : uint8_t { runnable, at_barrier, at_simd, done };

// Instrumentation of one launch (set by tlm_instrument just before it; plain launches: none).
enum class imode : int { none = 0, counters = 1, racecheck = 2 };
constexpr uint32_t kMaxBuffers = 256;

// Racecheck shadow state of one element (device) or byte (threadgroup memory): up to three recent
// accesses that a later access may conflict with (a write and readers, or several atomics);
// `group1` = threadgroup linear index + 1 (0 = empty slot).
enum who_bits : uint8_t { who_write = 1, who_atomic = 2 };
struct who {
  uint32_t group1;
  uint32_t epoch;
  uint16_t thread;
  uint8_t bits;  // who_bits
};
constexpr int kShadowSlots = 3;
struct shadow_cell {
  who s[kShadowSlots];
};

struct worker;

struct fiber_t {
  fiber::context ctx;
  lane_info info;
  fstate state;
  uint32_t index;
  worker* w;
  uint32_t pred_depth;  // open `if` blocks (counters)
  uint32_t quiet;       // open trace_quiet scopes (foreign counters: a shim helper counts its own accesses)
  uint32_t tg_epoch;    // threadgroup barriers passed that order threadgroup memory (racecheck)
  uint32_t dev_epoch;   // ... that order device memory
  access atomic;        // racecheck: the memory of the last atomic object pointer formed
  // racecheck: the first thread-array element read since this thread's last store that was never
  // written (or holds a value computed from such a read); reported if a store to device or
  // threadgroup memory follows (the value may be in it), forgotten at any other store.
  const char* taint_name;
  int64_t taint_index;
  bool taint_derived;
};

struct simd_state {
  uint32_t size;     // lanes in this simdgroup
  uint32_t arrived;  // lanes waiting in the current round
  uint32_t round;
  uint32_t nwait;
  const char* op;
  uint32_t waiters[kSimdWidth];
  alignas(64) unsigned char buf[2][simd_scratch_bytes];
};

// T.print output of one finished threadgroup, waiting for its turn (see print_group_finished).
struct print_chunk {
  uint64_t claim;
  char* text;
  size_t len;
};

struct launch_state {
  const launch_params* p;
  uint32_t nthreads;
  uint32_t nsimd;
  uint64_t ngroups;
  size_t stack_bytes;
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> error_group{UINT64_MAX};  // lowest threadgroup with an error so far
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  bool has_error = false;
  char error[kMessage] = {0};
  imode mode = imode::none;
  uint64_t seed = 0;
  uint64_t* counters = nullptr;  // counters mode: ngroups rows of c_counter_count
  uint64_t* order = nullptr;     // racecheck: the (seeded, shuffled) order threadgroups run in
  const float_atomic_magnitudes* magnitudes = nullptr;  // racecheck: float atomic value magnitudes, or null
  shadow_cell* dev_shadow[kMaxBuffers] = {};
  bool has_race = false;
  char race[kMessage] = {0};
  // T.print: lines leave in claim order. The claim at the head writes straight to stdout; a
  // threadgroup claimed later buffers its lines until every earlier claim has finished.
  pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;
  uint64_t print_head = 0;
  print_chunk* print_done = nullptr;  // finished claims above the head, unordered
  size_t print_done_count = 0, print_done_cap = 0;
  worker* workers = nullptr;
  uint64_t nworkers = 0;
};

struct worker {
  launch_state* L;
  fiber::context sched;
  fiber_t* fibers;
  char* stacks;
  size_t stacks_bytes;
  size_t stack_span;  // one stack plus its guard page
  size_t page;
  fiber_t* cur;
  uint32_t* rq;  // run queue: ring buffer of fiber indices
  uint32_t rq_head, rq_count;
  uint32_t done;
  uint32_t bar_arrived;
  uint32_t* bar_waiters;
  simd_state* simd;
  unsigned char* arena;  // threadgroup memory of the running threadgroup
  bool owns_arena;       // mapped by setup_worker (else a slice of the launch's traced arenas)
  size_t arena_used;
  int64_t slot_off[kMaxSlots];
  uint64_t slot_bytes[kMaxSlots];
  uint64_t group;
  uint32_t tg[3];
  bool aborted;
  uint64_t rng;                       // racecheck: seeded schedule
  shadow_cell* tg_shadow;             // racecheck: one cell per byte of threadgroup memory
  uint16_t* tg_writer;                // racecheck: per byte, the view that last wrote it (access::view)
  const char* view_names[kMaxTrackedViews];  // racecheck: name of each view id seen writing
  uint64_t counts[c_counter_count];   // counters of the running threadgroup
  struct gpu_model* gpu;              // counters: GPU-level counts of the running threadgroup
  unsigned bar_flags;                 // mem_flags of the barrier being arrived at (kBarFlagsKnown set)
  uint64_t claim;                     // claim index of the running threadgroup (UINT64_MAX: none)
  char* print_out;                    // its T.print lines while it is not the head claim
  size_t print_len, print_cap;
  alignas(64) unsigned char oob_scratch[256];
};

thread_local worker* tl_w = nullptr;

// Counters launches: where traced accesses can count (every worker's threadgroup memory, one
// mapping; the launch's guarded device buffers). The tracing hooks test an address against these
// before touching thread-local state, so the many accesses of the stack cost a few compares.
struct trace_window {
  uintptr_t arenas = 0;
  size_t arenas_bytes = 0;
  const guard_region* guards = nullptr;
  uint32_t nguards = 0;
};
trace_window g_trace;

// ---------------------------------------------------------------- errors

// Keeps the error of the lowest threadgroup (the first one found within it), so the reported error
// does not depend on the number of workers.
void record_error(launch_state* L, uint64_t group, const char* msg) {
  pthread_mutex_lock(&L->mu);
  if (!L->has_error || group < L->error_group.load(std::memory_order_relaxed)) {
    L->has_error = true;
    std::snprintf(L->error, sizeof L->error, "%s", msg);
    L->error_group.store(group, std::memory_order_relaxed);
  }
  pthread_mutex_unlock(&L->mu);
}

void where(const worker& w, const lane_info& li, char* out, size_t n) {
  std::snprintf(out, n, "threadgroup (%u,%u,%u), thread (%u,%u,%u) [thread %u, simdgroup %u, lane %u]", w.tg[0],
                w.tg[1], w.tg[2], li.tid[0], li.tid[1], li.tid[2], li.linear, li.simd_group, li.lane);
}

// ---------------------------------------------------------------- scheduling

inline void rq_push(worker& w, uint32_t i) {
  w.rq[(w.rq_head + w.rq_count) % w.L->nthreads] = i;
  ++w.rq_count;
  w.fibers[i].state = fstate::runnable;
}

inline uint64_t next_random(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

inline fiber_t* rq_pop(worker& w) {
  if (w.rq_count == 0) return nullptr;
  if (w.L->mode == imode::racecheck && w.rq_count > 1) {
    // Randomized schedule: any runnable thread may go next.
    const uint32_t n = w.L->nthreads;
    uint32_t k = static_cast<uint32_t>(next_random(w.rng) % w.rq_count);
    uint32_t& a = w.rq[w.rq_head];
    uint32_t& b = w.rq[(w.rq_head + k) % n];
    uint32_t t = a;
    a = b;
    b = t;
  }
  uint32_t i = w.rq[w.rq_head];
  w.rq_head = (w.rq_head + 1) % w.L->nthreads;
  --w.rq_count;
  return &w.fibers[i];
}

// Leaves the current fiber for good and returns to the worker loop, which stops.
[[noreturn]] void abandon(worker& w) {
  w.aborted = true;
  fiber_t* self = w.cur;
  w.cur = nullptr;
  fiber::switch_to(self->ctx, w.sched);
  __builtin_unreachable();
}

void describe(const worker& w, const fiber_t& f, char* out, size_t n) {
  switch (f.state) {
    case fstate::done:
      std::snprintf(out, n, "thread %u returned", f.index);
      break;
    case fstate::at_barrier:
      std::snprintf(out, n, "thread %u is waiting at threadgroup_barrier", f.index);
      break;
    case fstate::at_simd: {
      const char* op = w.simd[f.info.simd_group].op;
      std::snprintf(out, n, "thread %u is waiting at %s", f.index, op ? op : "a simd collective");
      break;
    }
    default:
      std::snprintf(out, n, "thread %u is runnable", f.index);
  }
}

// Nothing is runnable but the threadgroup has not finished: name the rendezvous that some threads
// reached and one thread that did not, then abandon the threadgroup.
[[noreturn]] void deadlock(worker& w) {
  launch_state* L = w.L;
  char msg[kMessage], other[200];
  std::snprintf(msg, sizeof msg, "deadlock in threadgroup (%u,%u,%u): no runnable thread", w.tg[0], w.tg[1], w.tg[2]);
  if (w.bar_arrived > 0) {
    std::snprintf(other, sizeof other, "(no other thread found)");
    for (uint32_t i = 0; i < L->nthreads; ++i)
      if (w.fibers[i].state != fstate::at_barrier) {
        describe(w, w.fibers[i], other, sizeof other);
        break;
      }
    std::snprintf(msg, sizeof msg,
                  "divergent barrier: %u of %u threads of threadgroup (%u,%u,%u) reached threadgroup_barrier; %s",
                  w.bar_arrived, L->nthreads, w.tg[0], w.tg[1], w.tg[2], other);
  } else {
    for (uint32_t s = 0; s < L->nsimd; ++s) {
      const simd_state& st = w.simd[s];
      if (st.arrived == 0) continue;
      std::snprintf(other, sizeof other, "(no other lane found)");
      for (uint32_t l = 0; l < st.size; ++l) {
        const fiber_t& f = w.fibers[s * kSimdWidth + l];
        if (f.state != fstate::at_simd) {
          describe(w, f, other, sizeof other);
          break;
        }
      }
      std::snprintf(msg, sizeof msg,
                    "divergent simd collective: %u of %u lanes of simdgroup %u of threadgroup (%u,%u,%u) reached %s; %s",
                    st.arrived, st.size, s, w.tg[0], w.tg[1], w.tg[2], st.op ? st.op : "?", other);
      break;
    }
  }
  record_error(L, w.group, msg);
  abandon(w);
}

// The current fiber has registered itself as a waiter: run someone else.
void block(worker& w) {
  fiber_t* self = w.cur;
  fiber_t* next = rq_pop(w);
  if (!next) deadlock(w);
  w.cur = next;
  fiber::switch_to(self->ctx, next->ctx);
  // resumed: whoever switched to us has set w.cur = self
}

// Body of every fiber: play one GPU thread per threadgroup, for as long as the worker resumes it.
void fiber_main(void* arg) {
  fiber_t* f = static_cast<fiber_t*>(arg);
  worker& w = *f->w;
  for (;;) {
    w.L->p->entry(f->info, w.L->p->buffers, w.L->p->counts);
    f->state = fstate::done;
    if (++w.done == w.L->nthreads) {
      w.cur = nullptr;
      fiber::switch_to(f->ctx, w.sched);  // threadgroup finished; resumed for the next one
      continue;
    }
    fiber_t* next = rq_pop(w);
    if (!next) deadlock(w);
    w.cur = next;
    fiber::switch_to(f->ctx, next->ctx);
  }
}

// ---------------------------------------------------------------- T.print output

void write_stdout(const char* text, size_t len) {
  while (len > 0) {
    ssize_t n = ::write(1, text, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout closed or full: printing is best effort, the launch goes on
    text += n;
    len -= static_cast<size_t>(n);
  }
}

bool append(char*& buf, size_t& len, size_t& cap, const char* text, size_t n) {
  if (len + n > cap) {
    size_t want = cap ? cap * 2 : 4096;
    while (want < len + n) want *= 2;
    char* grown = static_cast<char*>(std::realloc(buf, want));
    if (!grown) return false;
    buf = grown;
    cap = want;
  }
  std::memcpy(buf + len, text, n);
  len += n;
  return true;
}

// Under print_mu: write whatever the head claim allows, moving the head past finished claims.
void print_advance(launch_state* L) {
  for (;;) {
    bool moved = false;
    for (size_t i = 0; i < L->print_done_count; ++i) {
      print_chunk& c = L->print_done[i];
      if (c.claim != L->print_head) continue;
      write_stdout(c.text, c.len);
      std::free(c.text);
      c = L->print_done[--L->print_done_count];
      ++L->print_head;
      moved = true;
      break;
    }
    if (!moved) break;
  }
  for (uint64_t i = 0; i < L->nworkers; ++i) {  // the new head may be running: its lines so far
    worker& x = L->workers[i];
    if (x.claim == L->print_head && x.print_len) {
      write_stdout(x.print_out, x.print_len);
      x.print_len = 0;
    }
  }
}

void print_line(worker& w, const char* text, size_t len) {
  launch_state* L = w.L;
  pthread_mutex_lock(&L->print_mu);
  if (!L->p->prints || w.claim == L->print_head || !append(w.print_out, w.print_len, w.print_cap, text, len))
    write_stdout(text, len);  // (out of memory to buffer: the line goes out now, out of order)
  pthread_mutex_unlock(&L->print_mu);
}

void print_group_started(worker& w, uint64_t claim) {
  pthread_mutex_lock(&w.L->print_mu);  // other workers read `claim` in print_advance
  w.claim = claim;
  pthread_mutex_unlock(&w.L->print_mu);
}

// After every threadgroup (finished or abandoned), so the head can move past it.
void print_group_finished(worker& w) {
  launch_state* L = w.L;
  pthread_mutex_lock(&L->print_mu);
  if (w.claim == L->print_head) {
    write_stdout(w.print_out, w.print_len);  // normally empty: the head's lines went out at once
    w.print_len = 0;
    ++L->print_head;
    print_advance(L);
  } else {
    bool kept = true;
    if (L->print_done_count == L->print_done_cap) {
      size_t want = L->print_done_cap ? L->print_done_cap * 2 : 16;
      auto* grown = static_cast<print_chunk*>(std::realloc(L->print_done, want * sizeof(print_chunk)));
      if (grown) L->print_done = grown, L->print_done_cap = want;
      else kept = false;
    }
    if (kept) {
      L->print_done[L->print_done_count++] = print_chunk{w.claim, w.print_out, w.print_len};
      w.print_out = nullptr;
      w.print_len = w.print_cap = 0;
    } else {
      write_stdout(w.print_out, w.print_len);  // out of memory to wait: out of order
      w.print_len = 0;
    }
  }
  w.claim = UINT64_MAX;
  pthread_mutex_unlock(&L->print_mu);
}

// After the workers joined: claims that never ran (skipped after an error) leave gaps; the rest
// goes out in claim order.
void print_flush_rest(launch_state* L) {
  while (L->print_done_count > 0) {
    size_t lowest = 0;
    for (size_t i = 1; i < L->print_done_count; ++i)
      if (L->print_done[i].claim < L->print_done[lowest].claim) lowest = i;
    print_chunk c = L->print_done[lowest];
    L->print_done[lowest] = L->print_done[--L->print_done_count];
    write_stdout(c.text, c.len);
    std::free(c.text);
  }
  std::free(L->print_done);
}

// ---------------------------------------------------------------- workers

template <class T> T* alloc_array(size_t n) {
  void* p = std::calloc(n, sizeof(T));
  return static_cast<T*>(p);
}

void* map_anon(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// ---------------------------------------------------------------- GPU-level counts (counters)
// What the GPU would issue, counted the same way for plugin and foreign kernels from the accesses
// each thread makes (docs/emulator.md, "GPU-level counts"):
// - a thread's accesses are merged as a compiler would: consecutive accesses in one memory space,
//   same direction, the next starting where the last ended, up to 16 bytes, the merged access
//   aligned to its (power-of-two) size; a barrier or simd collective ends every merge;
// - a load of bytes the thread read before, with no store by it and no barrier since, is dropped;
// - the lanes' instructions at the same program point (code address) and occurrence form one
//   simdgroup-wide access: device accesses count the distinct 128-byte segments they touch,
//   threadgroup accesses the bank passes beyond the fewest possible.
// Sources: 128-byte global cache line (Apple 7/8): philipturner/metal-benchmarks README, "On-Chip
// Memory" (commit dc2adc6). Threadgroup banks: that table gives "TBD" for Apple; 32 banks of 4 bytes
// as on every other GPU in it is an estimate.
constexpr uint64_t kSegmentBytes = 128;
constexpr uint64_t kBankBytes = 4;
constexpr uint32_t kBanks = 32;
constexpr uint64_t kWidestMerge = 16;
constexpr uint32_t kReadMemory = 16;  // read ranges a thread remembers (a register's worth of reuse)
constexpr unsigned kBarFlagsKnown = 0x100u;

struct gpu_window {
  uintptr_t lo, hi;  // open merged access [lo, hi); empty when lo == hi
  const void* site;
  uintptr_t origin;  // device: start of the buffer
  uint32_t buf;
};

struct gpu_thread {
  gpu_window open[2][2];  // [threadgroup memory][store]
  uintptr_t read_lo[kReadMemory], read_hi[kReadMemory];
  uint32_t nread, read_next;
};

struct key3 {
  uint64_t a, b, c;
};

// Open-addressing map key3 -> uint32 (no STL in this file: it is compiled on first use).
struct map3 {
  key3* keys = nullptr;
  uint32_t* vals = nullptr;
  uint8_t* used = nullptr;
  uint64_t cap = 0, n = 0;
};

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

inline uint64_t hash3(const key3& k) { return mix(k.a ^ mix(k.b ^ mix(k.c))); }

bool map3_init(map3& m, uint64_t cap) {
  m.keys = static_cast<key3*>(std::calloc(cap, sizeof(key3)));
  m.vals = static_cast<uint32_t*>(std::calloc(cap, sizeof(uint32_t)));
  m.used = static_cast<uint8_t*>(std::calloc(cap, 1));
  m.cap = cap;
  m.n = 0;
  return m.keys && m.vals && m.used;
}

void map3_free(map3& m) {
  std::free(m.keys);
  std::free(m.vals);
  std::free(m.used);
  m = map3{};
}

// The value slot of `k`, inserted with value `fresh` if absent (`inserted` says which).
uint32_t* map3_slot(map3& m, const key3& k, uint32_t fresh, bool& inserted) {
  if ((m.n + 1) * 2 > m.cap) {
    map3 g;
    if (!map3_init(g, m.cap * 2)) return nullptr;
    for (uint64_t i = 0; i < m.cap; ++i) {
      if (!m.used[i]) continue;
      uint64_t j = hash3(m.keys[i]) & (g.cap - 1);
      while (g.used[j]) j = (j + 1) & (g.cap - 1);
      g.used[j] = 1;
      g.keys[j] = m.keys[i];
      g.vals[j] = m.vals[i];
    }
    g.n = m.n;
    map3_free(m);
    m = g;
  }
  uint64_t j = hash3(k) & (m.cap - 1);
  while (m.used[j]) {
    const key3& q = m.keys[j];
    if (q.a == k.a && q.b == k.b && q.c == k.c) {
      inserted = false;
      return &m.vals[j];
    }
    j = (j + 1) & (m.cap - 1);
  }
  m.used[j] = 1;
  m.keys[j] = k;
  m.vals[j] = fresh;
  ++m.n;
  inserted = true;
  return &m.vals[j];
}

void map3_clear(map3& m) {
  if (m.n) std::memset(m.used, 0, m.cap);
  m.n = 0;
}

struct gpu_unit {
  uint32_t group;
  uint64_t unit;  // a device segment or a threadgroup word
};

struct gpu_model {
  gpu_thread* threads;
  map3 occurrences;  // (thread, site, space|direction) -> instructions issued there so far
  map3 groups;       // (simdgroup, site, occurrence) -> group id
  uint8_t* group_tg; // per group id: 1 for threadgroup memory
  uint64_t group_cap;
  gpu_unit* units;
  uint64_t nunits, units_cap;
  bool failed;  // out of memory: the GPU-level counts of this launch are not kept
};

gpu_model* gpu_model_new(uint32_t nthreads) {
  gpu_model* g = static_cast<gpu_model*>(std::calloc(1, sizeof(gpu_model)));
  if (!g) return nullptr;
  g->threads = alloc_array<gpu_thread>(nthreads);
  g->group_cap = 1024;
  g->group_tg = static_cast<uint8_t*>(std::calloc(g->group_cap, 1));
  g->units_cap = 4096;
  g->units = static_cast<gpu_unit*>(std::malloc(sizeof(gpu_unit) * g->units_cap));
  if (!g->threads || !g->group_tg || !g->units || !map3_init(g->occurrences, 1024) || !map3_init(g->groups, 1024)) {
    g->failed = true;
  }
  return g;
}

void gpu_model_free(gpu_model* g) {
  if (!g) return;
  std::free(g->threads);
  std::free(g->group_tg);
  std::free(g->units);
  map3_free(g->occurrences);
  map3_free(g->groups);
  std::free(g);
}

inline bool push_unit(gpu_model& g, uint32_t group, uint64_t unit) {
  if (g.nunits == g.units_cap) {
    gpu_unit* u = static_cast<gpu_unit*>(std::realloc(g.units, sizeof(gpu_unit) * g.units_cap * 2));
    if (!u) return false;
    g.units = u;
    g.units_cap *= 2;
  }
  g.units[g.nunits++] = gpu_unit{group, unit};
  return true;
}

// One instruction of thread `t` over [lo, hi): counted, and joined to its simdgroup-wide access.
// Device segments are counted from the start of the buffer (`origin`; Metal buffers are aligned far
// beyond 128 bytes, the emulator's copies not always), tagged with the buffer's index `buf`.
void gpu_issue(worker& w, uint32_t t, bool tg, bool store, uintptr_t lo, uintptr_t hi, const void* site,
               uintptr_t origin, uint32_t buf) {
  gpu_model& g = *w.gpu;
  ++w.counts[store ? c_store_instructions : c_load_instructions];
  if (g.failed) return;
  const uint64_t where = reinterpret_cast<uintptr_t>(site);
  bool inserted = false;
  uint32_t* occ = map3_slot(g.occurrences, key3{t, where, (tg ? 2u : 0u) | (store ? 1u : 0u)}, 0, inserted);
  if (!occ) return void(g.failed = true);
  const uint32_t k = (*occ)++;
  const uint32_t fresh = static_cast<uint32_t>(g.groups.n);
  uint32_t* id = map3_slot(g.groups, key3{t / kSimdWidth, (where << 2) | (tg ? 2u : 0u) | (store ? 1u : 0u), k},
                           fresh, inserted);
  if (!id) return void(g.failed = true);
  if (inserted) {
    if (fresh >= g.group_cap) {
      uint8_t* p = static_cast<uint8_t*>(std::realloc(g.group_tg, g.group_cap * 2));
      if (!p) return void(g.failed = true);
      g.group_tg = p;
      g.group_cap *= 2;
    }
    g.group_tg[fresh] = tg;
  }
  if (tg) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(w.arena);
    for (uint64_t word = (lo - base) / kBankBytes; word <= (hi - 1 - base) / kBankBytes; ++word)
      if (!push_unit(g, *id, word)) return void(g.failed = true);
  } else {
    const uint64_t tag = static_cast<uint64_t>(buf) << 44;
    for (uint64_t seg = (lo - origin) / kSegmentBytes; seg <= (hi - 1 - origin) / kSegmentBytes; ++seg)
      if (!push_unit(g, *id, tag | seg)) return void(g.failed = true);
  }
}

inline void gpu_close(worker& w, uint32_t t, bool tg, bool store) {
  gpu_window& win = w.gpu->threads[t].open[tg][store];
  if (win.hi != win.lo) gpu_issue(w, t, tg, store, win.lo, win.hi, win.site, win.origin, win.buf);
  win.lo = win.hi = 0;
}

// A barrier or simd collective: the thread's open merges end; a barrier also ends read reuse
// (another thread may have written since).
void gpu_sync(worker& w, uint32_t t, bool barrier) {
  for (int tg = 0; tg < 2; ++tg)
    for (int st = 0; st < 2; ++st) gpu_close(w, t, tg, st);
  if (barrier) w.gpu->threads[t].nread = 0;
}

inline uint64_t pow2_at_least(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

void gpu_access(worker& w, space_kind kind, const void* addr, uint64_t bytes, bool store, const void* site,
                uintptr_t origin, uint32_t buf) {
  if (!w.gpu || bytes == 0 || kind == space_kind::thread_memory) return;
  const uint32_t t = w.cur->index;
  gpu_thread& th = w.gpu->threads[t];
  const bool tg = kind == space_kind::threadgroup_memory;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(addr), hi = lo + bytes;
  if (!store) {
    for (uint32_t i = 0; i < th.nread; ++i)
      if (lo >= th.read_lo[i] && hi <= th.read_hi[i]) return;  // a repeated read: already in a register
    const uint32_t slot = th.nread < kReadMemory ? th.nread++ : (th.read_next++ % kReadMemory);
    th.read_lo[slot] = lo;
    th.read_hi[slot] = hi;
    if (!tg) w.counts[c_unique_device_load_bytes] += bytes;
  } else {
    for (uint32_t i = 0; i < th.nread;) {  // the thread's own store changes what it read
      if (lo < th.read_hi[i] && th.read_lo[i] < hi) {
        --th.nread;
        th.read_lo[i] = th.read_lo[th.nread];
        th.read_hi[i] = th.read_hi[th.nread];
      } else {
        ++i;
      }
    }
  }
  gpu_window& win = th.open[tg][store];
  if (win.hi != win.lo && win.hi == lo && win.buf == buf) {
    const uint64_t merged = hi - win.lo;
    if (merged <= kWidestMerge && win.lo % pow2_at_least(merged) == 0) {
      win.hi = hi;
      return;
    }
  }
  gpu_close(w, t, tg, store);
  if (bytes > kWidestMerge) {  // wider than one instruction (a 32-byte struct copy): 16-byte pieces
    for (uintptr_t p = lo; p < hi; p += kWidestMerge)
      gpu_issue(w, t, tg, store, p, p + kWidestMerge < hi ? p + kWidestMerge : hi, site, origin, buf);
    return;
  }
  win.lo = lo;
  win.hi = hi;
  win.site = site;
  win.origin = origin;
  win.buf = buf;
}

int compare_units(const void* x, const void* y) {
  const gpu_unit& a = *static_cast<const gpu_unit*>(x);
  const gpu_unit& b = *static_cast<const gpu_unit*>(y);
  if (a.group != b.group) return a.group < b.group ? -1 : 1;
  return a.unit < b.unit ? -1 : (a.unit > b.unit ? 1 : 0);
}

// The threadgroup has finished: close every thread's merges and add up its simdgroup-wide accesses.
void gpu_finish_group(worker& w) {
  gpu_model& g = *w.gpu;
  for (uint32_t t = 0; t < w.L->nthreads; ++t) {
    gpu_sync(w, t, true);
    g.threads[t].read_next = 0;
  }
  if (!g.failed && g.nunits) {
    std::qsort(g.units, g.nunits, sizeof(gpu_unit), compare_units);
    uint64_t i = 0;
    while (i < g.nunits) {
      const uint32_t group = g.units[i].group;
      uint32_t per_bank[kBanks] = {};
      uint64_t distinct = 0;
      for (uint64_t prev = ~0ull; i < g.nunits && g.units[i].group == group; ++i) {
        const uint64_t u = g.units[i].unit;
        if (u == prev) continue;  // lanes sharing a segment / word (a word read by several lanes is a broadcast)
        prev = u;
        ++distinct;
        ++per_bank[u % kBanks];
      }
      if (g.group_tg[group]) {
        uint32_t passes = 0;
        for (uint32_t b = 0; b < kBanks; ++b) passes = per_bank[b] > passes ? per_bank[b] : passes;
        const uint64_t fewest = (distinct + kBanks - 1) / kBanks;
        w.counts[c_threadgroup_replays] += passes - fewest;
      } else {
        w.counts[c_device_transactions] += distinct;
      }
    }
  }
  g.nunits = 0;
  map3_clear(g.occurrences);
  map3_clear(g.groups);
}

// `w` arrives zeroed (launch clears every worker before any starts: the print code reads other
// workers' `claim`).
bool setup_worker(worker& w, launch_state* L) {
  w.L = L;
  const uint32_t n = L->nthreads;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t stack = (L->stack_bytes + page - 1) / page * page;
  const size_t span = stack + page;  // guard page below every stack
  w.stacks_bytes = span * n;
  w.stack_span = span;
  w.page = page;
  w.stacks = static_cast<char*>(map_anon(w.stacks_bytes));
  if (!w.arena) {  // counters launches hand every worker a slice of one mapping (g_trace)
    w.arena = static_cast<unsigned char*>(map_anon(kArenaCapacity));
    w.owns_arena = true;
  }
  w.fibers = alloc_array<fiber_t>(n);
  w.rq = alloc_array<uint32_t>(n);
  w.bar_waiters = alloc_array<uint32_t>(n);
  w.simd = static_cast<simd_state*>(std::aligned_alloc(64, sizeof(simd_state) * L->nsimd));
  if (!w.stacks || !w.arena || !w.fibers || !w.rq || !w.bar_waiters || !w.simd) {
    char msg[200];
    std::snprintf(msg, sizeof msg, "emulator: out of memory setting up a worker (%u threads, %zu bytes of stacks)", n,
                  w.stacks_bytes);
    record_error(L, 0, msg);
    return false;
  }
  for (uint32_t s = 0; s < kMaxSlots; ++s) w.slot_off[s] = -1;
  if (L->mode == imode::counters) {
    w.gpu = gpu_model_new(n);
    if (!w.gpu) {
      record_error(L, 0, "emulator: out of memory for the GPU-level counters");
      return false;
    }
  }
  if (L->mode == imode::racecheck) {
    w.rng = (L->seed + 1) * 0x9E3779B97F4A7C15ull | 1;
    w.tg_shadow = alloc_array<shadow_cell>(L->p->threadgroup_limit);
    w.tg_writer = alloc_array<uint16_t>(L->p->threadgroup_limit);
    if (!w.tg_shadow || !w.tg_writer) {
      record_error(L, 0, "emulator: out of memory for the racecheck shadow of threadgroup memory");
      return false;
    }
  }
  const uint32_t* b = L->p->block;
  for (uint32_t i = 0; i < n; ++i) {
    fiber_t& f = w.fibers[i];
    f.index = i;
    f.w = &w;
    f.state = fstate::done;
    lane_info& li = f.info;
    li.tid[0] = i % b[0];
    li.tid[1] = (i / b[0]) % b[1];
    li.tid[2] = i / (b[0] * b[1]);
    for (int d = 0; d < 3; ++d) {
      li.grid[d] = L->p->grid[d];
      li.block[d] = b[d];
    }
    li.linear = i;
    li.simd_group = i / kSimdWidth;
    li.lane = i % kSimdWidth;
    li.simd_size = n - li.simd_group * kSimdWidth < kSimdWidth ? n - li.simd_group * kSimdWidth : kSimdWidth;
    li.simd_groups = L->nsimd;
    char* lo = w.stacks + i * span;
    mprotect(lo, page, PROT_NONE);  // a stack overflow faults here instead of corrupting a neighbour
    fiber::prepare(f.ctx, lo + page, stack, fiber_main, &f);
  }
  for (uint32_t s = 0; s < L->nsimd; ++s) {
    std::memset(static_cast<void*>(&w.simd[s]), 0, offsetof(simd_state, buf));
    w.simd[s].size = n - s * kSimdWidth < kSimdWidth ? n - s * kSimdWidth : kSimdWidth;
  }
  // The first threadgroup sees poison everywhere; later ones get the used part re-poisoned.
  std::memset(w.arena, 0xff, kInitialPoison);
  return true;
}

void teardown_worker(worker& w) {
  std::free(w.print_out);
  std::free(w.fibers);
  std::free(w.rq);
  std::free(w.bar_waiters);
  std::free(w.simd);
  std::free(w.tg_shadow);
  std::free(w.tg_writer);
  gpu_model_free(w.gpu);
  w.gpu = nullptr;
  if (w.stacks) munmap(w.stacks, w.stacks_bytes);
  if (w.arena && w.owns_arena) munmap(w.arena, kArenaCapacity);
}

void run_group(worker& w, uint64_t g) {
  launch_state* L = w.L;
  const uint32_t* grid = L->p->grid;
  w.group = g;
  w.tg[0] = static_cast<uint32_t>(g % grid[0]);
  w.tg[1] = static_cast<uint32_t>((g / grid[0]) % grid[1]);
  w.tg[2] = static_cast<uint32_t>(g / (static_cast<uint64_t>(grid[0]) * grid[1]));
  // Threadgroup memory is uninitialised on the GPU: poison it (0xff bytes are NaN for half/float).
  if (w.arena_used) std::memset(w.arena, 0xff, w.arena_used);
  w.rq_head = 0;
  w.rq_count = 0;
  w.done = 0;
  w.bar_arrived = 0;
  for (uint32_t s = 0; s < L->nsimd; ++s) {
    w.simd[s].arrived = 0;
    w.simd[s].nwait = 0;
    w.simd[s].op = nullptr;
  }
  if (w.tg_shadow && w.arena_used) std::memset(static_cast<void*>(w.tg_shadow), 0, sizeof(shadow_cell) * w.arena_used);
  if (w.tg_writer && w.arena_used) std::memset(w.tg_writer, 0, sizeof(uint16_t) * w.arena_used);
  for (uint32_t i = 0; i < L->nthreads; ++i) {
    w.fibers[i].pred_depth = 0;
    w.fibers[i].quiet = 0;
    w.fibers[i].tg_epoch = 0;
    w.fibers[i].dev_epoch = 0;
    w.fibers[i].atomic = access{};
    w.fibers[i].taint_name = nullptr;
    lane_info& li = w.fibers[i].info;
    li.tg[0] = w.tg[0];
    li.tg[1] = w.tg[1];
    li.tg[2] = w.tg[2];
    rq_push(w, i);
  }
  fiber_t* first = rq_pop(w);
  w.cur = first;
  fiber::switch_to(w.sched, first->ctx);
  // back here when the threadgroup finished or was abandoned
  if (w.gpu) gpu_finish_group(w);
  if (L->counters) {
    std::memcpy(L->counters + g * c_counter_count, w.counts, sizeof w.counts);
    std::memset(w.counts, 0, sizeof w.counts);
  }
}

struct worker_arg {
  launch_state* L;
  worker* w;
};

// ---------------------------------------------------------------- stack overflow -> error
// A fiber that overflows its stack faults on the guard page below it (kernels are built with
// -fstack-clash-protection, so big frames probe page by page). During a launch a SIGSEGV/SIGBUS
// handler, running on a per-worker alternate stack, recognises such a fault, records an error and
// abandons the threadgroup; every other fault goes to the handler that was installed before.

constexpr size_t kAltStack = 64 * 1024;
pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
int g_guard_users = 0;
struct sigaction g_prev_segv, g_prev_bus;

void chain(int sig, siginfo_t* info, void* uc) {
  const struct sigaction& prev = sig == SIGBUS ? g_prev_bus : g_prev_segv;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, uc);
    return;
  }
  if (prev.sa_handler == SIG_IGN) return;
  if (prev.sa_handler == SIG_DFL || prev.sa_handler == nullptr) {
    signal(sig, SIG_DFL);  // returning re-executes the faulting access, which now ends the process
    return;
  }
  prev.sa_handler(sig);
}

void on_fault(int sig, siginfo_t* info, void* uc) {
  worker* w = tl_w;
  if (w && w->stacks && w->cur && info) {
    const char* a = static_cast<const char*>(info->si_addr);
    if (a >= w->stacks && a < w->stacks + w->stacks_bytes) {
      const size_t off = static_cast<size_t>(a - w->stacks);
      if (off % w->stack_span < w->page) {
        char pos[200], msg[kMessage];
        const uint32_t victim = static_cast<uint32_t>(off / w->stack_span);
        // the guard page below stack i lies at the start of span i; it is overflowed by fiber i
        where(*w, w->fibers[victim].info, pos, sizeof pos);
        std::snprintf(msg, sizeof msg,
                      "stack overflow of a GPU thread (%zu KiB stack): %s; raise TILELANG_METAL_EMULATOR_STACK_KB",
                      (w->stack_span - w->page) / 1024, pos);
        record_error(w->L, w->group, msg);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
        abandon(*w);  // leaves the signal frame for good: the worker goes on with its loop's exit
      }
    }
  }
  if (w && w->cur && info && w->L) {
    const char* a = static_cast<const char*>(info->si_addr);
    for (uint32_t i = 0; i < w->L->p->nguards; ++i) {
      const guard_region& g = w->L->p->guards[i];
      if (a < g.lo || a >= g.hi) continue;
      char pos[200], msg[kMessage];
      where(*w, w->cur->info, pos, sizeof pos);
      const long long off = static_cast<long long>(a - g.data);
      std::snprintf(msg, sizeof msg,
                    "out-of-bounds access to device buffer '%s' (buffer %d, %llu bytes) at byte offset %lld; %s",
                    g.name, g.buffer, static_cast<unsigned long long>(g.bytes), off, pos);
      record_error(w->L, w->group, msg);
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sig);
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      abandon(*w);
    }
  }
  chain(sig, info, uc);
}

void guard_install() {
  pthread_mutex_lock(&g_guard_mu);
  if (g_guard_users++ == 0) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
    sigaction(SIGBUS, &sa, &g_prev_bus);
  }
  pthread_mutex_unlock(&g_guard_mu);
}

void guard_remove() {
  pthread_mutex_lock(&g_guard_mu);
  if (--g_guard_users == 0) {
    sigaction(SIGSEGV, &g_prev_segv, nullptr);
    sigaction(SIGBUS, &g_prev_bus, nullptr);
  }
  pthread_mutex_unlock(&g_guard_mu);
}

void* worker_main(void* p) {
  worker_arg* a = static_cast<worker_arg*>(p);
  launch_state* L = a->L;
  worker* w = a->w;
  worker* saved = tl_w;
  tl_w = w;
  // The fault handler needs a stack of its own: the faulting one is exhausted.
  stack_t alt{}, old_alt{};
  alt.ss_sp = map_anon(kAltStack);
  alt.ss_size = kAltStack;
  const bool have_alt = alt.ss_sp && sigaltstack(&alt, &old_alt) == 0;
  if (setup_worker(*w, L)) {
    for (;;) {
      uint64_t g = L->next.fetch_add(1, std::memory_order_relaxed);
      if (g >= L->ngroups) break;
      // After an error only lower threadgroups still matter (they may hold an earlier error).
      if (g > L->error_group.load(std::memory_order_relaxed)) break;
      if (L->p->prints) print_group_started(*w, g);
      run_group(*w, L->order ? L->order[g] : g);
      if (L->p->prints) print_group_finished(*w);
      if (w->aborted) break;
    }
  }
  teardown_worker(*w);
  if (have_alt) sigaltstack(&old_alt, nullptr);
  if (alt.ss_sp) munmap(alt.ss_sp, kAltStack);
  tl_w = saved;
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------- API used by kernels

const lane_info& self() noexcept { return tl_w->cur->info; }

void debug_print(const char* msg, const char* buffer, int64_t index, const print_value& v) noexcept {
  worker& w = *tl_w;
  const lane_info& li = w.cur->info;
  char value[64] = {0};
  switch (v.kind) {
    case print_signed: std::snprintf(value, sizeof value, "%lld", static_cast<long long>(v.i)); break;
    case print_unsigned: std::snprintf(value, sizeof value, "%llu", static_cast<unsigned long long>(v.u)); break;
    case print_floating: std::snprintf(value, sizeof value, "%f", v.f); break;
    case print_boolean: std::snprintf(value, sizeof value, "%s", v.u ? "true" : "false"); break;
    case print_message: break;
  }
  char where_[128];
  std::snprintf(where_, sizeof where_, "BlockIdx=(%u, %u, %u), ThreadIdx=(%u, %u, %u)", li.tg[0], li.tg[1], li.tg[2],
                li.tid[0], li.tid[1], li.tid[2]);
  char small[512];
  char* line = small;
  auto format = [&](char* out, size_t n) {
    if (v.kind == print_message) return std::snprintf(out, n, "msg='%s' %s\n", msg, where_);
    if (!buffer) return std::snprintf(out, n, "msg='%s' %s: dtype=%s value=%s\n", msg, where_, v.dtype, value);
    return std::snprintf(out, n, "msg='%s' %s: buffer=%s, index=%lld, dtype=%s value=%s\n", msg, where_, buffer,
                         static_cast<long long>(index), v.dtype, value);
  };
  int n = format(small, sizeof small);
  if (n < 0) return;
  if (static_cast<size_t>(n) >= sizeof small) {  // a long message
    line = static_cast<char*>(std::malloc(static_cast<size_t>(n) + 1));
    if (!line) return;
    format(line, static_cast<size_t>(n) + 1);
  }
  print_line(w, line, static_cast<size_t>(n));
  if (line != small) std::free(line);
}

// ---------------------------------------------------------------- instrumentation

namespace {

struct instrument_config {
  imode mode;
  void* data;  // counters: the rows to fill; racecheck: float_atomic_magnitudes or null
  uint64_t seed;
};
instrument_config g_instrument{imode::none, nullptr, 0};

// Decodes an IEEE half (binary16) without relying on the compiler's _Float16 support.
float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
  } else if (exp == 31) {
    v = mant ? __builtin_nanf("") : __builtin_inff();
  } else {
    const uint32_t bits = ((exp + 112u) << 23) | (mant << 13);
    std::memcpy(&v, &bits, sizeof v);
  }
  return sign ? -v : v;
}

void count_simd_op(worker& w, const char* op) {
  if (std::strcmp(op, "matmul2d::run") == 0) ++w.counts[c_matmul2d_16x32x16];
  else if (std::strcmp(op, "simdgroup_multiply_accumulate") == 0) ++w.counts[c_simdgroup_multiply_accumulate_8x8x8];
  else if (std::strcmp(op, "simdgroup_multiply") == 0) ++w.counts[c_simdgroup_multiply_8x8x8];
  else if (std::strcmp(op, "simdgroup_barrier") == 0) ++w.counts[c_simdgroup_barriers];
  else ++w.counts[c_simd_collectives];
}

void describe_thread(const launch_state& L, uint32_t group, uint32_t thread, char* out, size_t n) {
  const uint32_t* gr = L.p->grid;
  const uint32_t* b = L.p->block;
  std::snprintf(out, n, "threadgroup (%u,%u,%u) thread (%u,%u,%u) [simdgroup %u, lane %u]", group % gr[0],
                (group / gr[0]) % gr[1], group / (gr[0] * gr[1]), thread % b[0], (thread / b[0]) % b[1],
                thread / (b[0] * b[1]), thread / kSimdWidth, thread % kSimdWidth);
}

const char* space_name(space_kind k) {
  return k == space_kind::device_memory ? "device buffer" : k == space_kind::threadgroup_memory ? "threadgroup array" : "thread array";
}

// The first race of the launch is reported (the run goes on, so the outputs are complete).
void report_race(worker& w, const access& a, int64_t element, const who& other, const who& me) {
  launch_state* L = w.L;
  if (L->has_race) return;
  char first[160], second[160];
  describe_thread(*L, other.group1 - 1, other.thread, first, sizeof first);
  describe_thread(*L, me.group1 - 1, me.thread, second, sizeof second);
  auto kind = [](const who& x) {
    return (x.bits & who_atomic) ? ((x.bits & who_write) ? "atomic write" : "atomic read")
                                 : ((x.bits & who_write) ? "write" : "read");
  };
  const char* why = other.group1 != me.group1 ? "different threadgroups are not ordered within a launch"
                    : a.kind == space_kind::device_memory
                        ? "no threadgroup_barrier(mem_flags::mem_device) between them"
                        : "no threadgroup_barrier(mem_flags::mem_threadgroup) between them";
  std::snprintf(L->race, sizeof L->race, "data race on %s '%s' element %lld: %s by %s, then %s by %s; %s",
                space_name(a.kind), a.name, static_cast<long long>(element), kind(other), first, kind(me), second,
                why);
  L->has_race = true;
}

void report_uninitialized(worker& w, const access& a, int64_t element) {
  launch_state* L = w.L;
  if (L->has_race) return;
  char me[160];
  describe_thread(*L, static_cast<uint32_t>(w.group), w.cur->index, me, sizeof me);
  std::snprintf(L->race, sizeof L->race, "uninitialized read of %s '%s' element %lld by %s (never written before)",
                space_name(a.kind), a.name, static_cast<long long>(element), me);
  L->has_race = true;
}

// A read through pool view `a` of bytes that another view wrote last: the storage planner gave this
// buffer the bytes of one it considered dead, so the value read is that buffer's leftover.
void report_read_of_other_view(worker& w, const access& a, int64_t element, const char* writer) {
  launch_state* L = w.L;
  if (L->has_race) return;
  char me[160];
  describe_thread(*L, static_cast<uint32_t>(w.group), w.cur->index, me, sizeof me);
  std::snprintf(L->race, sizeof L->race,
                "uninitialized read of %s '%s' element %lld by %s (never written through '%s' before: its bytes in the "
                "merged threadgroup pool hold what '%s' wrote, a buffer the shared-memory planner placed there too)",
                space_name(a.kind), a.name, static_cast<long long>(element), me, a.name, writer ? writer : "?");
  L->has_race = true;
}

// A store to device / threadgroup memory after a read of an unwritten thread-array element.
void report_uninitialized_value(worker& w, const access& store, int64_t element) {
  launch_state* L = w.L;
  fiber_t* f = w.cur;
  if (L->has_race) return;
  char me[160];
  describe_thread(*L, static_cast<uint32_t>(w.group), f->index, me, sizeof me);
  std::snprintf(L->race, sizeof L->race,
                "uninitialized read of thread array '%s' element %lld by %s (%s); the value can reach %s '%s' element "
                "%lld, stored next",
                f->taint_name, static_cast<long long>(f->taint_index), me,
                f->taint_derived ? "it holds a value computed from an uninitialized read" : "never written before",
                space_name(store.kind), store.name, static_cast<long long>(element));
  L->has_race = true;
}

inline bool unordered(const who& o, const who& me) {
  if (o.group1 != me.group1) return true;  // other threadgroup: never ordered
  return o.thread != me.thread && o.epoch == me.epoch;
}

// Two unordered accesses conflict when one writes, unless both are atomic (MSL's atomics never race
// with each other; a plain access racing with an atomic write does).
inline bool conflicts(const who& o, const who& me) {
  return o.group1 != 0 && unordered(o, me) && ((o.bits | me.bits) & who_write) &&
         !((o.bits & me.bits) & who_atomic);
}

// Can `me` stand in for the earlier access `o` in every later comparison? Yes when `o` is ordered
// before every later access of the threadgroup that `me` is not (same thread, or an earlier epoch of
// the threadgroup: all its threads passed the barrier since) and `me` conflicts with everything `o`
// does: it writes if `o` wrote, and it is plain if `o` was.
inline bool covers(const who& me, const who& o) {
  if (o.group1 != me.group1 || (o.thread != me.thread && o.epoch == me.epoch)) return false;
  if ((o.bits & who_write) && !(me.bits & who_write)) return false;
  return !(me.bits & who_atomic) || (o.bits & who_atomic);
}

// Returns false when the cell shows a race (reported once per access).
bool check_cell(worker& w, shadow_cell& c, const access& a, int64_t element, const who& me) {
  for (const who& o : c.s) {
    if (conflicts(o, me)) {
      report_race(w, a, element, o, me);
      return false;
    }
  }
  // Record `me`: in place of the accesses it covers, else in a free slot. With no room it is
  // dropped: the slots then hold three accesses no later one is ordered after.
  int free_slot = -1;
  bool placed = false;
  for (int i = 0; i < kShadowSlots; ++i) {
    who& o = c.s[i];
    if (o.group1 == 0) {
      if (free_slot < 0) free_slot = i;
    } else if (covers(me, o)) {
      if (placed) o = who{0, 0, 0, 0};
      else o = me, placed = true;
    }
  }
  if (!placed && free_slot >= 0) c.s[free_slot] = me;
  return true;
}

inline bool ever_written(const shadow_cell& c) {
  for (const who& o : c.s)
    if (o.group1 != 0 && (o.bits & who_write)) return true;
  return false;
}

// `reads`: the access reads the old value (everything but a plain or atomic store).
void race_access(worker& w, const access& a, bool reads) {
  launch_state* L = w.L;
  fiber_t* f = w.cur;
  const bool store = (a.flags & access_store) != 0;
  if (a.kind == space_kind::thread_memory) {
    // Thread arrays are registers: reading an unwritten element is reported only when a store to
    // device or threadgroup memory follows (lanes outside a layout compute with garbage that no one
    // stores, e.g. TVM's allreduce). Written flags: 0 never, 1 written, 2 written with a value
    // computed after an uninitialized read. A shuffle operand is the lane's contribution, which
    // its own result does not depend on (whether another lane uses it is not tracked).
    if (!a.init) return;
    if (store) {
      const uint8_t flag = f->taint_name ? 2 : 1;
      for (uint32_t j = 0; j < a.lanes; ++j) a.init[j] = flag;
      f->taint_name = nullptr;
      return;
    }
    if (a.flags & access_shuffled) return;
    for (uint32_t j = 0; j < a.lanes; ++j) {
      if (a.init[j] != 1 && !f->taint_name) {
        f->taint_name = a.name;
        f->taint_index = a.index + j;
        f->taint_derived = a.init[j] == 2;
      }
    }
    return;
  }
  if (store && f->taint_name) {
    report_uninitialized_value(w, a, a.index);
    f->taint_name = nullptr;
    return;
  }
  const uint8_t bits = static_cast<uint8_t>((store ? who_write : 0) | ((a.flags & access_atomic) ? who_atomic : 0));
  who me{static_cast<uint32_t>(w.group + 1), 0, static_cast<uint16_t>(f->index), bits};
  if (a.kind == space_kind::device_memory) {
    if (a.buf < 0 || a.buf >= static_cast<int32_t>(kMaxBuffers) || a.elem_bytes == 0) return;
    shadow_cell*& sh = L->dev_shadow[a.buf];
    const int64_t count = L->p->counts[a.buf];
    if (!sh) {
      sh = alloc_array<shadow_cell>(static_cast<size_t>(count > 0 ? count : 1));
      if (!sh) return;
    }
    me.epoch = f->dev_epoch;
    const int64_t e0 = (static_cast<const char*>(a.addr) - static_cast<const char*>(L->p->buffers[a.buf])) / a.elem_bytes;
    for (uint32_t j = 0; j < a.lanes; ++j) {
      if (e0 + j < 0 || e0 + j >= count) continue;
      if (!check_cell(w, sh[e0 + j], a, a.index + j, me)) return;
    }
    return;
  }
  // threadgroup memory: one cell per byte (views of a pool may have different element types). Per
  // byte also the pool view that wrote it last: reading through another view (both tracked) reads
  // a dead buffer's leftovers, however initialized the bytes are.
  me.epoch = f->tg_epoch;
  const int64_t off = static_cast<const unsigned char*>(a.addr) - w.arena;
  const uint16_t view = a.view < kMaxTrackedViews ? a.view : 0;
  if (store && view) w.view_names[view] = a.name;
  for (uint32_t j = 0; j < a.lanes; ++j) {
    for (uint32_t b = 0; b < a.elem_bytes; ++b) {
      const int64_t byte = off + static_cast<int64_t>(j) * a.elem_bytes + b;
      if (byte < 0 || static_cast<uint64_t>(byte) >= L->p->threadgroup_limit) continue;
      shadow_cell& c = w.tg_shadow[byte];
      if (reads && !ever_written(c)) {
        report_uninitialized(w, a, a.index + j);
        return;
      }
      const uint16_t writer = w.tg_writer[byte];
      if (reads && view && writer && writer != view) {
        report_read_of_other_view(w, a, a.index + j, w.view_names[writer]);
        return;
      }
      if (!check_cell(w, c, a, a.index + j, me)) return;
      if (store) w.tg_writer[byte] = view;
    }
  }
}


// One counted access of `bytes` bytes (counters): plugin kernels' marked accesses and foreign
// kernels' traced ones. Thread memory is not counted.
// The widest access one Apple GPU load or store instruction makes per thread: 4 components of 32 bits
// (Dougall Johnson, Apple G13 GPU Architecture Reference: device_load / device_store). A wider
// access in the source (a 32-byte struct copy, as MLX's BlockLoader makes) is that many instructions.
constexpr uint64_t widest_access_bytes = 16;

inline void count_memory(worker& w, space_kind kind, uint64_t bytes, bool store, bool predicated) noexcept {
  const uint64_t ops = bytes <= widest_access_bytes ? 1 : (bytes + widest_access_bytes - 1) / widest_access_bytes;
  if (kind == space_kind::device_memory) {
    if (store) {
      w.counts[c_device_store_instructions] += ops;
      w.counts[c_device_store_bytes] += bytes;
      w.counts[c_predicated_device_stores] += predicated ? ops : 0;
    } else {
      w.counts[c_device_load_instructions] += ops;
      w.counts[c_device_load_bytes] += bytes;
      w.counts[c_predicated_device_loads] += predicated ? ops : 0;
      w.counts[c_narrow_device_loads] += bytes <= 2;
    }
  } else if (kind == space_kind::threadgroup_memory) {
    if (store) {
      w.counts[c_threadgroup_store_instructions] += ops;
      w.counts[c_threadgroup_store_bytes] += bytes;
    } else {
      w.counts[c_threadgroup_load_instructions] += ops;
      w.counts[c_threadgroup_load_bytes] += bytes;
    }
  }
}
}  // namespace

void on_access(const access& a) noexcept {
  worker& w = *tl_w;
  if (w.L->mode == imode::racecheck) {
    race_access(w, a, (a.flags & access_store) == 0);
    return;
  }
  if (w.L->mode != imode::counters) return;
  const bool predicated = (a.flags & access_predicated) != 0 || w.cur->pred_depth > 0;
  const uint64_t bytes = static_cast<uint64_t>(a.lanes) * a.elem_bytes;
  count_memory(w, a.kind, bytes, (a.flags & access_store) != 0, predicated);
  const uintptr_t origin = reinterpret_cast<uintptr_t>(a.addr) - static_cast<uintptr_t>(a.index) * a.elem_bytes;
  gpu_access(w, a.kind, a.addr, bytes, (a.flags & access_store) != 0, a.site, origin, static_cast<uint32_t>(a.buf));
}

namespace {
// Counts one traced access (foreign counters) where it lands: a traced device buffer of the launch
// or the running threadgroup's threadgroup memory; anything else (thread memory, the stack, the
// shim's scratch, constant-space arguments) is not memory traffic the counters describe.
inline void count_traced(worker& w, const void* addr, uint64_t bytes, bool store, const void* site) noexcept {
  const char* p = static_cast<const char*>(addr);
  const unsigned char* a = reinterpret_cast<const unsigned char*>(addr);
  if (a >= w.arena && a < w.arena + w.arena_used) {
    count_memory(w, space_kind::threadgroup_memory, bytes, store, false);
    return gpu_access(w, space_kind::threadgroup_memory, addr, bytes, store, site, 0, 0);
  }
  const launch_params& lp = *w.L->p;
  for (uint32_t i = 0; i < lp.nguards; ++i) {
    const guard_region& g = lp.guards[i];
    if (g.traced && p >= g.data && p < g.data + g.bytes) {
      count_memory(w, space_kind::device_memory, bytes, store, false);
      return gpu_access(w, space_kind::device_memory, addr, bytes, store, site, reinterpret_cast<uintptr_t>(g.data), i);
    }
  }
}

// The worker running a kernel fiber in counters mode, or null (tracing hooks also fire outside
// launches: the driver's tlm_param_info runs instrumented code from Python).
inline worker* tracing_worker() noexcept {
  worker* w = tl_w;
  return w && w->cur && w->L->mode == imode::counters ? w : nullptr;
}

inline void traced_hook(const void* addr, uint64_t bytes, bool store, const void* site) noexcept {
  if (bytes == 0) return;  // an empty memcpy / memset
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  bool inside = a - g_trace.arenas < g_trace.arenas_bytes;
  for (uint32_t i = 0; !inside && i < g_trace.nguards; ++i) {
    const guard_region& g = g_trace.guards[i];
    inside = g.traced && a - reinterpret_cast<uintptr_t>(g.data) < g.bytes;
  }
  if (!inside) return;
  worker* w = tracing_worker();
  if (w && w->cur->quiet == 0) count_traced(*w, addr, bytes, store, site);
}
}  // namespace

void traced_access(const void* addr, uint64_t bytes, bool store, const void* site) noexcept {
  if (worker* w = tracing_worker()) count_traced(*w, addr, bytes, store, site ? site : __builtin_return_address(0));
}

void trace_quiet(int delta) noexcept {
  if (worker* w = tracing_worker()) w->cur->quiet += static_cast<uint32_t>(delta);
}

void atomic_target(const access& a) noexcept {
  worker& w = *tl_w;
  w.cur->atomic = a;
}

void on_atomic_access(const void* addr, size_t bytes, unsigned kind) noexcept {
  worker& w = *tl_w;
  if (w.L->mode != imode::racecheck) return;
  access a = w.cur->atomic;
  const char* lo = static_cast<const char*>(a.addr);
  const char* p = static_cast<const char*>(addr);
  // Only through a pointer formed by an atomic cast of a checked buffer / array (the printer's only
  // form); anything else names no memory the checker tracks.
  if (!lo || p < lo || p + bytes > lo + static_cast<size_t>(a.lanes) * a.elem_bytes) return;
  a.flags = static_cast<uint8_t>(access_atomic | (kind == atomic_load ? 0 : access_store));
  race_access(w, a, kind != atomic_store);
}

void on_atomic_value(const void* addr, size_t bytes, const void* bits) noexcept {
  worker& w = *tl_w;
  const launch_state* L = w.L;
  if (L->mode != imode::racecheck || !L->magnitudes) return;
  const access& a = w.cur->atomic;
  if (a.kind != space_kind::device_memory || a.buf < 0 || a.buf >= static_cast<int32_t>(kMagnitudeBuffers)) return;
  double* sum = L->magnitudes->sum_abs[a.buf];
  const uint8_t type = L->magnitudes->elem_type[a.buf];
  if (!sum || type == magnitude_none) return;
  // The value may cover several elements (a 16-bit float's compare-and-swap works on its 32-bit
  // word): each gets the magnitude of its own part, which only loosens the neighbour's bound.
  const size_t elem = type == magnitude_float ? 4 : 2;
  const int64_t off = static_cast<const char*>(addr) - static_cast<const char*>(L->p->buffers[a.buf]);
  const int64_t count = L->p->counts[a.buf];
  if (off < 0 || off % static_cast<int64_t>(elem) != 0) return;
  for (size_t j = 0; j * elem < bytes; ++j) {
    const int64_t e = off / static_cast<int64_t>(elem) + static_cast<int64_t>(j);
    if (e >= count) break;
    const unsigned char* p = static_cast<const unsigned char*>(bits) + j * elem;
    float v;
    if (type == magnitude_float) {
      std::memcpy(&v, p, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      if (type == magnitude_half) {
        v = half_bits_to_float(h);
      } else {
        const uint32_t b = static_cast<uint32_t>(h) << 16;
        std::memcpy(&v, &b, 4);
      }
    }
    if (__builtin_isfinite(v)) sum[e] += __builtin_fabs(static_cast<double>(v));
  }
}

void predicate_enter() noexcept { ++tl_w->cur->pred_depth; }
void predicate_exit() noexcept { --tl_w->cur->pred_depth; }

void threadgroup_barrier_flags(unsigned mem_flags) noexcept {
  tl_w->bar_flags = mem_flags | kBarFlagsKnown;
  threadgroup_barrier();
  fiber_t* f = tl_w->cur;
  if (mem_flags & 2u) ++f->tg_epoch;   // mem_threadgroup
  if (mem_flags & 1u) ++f->dev_epoch;  // mem_device
}

void threadgroup_barrier() noexcept {
  worker& w = *tl_w;
  fiber_t* f = w.cur;
  if (w.gpu) gpu_sync(w, f->index, true);
  if (++w.bar_arrived == w.L->nthreads) {
    // Last arrival: everyone else becomes runnable, in arrival order; the caller goes on.
    w.bar_arrived = 0;
    ++w.counts[c_threadgroup_barriers];
    // mem_none only keeps the threads in step; without flags (plain builds) a barrier is counted as
    // ordering memory.
    const bool lockstep = (w.bar_flags & kBarFlagsKnown) && (w.bar_flags & ~kBarFlagsKnown) == 0;
    ++w.counts[lockstep ? c_lockstep_barriers : c_memory_barriers];
    w.bar_flags = 0;
    for (uint32_t i = 0, n = w.L->nthreads - 1; i < n; ++i) rq_push(w, w.bar_waiters[i]);
    return;
  }
  w.bar_waiters[w.bar_arrived - 1] = f->index;
  f->state = fstate::at_barrier;
  block(w);
}

void* simd_deposit(const char* op) noexcept {
  worker& w = *tl_w;
  fiber_t* f = w.cur;
  if (w.gpu) gpu_sync(w, f->index, false);
  simd_state& s = w.simd[f->info.simd_group];
  if (s.arrived == 0) {
    s.op = op;
  } else if (s.op != op && std::strcmp(s.op, op) != 0) {
    char b[kMessage];
    std::snprintf(b, sizeof b,
                  "divergent simd collective: %u of %u lanes of simdgroup %u of threadgroup (%u,%u,%u) reached %s; "
                  "lane %u (thread %u) reached %s",
                  s.arrived, s.size, f->info.simd_group, w.tg[0], w.tg[1], w.tg[2], s.op, f->info.lane, f->index, op);
    record_error(w.L, w.group, b);
    abandon(w);
  }
  return s.buf[s.round & 1];
}

const void* simd_arrive() noexcept {
  worker& w = *tl_w;
  fiber_t* f = w.cur;
  simd_state& s = w.simd[f->info.simd_group];
  const uint32_t round = s.round;
  if (++s.arrived == s.size) {
    s.arrived = 0;
    ++s.round;
    if (w.L->mode == imode::counters) count_simd_op(w, s.op);
    for (uint32_t i = 0; i < s.nwait; ++i) rq_push(w, s.waiters[i]);
    s.nwait = 0;
  } else {
    s.waiters[s.nwait++] = f->index;
    f->state = fstate::at_simd;
    block(w);
  }
  return s.buf[round & 1];
}

void fatal(const char* message) noexcept {
  worker& w = *tl_w;
  char pos[200], b[kMessage];
  where(w, w.cur->info, pos, sizeof pos);
  std::snprintf(b, sizeof b, "%s (%s)", message, pos);
  record_error(w.L, w.group, b);
  abandon(w);
}

void* out_of_bounds(const char* space, const char* name, int64_t index, int64_t lanes, int64_t extent) noexcept {
  worker& w = *tl_w;
  char pos[200], b[kMessage], what[64];
  where(w, w.cur->info, pos, sizeof pos);
  if (lanes > 1) std::snprintf(what, sizeof what, "%lld-element vector at ", static_cast<long long>(lanes));
  else what[0] = 0;
  std::snprintf(b, sizeof b, "out-of-bounds access to %s '%s': %selement index %lld, buffer extent %lld elements; %s",
                space, name, what, static_cast<long long>(index), static_cast<long long>(extent), pos);
  record_error(w.L, w.group, b);
  return w.oob_scratch;
}

void misaligned(const char* space, const char* name, int64_t index, int64_t lanes) noexcept {
  worker& w = *tl_w;
  char pos[200], b[kMessage];
  where(w, w.cur->info, pos, sizeof pos);
  std::snprintf(b, sizeof b,
                "misaligned vector access to %s '%s': %lld-element vector at element index %lld (MSL needs a multiple "
                "of %lld); %s",
                space, name, static_cast<long long>(lanes), static_cast<long long>(index),
                static_cast<long long>(lanes), pos);
  record_error(w.L, w.group, b);
}

void* threadgroup_slot(uint32_t slot, uint64_t bytes) noexcept {
  worker& w = *tl_w;
  if (slot >= kMaxSlots) fatal("too many threadgroup arrays");
  if (w.slot_off[slot] < 0) {
    // First execution of this declaration on this worker: bump-allocate, 16-byte aligned like Metal.
    // (Declaration order is the same for every threadgroup, so the layout is too.)
    size_t off = (w.arena_used + 15) & ~static_cast<size_t>(15);
    if (off + bytes > w.L->p->threadgroup_limit || off + bytes > kArenaCapacity) {
      char b[200];
      std::snprintf(b, sizeof b, "threadgroup memory of %llu bytes exceeds the limit of %llu bytes",
                    static_cast<unsigned long long>(off + bytes),
                    static_cast<unsigned long long>(w.L->p->threadgroup_limit));
      fatal(b);
    }
    if (off + bytes > kInitialPoison) std::memset(w.arena + w.arena_used, 0xff, off + bytes - w.arena_used);
    w.slot_off[slot] = static_cast<int64_t>(off);
    w.slot_bytes[slot] = bytes;
    w.arena_used = off + bytes;
  } else if (w.slot_bytes[slot] != bytes) {
    fatal("threadgroup array declared with different sizes");
  }
  return w.arena + w.slot_off[slot];
}

int launch(const launch_params& p) noexcept {
  auto fail = [&](const char* m) {
    if (p.error && p.error_len) std::snprintf(p.error, p.error_len, "%s", m);
    return 1;
  };
  const uint64_t nthreads = static_cast<uint64_t>(p.block[0]) * p.block[1] * p.block[2];
  if (nthreads == 0 || nthreads > kMaxThreads) return fail("threadgroup size must be 1..1024 threads");
  launch_state* L = new (std::nothrow) launch_state;
  if (!L) return fail("emulator: out of memory");
  L->p = &p;
  L->nthreads = static_cast<uint32_t>(nthreads);
  L->nsimd = (L->nthreads + kSimdWidth - 1) / kSimdWidth;
  L->ngroups = static_cast<uint64_t>(p.grid[0]) * p.grid[1] * p.grid[2];
  L->stack_bytes = p.stack_bytes ? p.stack_bytes : 256 * 1024;
  L->mode = g_instrument.mode;
  L->seed = g_instrument.seed;
  L->counters = L->mode == imode::counters ? static_cast<uint64_t*>(g_instrument.data) : nullptr;
  L->magnitudes = L->mode == imode::racecheck ? static_cast<const float_atomic_magnitudes*>(g_instrument.data) : nullptr;
  uint64_t nworkers = p.workers > 0 ? static_cast<uint64_t>(p.workers) : 1;
  if (L->mode == imode::racecheck) {
    // One worker (the shadow state is not shared between OS threads), threadgroups in seeded order.
    nworkers = 1;
    L->order = alloc_array<uint64_t>(L->ngroups ? L->ngroups : 1);
    if (!L->order) {
      delete L;
      return fail("emulator: out of memory");
    }
    uint64_t x = g_instrument.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (uint64_t i = 0; i < L->ngroups; ++i) L->order[i] = i;
    for (uint64_t i = L->ngroups; i > 1; --i) {
      uint64_t j = next_random(x) % i;
      uint64_t t = L->order[i - 1];
      L->order[i - 1] = L->order[j];
      L->order[j] = t;
    }
  }
  if (nworkers > L->ngroups) nworkers = L->ngroups ? L->ngroups : 1;
  worker* workers = static_cast<worker*>(std::aligned_alloc(64, sizeof(worker) * nworkers));
  worker_arg* args = alloc_array<worker_arg>(nworkers);
  pthread_t* threads = alloc_array<pthread_t>(nworkers);
  bool* started = alloc_array<bool>(nworkers);
  if (!workers || !args || !threads || !started) {
    std::free(workers), std::free(args), std::free(threads), std::free(started);
    delete L;
    return fail("emulator: out of memory");
  }
  std::memset(static_cast<void*>(workers), 0, sizeof(worker) * nworkers);
  unsigned char* arenas = nullptr;
  // foreign kernels' counters launches (device buffers in a guard table): the traced build's hooks read g_trace
  if (L->mode == imode::counters && p.guards) {
    arenas = static_cast<unsigned char*>(map_anon(nworkers * kArenaCapacity));
    if (!arenas) {  // without it nothing would count: an error, not zeros
      std::free(workers), std::free(args), std::free(threads), std::free(started);
      std::free(L->order);
      delete L;
      return fail("emulator: out of memory mapping threadgroup memory for the counters");
    }
  }
  for (uint64_t i = 0; i < nworkers; ++i) {
    args[i] = worker_arg{L, &workers[i]};
    workers[i].claim = UINT64_MAX;
    if (arenas) workers[i].arena = arenas + i * kArenaCapacity;
  }
  if (arenas) g_trace = trace_window{reinterpret_cast<uintptr_t>(arenas), nworkers * kArenaCapacity, p.guards, p.nguards};
  L->workers = workers;
  L->nworkers = nworkers;
  if (L->ngroups > 0) {
    guard_install();
    for (uint64_t i = 1; i < nworkers; ++i)  // fewer workers than asked is still correct
      started[i] = pthread_create(&threads[i], nullptr, worker_main, &args[i]) == 0;
    worker_main(&args[0]);  // the calling thread is worker 0
    for (uint64_t i = 1; i < nworkers; ++i)
      if (started[i]) pthread_join(threads[i], nullptr);
    guard_remove();
  }
  print_flush_rest(L);
  int rc = L->has_error ? fail(L->error) : 0;
  if (!L->has_error && L->has_race) {
    if (p.error && p.error_len) std::snprintf(p.error, p.error_len, "%s", L->race);
    rc = 2;  // a race or uninitialized read (racecheck)
  }
  if (arenas) {
    g_trace = trace_window{};
    munmap(arenas, nworkers * kArenaCapacity);
  }
  std::free(L->order);
  for (shadow_cell* sh : L->dev_shadow) std::free(sh);
  std::free(workers), std::free(args), std::free(threads), std::free(started);
  pthread_mutex_destroy(&L->mu);
  pthread_mutex_destroy(&L->print_mu);
  delete L;
  return rc;
}

}  // namespace tlm::rt

extern "C" __attribute__((visibility("default"))) const char* tlm_runtime_fibers() { return tlm::fiber::flavour(); }

// Instrumentation of the next launch of this library: mode 0 none, 1 counters (`data`: one row of
// c_counter_count per threadgroup), 2 racecheck with schedule `seed` (`data`: a
// float_atomic_magnitudes to sum float atomic values into, or null).
extern "C" __attribute__((visibility("default"))) void tlm_instrument(int mode, void* data, uint64_t seed) {
  tlm::rt::g_instrument = tlm::rt::instrument_config{static_cast<tlm::rt::imode>(mode), data, seed};
}

// Memory tracing of foreign kernels' counters flavour (foreign.py builds it with clang's
// -fsanitize=thread instrumentation, at -O0, without atomics and function entry/exit): the
// instrumentation calls these for every load and store the kernel's source makes (by value: one
// call per scalar or whole vector / struct read or written) and for memcpy / memmove / memset (struct
// copies). No thread sanitizer runtime is linked: these are the only definitions.
#define TLM_TRACE_SIZE(n)                                                                                          \
  extern "C" void __tsan_read##n(void* p) { tlm::rt::traced_hook(p, n, false, __builtin_return_address(0)); }                                  \
  extern "C" void __tsan_write##n(void* p) { tlm::rt::traced_hook(p, n, true, __builtin_return_address(0)); }                                  \
  extern "C" void __tsan_unaligned_read##n(void* p) { tlm::rt::traced_hook(p, n, false, __builtin_return_address(0)); }                        \
  extern "C" void __tsan_unaligned_write##n(void* p) { tlm::rt::traced_hook(p, n, true, __builtin_return_address(0)); }                        \
  extern "C" void __tsan_volatile_read##n(void* p) { tlm::rt::traced_hook(p, n, false, __builtin_return_address(0)); }                         \
  extern "C" void __tsan_volatile_write##n(void* p) { tlm::rt::traced_hook(p, n, true, __builtin_return_address(0)); }                         \
  extern "C" void __tsan_unaligned_volatile_read##n(void* p) { tlm::rt::traced_hook(p, n, false, __builtin_return_address(0)); }               \
  extern "C" void __tsan_unaligned_volatile_write##n(void* p) { tlm::rt::traced_hook(p, n, true, __builtin_return_address(0)); }
TLM_TRACE_SIZE(1)
TLM_TRACE_SIZE(2)
TLM_TRACE_SIZE(4)
TLM_TRACE_SIZE(8)
TLM_TRACE_SIZE(16)
#undef TLM_TRACE_SIZE
extern "C" void __tsan_read_range(void* p, unsigned long n) { tlm::rt::traced_hook(p, n, false, __builtin_return_address(0)); }
extern "C" void __tsan_write_range(void* p, unsigned long n) { tlm::rt::traced_hook(p, n, true, __builtin_return_address(0)); }
extern "C" void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
  tlm::rt::traced_hook(s, n, false, __builtin_return_address(0));
  tlm::rt::traced_hook(d, n, true, __builtin_return_address(0));
  return std::memcpy(d, s, n);
}
extern "C" void* __tsan_memmove(void* d, const void* s, unsigned long n) {
  tlm::rt::traced_hook(s, n, false, __builtin_return_address(0));
  tlm::rt::traced_hook(d, n, true, __builtin_return_address(0));
  return std::memmove(d, s, n);
}
extern "C" void* __tsan_memset(void* d, int c, unsigned long n) {
  tlm::rt::traced_hook(d, n, true, __builtin_return_address(0));
  return std::memset(d, c, n);
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_ignore_thread_begin() {}
extern "C" void __tsan_ignore_thread_end() {}
