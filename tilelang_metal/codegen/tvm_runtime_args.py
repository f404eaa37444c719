"""Scalar arguments in TVM's Metal runtime convention (`execution_backend="tvm_ffi"`).

TVM's Metal runtime (`src/runtime/metal/metal_module.mm`, `pack_args.h`) binds a kernel's buffers
at `[[ buffer(0..n-1) ]]` and copies every scalar argument, in parameter order, into one array of
8-byte slots that it passes with `setBytes` at `[[ buffer(n) ]]`. The value of a slot depends on the
type the function info declares for it: int32 / uint32 / float32 fill the slot's first 4 bytes,
int64 all 8. No other type is accepted by the runtime, so narrower integers and bool travel as
int32 (the host passes every integer as a 64-bit value, so the low bits are the value) and the
kernel casts them back. The kernel reads the slots through a struct with one 8-byte member per
scalar. Half / bfloat scalars would be rounded twice (double -> float -> half) and are refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import CodegenError
from .msl_types import msl_type

SLOT_BYTES = 8
ARGS_PARAM = "__tlm_args"  # the struct parameter's name in the kernel (the printer's namespace)


@dataclass(frozen=True)
class ArgSlot:
    """How one scalar parameter travels: the runtime's packing type and the struct member."""

    runtime_dtype: str  # the dtype in the FunctionInfo's arg_types (what the runtime packs)
    member_type: str  # MSL type of the struct member
    wide: bool  # True: one 64-bit member; False: `T name[2]`, the value in element 0


_SLOTS = {
    "int32": ArgSlot("int32", "int", False),
    "uint32": ArgSlot("uint32", "uint", False),
    "float32": ArgSlot("float32", "float", False),
    "int64": ArgSlot("int64", "long", True),
    "uint64": ArgSlot("int64", "ulong", True),  # packed as int64: the same 8 bytes
}
_NARROW_INTS = ("bool", "int8", "uint8", "int16", "uint16")  # as int32, cast back in the kernel


def arg_slot(dtype: str, param: str, kernel: str) -> ArgSlot:
    if dtype in _SLOTS:
        return _SLOTS[dtype]
    if dtype in _NARROW_INTS:
        return _SLOTS["int32"]
    if dtype in ("float16", "bfloat16"):
        raise CodegenError(
            f"kernel {kernel}: scalar parameter {param} is {dtype}, which TVM's Metal runtime passes only as float32 "
            f"(execution_backend='tvm_ffi'); declare {param} as T.float32 and cast it in the kernel, or use execution_backend='torch'"
        )
    raise CodegenError(f"kernel {kernel}: scalar parameter {param} has dtype {dtype}, which TVM's Metal runtime cannot pass")


def struct_name(kernel: str) -> str:
    return f"__tlm_{kernel}_args"


def struct_definition(kernel: str, members: list[tuple[str, ArgSlot]]) -> str:
    lines = [f"struct {struct_name(kernel)} {{  // TVM's Metal runtime: one 8-byte slot per scalar"]
    for name, slot in members:
        lines.append(f"  {slot.member_type} {name};" if slot.wide else f"  {slot.member_type} {name}[2];")
    return "\n".join(lines + ["};", ""])


def read_expression(name: str, dtype: str, slot: ArgSlot) -> str:
    """The scalar's value inside the kernel, of the parameter's own type."""
    member = f"{ARGS_PARAM}.{name}" if slot.wide else f"{ARGS_PARAM}.{name}[0]"
    return member if msl_type(dtype) == slot.member_type else f"(({msl_type(dtype)}){member})"


def pack_arguments(runtime_dtypes: list[str], values: list[int | float | bool]) -> bytes:
    """The bytes TVM's runtime passes for these scalars (PackFuncNonBufferArg: the host hands over
    integers as int64 and floats as float64; each slot takes the value converted to its type)."""
    out = b""
    for dtype, value in zip(runtime_dtypes, values, strict=True):
        if dtype == "float32":
            out += struct.pack("<f4x", float(value))
        else:
            bits = {"int32": 32, "uint32": 32, "int64": 64}[dtype]
            wrapped = int(value) & ((1 << bits) - 1)  # static_cast of the int64 the host passes
            out += wrapped.to_bytes(SLOT_BYTES if bits == 64 else 4, "little") + (b"" if bits == 64 else bytes(4))
    return out
