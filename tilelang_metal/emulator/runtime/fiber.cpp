// Fiber context switching; see fiber.h.
#undef _FORTIFY_SOURCE  // __longjmp_chk rejects jumps between stacks
#include "fiber.h"

#include <cstdint>
#include <cstdlib>

#ifdef TLM_NATIVE_FIBERS

extern "C" {
// tlm_fiber_swap(save, to): pushes the callee-saved registers, stores rsp into *save, loads `to`
// as the new rsp, pops the registers saved there and returns into that context.
__attribute__((visibility("hidden"))) void tlm_fiber_swap(void** save, void* to);
__attribute__((visibility("hidden"))) void tlm_fiber_start();
}

asm(R"(
  .text
  .globl tlm_fiber_swap
  .hidden tlm_fiber_swap
  .type tlm_fiber_swap, @function
  .p2align 4
tlm_fiber_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tlm_fiber_swap, .-tlm_fiber_swap

  .globl tlm_fiber_start
  .hidden tlm_fiber_start
  .type tlm_fiber_start, @function
  .p2align 4
tlm_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size tlm_fiber_start, .-tlm_fiber_start
)");

namespace tlm::fiber {

void prepare(context& ctx, char* stack_lo, size_t stack_size, entry_fn entry, void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + stack_size) & ~static_cast<uintptr_t>(15);
  // Frame popped by tlm_fiber_swap: r15 r14 r13 r12 rbx rbp, then the return address. After the
  // `ret`, rsp = top - 16, 16-byte aligned for tlm_fiber_start's call as the ABI requires.
  void** frame = reinterpret_cast<void**>(top - 72);
  frame[0] = nullptr;                                      // r15
  frame[1] = nullptr;                                      // r14
  frame[2] = reinterpret_cast<void*>(entry);               // r13
  frame[3] = arg;                                          // r12
  frame[4] = nullptr;                                      // rbx
  frame[5] = nullptr;                                      // rbp (ends backtraces)
  frame[6] = reinterpret_cast<void*>(&tlm_fiber_start);    // return address
  frame[7] = nullptr;
  frame[8] = nullptr;
  ctx.sp = frame;
}

void switch_to(context& from, context& to) { tlm_fiber_swap(&from.sp, to.sp); }

const char* flavour() { return "x86-64 asm"; }

}  // namespace tlm::fiber

#else  // portable: makecontext for the first entry, _setjmp/_longjmp afterwards

namespace tlm::fiber {
namespace {

struct start_info {
  context* ctx;
  entry_fn entry;
  void* arg;
  jmp_buf back;
};

thread_local start_info* tl_starting = nullptr;

void trampoline() {
  start_info* s = tl_starting;
  context* ctx = s->ctx;
  entry_fn entry = s->entry;
  void* arg = s->arg;
  // Park here: the first switch_to(.., *ctx) resumes right after this _setjmp.
  if (_setjmp(ctx->jb) == 0) _longjmp(s->back, 1);
  entry(arg);
  std::abort();  // entry must not return
}

}  // namespace

void prepare(context& ctx, char* stack_lo, size_t stack_size, entry_fn entry, void* arg) {
  ucontext_t uc;
  if (getcontext(&uc) != 0) std::abort();
  uc.uc_stack.ss_sp = stack_lo;
  uc.uc_stack.ss_size = stack_size;
  uc.uc_link = nullptr;
  makecontext(&uc, trampoline, 0);
  start_info s{&ctx, entry, arg, {}};
  tl_starting = &s;
  if (_setjmp(s.back) == 0) setcontext(&uc);
  tl_starting = nullptr;
}

void switch_to(context& from, context& to) {
  if (_setjmp(from.jb) == 0) _longjmp(to.jb, 1);
}

const char* flavour() { return "portable setjmp"; }

}  // namespace tlm::fiber

#endif
