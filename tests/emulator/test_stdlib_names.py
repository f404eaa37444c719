"""The shim defines what Metal's standard library defines, and nothing more: libm's global C names
(`expf`, `erff`, `log1pf`), which Apple's compiler rejects, fail in the emulator too; the
`metal_integer` bit counts exist for every integer width."""

from __future__ import annotations

import emu_msl_kernels as K
import pytest
import torch

from tilelang_metal.emulator import EmulatorCompileError, check_source, compile_kernel


def _unary_kernel(call: str, dtype: str = "float") -> str:
    return K.header("names") + (
        "[[kernel, max_total_threads_per_threadgroup(32)]] void names(\n"
        f"  device {dtype}* __restrict A [[ buffer(0) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        f"  A[((int)threadIdx.x)] = {call}(A[((int)threadIdx.x)]);\n"
        "}\n"
    )


@pytest.mark.parametrize("name", ["erff", "log1pf", "expf", "logf", "sqrtf", "tanf", "erf", "log1p", "expm1", "cbrt", "hypotf", "nearbyint", "std::exp"])
def test_c_library_names_do_not_compile(name):
    with pytest.raises(EmulatorCompileError):
        check_source(_unary_kernel(name))


@pytest.mark.parametrize("name", ["exp", "metal::exp", "precise::exp", "fast::exp", "log", "rint", "acosh", "asinh", "atanh", "metal::tan"])
def test_metal_names_compile(name):
    check_source(_unary_kernel(name))


BIT_TYPES = {"char": torch.int8, "uchar": torch.uint8, "short": torch.int16, "ushort": torch.uint16, "int": torch.int32, "uint": torch.uint32, "long": torch.int64, "ulong": torch.uint64}
BITS = {"char": 8, "uchar": 8, "short": 16, "ushort": 16, "int": 32, "uint": 32, "long": 64, "ulong": 64}


@pytest.mark.parametrize("msl_type", list(BIT_TYPES))
def test_bit_counts_for_every_integer_width(msl_type):
    bits = BITS[msl_type]
    src = K.header("bits") + (
        "[[kernel, max_total_threads_per_threadgroup(16)]] void bits(\n"
        f"  const device {msl_type}* __restrict X [[ buffer(0) ]],\n"
        f"  device {msl_type}* __restrict Y [[ buffer(1) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        "  int i = ((int)threadIdx.x);\n"
        "  Y[i] = popcount(X[i]);\n"
        "  Y[i + 16] = clz(X[i]);\n"
        "  Y[i + 32] = metal::ctz(X[i]);\n"
        "}\n"
    )
    k = compile_kernel(src)
    signed = not msl_type.startswith("u")
    raw = [0, 1, 2, 3, (1 << (bits - 1)), (1 << bits) - 1, 0x5A & ((1 << bits) - 1), 1 << (bits // 2)]
    raw += [(v * 2654435761 + 12345) & ((1 << bits) - 1) for v in range(8)]
    stored = [v - (1 << bits) if signed and v >= 1 << (bits - 1) else v for v in raw]
    dt = BIT_TYPES[msl_type]
    x = torch.tensor(stored, dtype=torch.int64).to(dt) if dt != torch.uint64 else torch.tensor(stored, dtype=torch.uint64)
    y = torch.zeros(48, dtype=dt)
    k.launch([x, y], (1, 1, 1), (16, 1, 1))
    want = [bin(u).count("1") for u in raw] + [bits - u.bit_length() for u in raw] + [bits if u == 0 else (u & -u).bit_length() - 1 for u in raw]
    assert [int(v) for v in y.tolist()] == want
