// T.print: the device functions TileLang's print macros call (tilelang/cuda/language/print.py),
// `debug_print_var(msg, value)`, `debug_print_buffer_value(msg, buffer_name, index, value)` and
// `debug_print_msg(msg)`. The value goes to the runtime as a tagged scalar; the runtime formats
// the line (docs/emulator.md, "T.print") and orders the output of concurrent threadgroups.
#pragma once

#include "runtime_api.h"
#include "scalar.h"

namespace tlm {

template <class T> struct print_type {
  static constexpr bool known = false;
};
#define TLM_PRINT_TYPE(TYPE, NAME, KIND)                       \
  template <> struct print_type<TYPE> {                        \
    static constexpr bool known = true;                        \
    static constexpr const char* name = NAME;                  \
    static constexpr rt::print_kind kind = rt::KIND;           \
  };
TLM_PRINT_TYPE(bool, "bool", print_boolean)
TLM_PRINT_TYPE(char, "char", print_signed)
TLM_PRINT_TYPE(signed char, "char", print_signed)
TLM_PRINT_TYPE(unsigned char, "uchar", print_unsigned)
TLM_PRINT_TYPE(short, "short", print_signed)
TLM_PRINT_TYPE(unsigned short, "ushort", print_unsigned)
TLM_PRINT_TYPE(int, "int", print_signed)
TLM_PRINT_TYPE(unsigned int, "uint", print_unsigned)
TLM_PRINT_TYPE(long, "long", print_signed)
TLM_PRINT_TYPE(unsigned long, "ulong", print_unsigned)
TLM_PRINT_TYPE(long long, "long", print_signed)
TLM_PRINT_TYPE(unsigned long long, "ulong", print_unsigned)
TLM_PRINT_TYPE(_Float16, "half", print_floating)
TLM_PRINT_TYPE(bfloat, "bfloat", print_floating)
TLM_PRINT_TYPE(float, "float", print_floating)
#undef TLM_PRINT_TYPE

template <class T> TLM_INLINE rt::print_value printable(T value) {
  using P = print_type<std::remove_cv_t<T>>;
  static_assert(P::known, "T.print: the emulator prints scalars of MSL's types only (bool, integers, half, bfloat, float)");
  rt::print_value v{P::kind, P::name, 0, 0, 0.0};
  if constexpr (P::kind == rt::print_signed) v.i = static_cast<int64_t>(value);
  else if constexpr (P::kind == rt::print_unsigned) v.u = static_cast<uint64_t>(value);
  else if constexpr (P::kind == rt::print_boolean) v.u = value ? 1 : 0;
  else v.f = static_cast<double>(static_cast<float>(value));
  return v;
}

}  // namespace tlm

template <class T> TLM_INLINE void debug_print_var(const char* msg, T value) {
  tlm::rt::debug_print(msg, nullptr, 0, tlm::printable(value));
}

template <class T> TLM_INLINE void debug_print_buffer_value(const char* msg, const char* buffer, int index, T value) {
  tlm::rt::debug_print(msg, buffer, index, tlm::printable(value));
}

TLM_INLINE void debug_print_msg(const char* msg) {
  tlm::rt::debug_print(msg, nullptr, 0, tlm::rt::print_value{tlm::rt::print_message, "", 0, 0, 0.0});
}
