// Minimal stackful fibers for the emulator runtime.
//
// x86-64 uses a hand-written context switch (callee-saved registers + stack pointer, no syscalls).
// Elsewhere, or with TLM_PORTABLE_FIBERS, a fiber is entered once through makecontext/setcontext
// and afterwards switched with _setjmp/_longjmp (swapcontext would cost a signal-mask syscall per
// switch).
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(TLM_PORTABLE_FIBERS)
#define TLM_NATIVE_FIBERS 1
#else
#include <setjmp.h>
#include <ucontext.h>
#endif

namespace tlm::fiber {

using entry_fn = void (*)(void* arg);

struct context {
#ifdef TLM_NATIVE_FIBERS
  void* sp = nullptr;
#else
  jmp_buf jb;
#endif
};

// Prepares `ctx` so that the first switch to it calls entry(arg) on the given stack.
// `entry` must never return (it switches away for good instead).
void prepare(context& ctx, char* stack_lo, size_t stack_size, entry_fn entry, void* arg);

// Saves the running context into `from` and resumes `to`.
void switch_to(context& from, context& to);

const char* flavour();

}  // namespace tlm::fiber
