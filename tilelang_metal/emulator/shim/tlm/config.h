// tilelang_metal emulator shim: common configuration.
// The shim lets g++ compile the MSL subset described in docs/msl_contract.md as C++20.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

// Bumped whenever the shim's semantics change; part of every build-cache key.
#define TLM_SHIM_VERSION "1.6.0"

// MSL address spaces carry no meaning on the CPU: every pointer is a plain host pointer.
#define device
#define threadgroup
#define thread
#define constant

#define TLM_INLINE inline __attribute__((always_inline))
// The simdgroup collectives (matrix loads, stores, multiply-accumulates): one out-of-line copy per
// type instead of a body at every call site. A GEMM kernel holds hundreds of calls, and inlining them
// all made one build take up to 30 s at -O2; a call costs nothing next to the rendezvous inside.
#define TLM_OUTLINE __attribute__((noinline))

// Instrumented flavours (tilelang_metal/emulator/instrument.py): counters or race detection.
#if defined(TLM_COUNTERS) || defined(TLM_RACECHECK)
#define TLM_INSTRUMENTED 1
#endif

// Checked accesses (checked_ptr.h). Instrumented builds report every access to the runtime: out of
// line, the report's setup is one copy per type instead of one per access site (a racecheck build of
// an attention kernel: 17 s -> 4 s), and so is the building of the marked pointers each access goes
// through (`with_flags`, a thread array's `ptr()`: another attention kernel 7.7 s -> 2.7 s). Plain
// builds keep all of it inline.
#ifdef TLM_INSTRUMENTED
#define TLM_ACCESS TLM_OUTLINE
// Inside an out-of-line accessor: the kernel code that called it (the access's program point).
#define TLM_SITE() __builtin_return_address(0)
#else
#define TLM_ACCESS TLM_INLINE
#define TLM_SITE() nullptr
#endif
