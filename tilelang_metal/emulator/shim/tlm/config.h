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

// Instrumented flavours (tilelang_metal/emulator/instrument.py): counters or race detection.
#if defined(TLM_COUNTERS) || defined(TLM_RACECHECK)
#define TLM_INSTRUMENTED 1
#endif
