"""Scalar/vector types, conversions and math builtins of the shim, against torch."""

from __future__ import annotations

import math

import emu_msl_kernels as K
import pytest
import torch

from tilelang_metal.emulator import compile_kernel

# (MSL expression of float x, torch reference of float32 x)
FLOAT_FUNCS: list[tuple[str, object]] = [
    ("exp(x)", torch.exp),
    ("exp2(x)", torch.exp2),
    ("log((fabs(x) + 1.000000e+00f))", lambda x: torch.log(x.abs() + 1)),
    ("log2((fabs(x) + 1.000000e+00f))", lambda x: torch.log2(x.abs() + 1)),
    ("sqrt(fabs(x))", lambda x: x.abs().sqrt()),
    ("rsqrt((fabs(x) + 1.000000e+00f))", lambda x: torch.rsqrt(x.abs() + 1)),
    ("tanh(x)", torch.tanh),
    ("precise::tanh(x)", torch.tanh),
    ("precise::exp(x)", torch.exp),
    ("sin(x)", torch.sin),
    ("cos(x)", torch.cos),
    ("tan((x * 2.500000e-01f))", lambda x: torch.tan(x / 4)),
    ("abs(x)", torch.abs),
    ("max(x, 0.000000e+00f)", lambda x: x.clamp(min=0)),
    ("min(x, 5.000000e-01f)", lambda x: x.clamp(max=0.5)),
    ("fmax(x, -5.000000e-01f)", lambda x: x.clamp(min=-0.5)),
    ("fmin(x, 2.500000e-01f)", lambda x: x.clamp(max=0.25)),
    ("pow(fabs(x), 1.500000e+00f)", lambda x: x.abs() ** 1.5),
    ("floor((x * 3.000000e+00f))", lambda x: torch.floor(x * 3)),
    ("ceil((x * 3.000000e+00f))", lambda x: torch.ceil(x * 3)),
    ("round((x * 3.000000e+00f))", lambda x: torch.sign(x * 3) * torch.floor((x * 3).abs() + 0.5)),
    ("trunc((x * 3.000000e+00f))", lambda x: torch.trunc(x * 3)),
    ("fma(x, x, 1.000000e+00f)", lambda x: x * x + 1),
    ("select(x, -x, (x < 0.000000e+00f))", torch.abs),
    ("((float)isnan((x / 0.000000e+00f)))", lambda x: torch.isnan(x / 0).float()),
    ("((float)isinf((x / 0.000000e+00f)))", lambda x: torch.isinf(x / 0).float()),
    ("((float)half(x))", lambda x: x.half().float()),
    ("((float)bfloat(x))", lambda x: x.bfloat16().float()),
    ("((float)((half)x * (half)x))", lambda x: (x.half() * x.half()).float()),
    ("((float)exp((half)x))", lambda x: torch.exp(x.half().float()).half().float()),
    ("((float)max((bfloat)x, (bfloat)0.000000e+00f))", lambda x: x.bfloat16().float().clamp(min=0)),
    ("((float)(int)(x * 1.000000e+01f))", lambda x: torch.trunc(x * 10)),
]


def test_scalar_math_matches_torch():
    n = len(FLOAT_FUNCS)
    body = "  float x = X[((int)threadIdx.x)];\n" + "".join(
        f"  Y[((({i} * 64)) + ((int)threadIdx.x))] = {expr};\n" for i, (expr, _) in enumerate(FLOAT_FUNCS)
    )
    src = K.header("math_ops") + (
        "[[kernel, max_total_threads_per_threadgroup(64)]] void math_ops(\n"
        "  const device float* __restrict X [[ buffer(0) ]],\n"
        "  device float* __restrict Y [[ buffer(1) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n" + body + "}\n"
    )
    k = compile_kernel(src)
    x = torch.randn(64) * 2
    x[0], x[1] = 0.5, -2.5  # rounding half-way cases
    y = torch.zeros(n * 64)
    k.launch([x, y], (1, 1, 1), (64, 1, 1))
    y = y.view(n, 64)
    for i, (expr, ref) in enumerate(FLOAT_FUNCS):
        torch.testing.assert_close(y[i], ref(x), rtol=2e-6 if "half" not in expr else 1e-3, atol=1e-5, msg=expr)


def test_bfloat_conversion_rounds_to_nearest_even_and_canonicalises_nan():
    src = K.header("to_bfloat") + (
        "[[kernel, max_total_threads_per_threadgroup(64)]] void to_bfloat(\n"
        "  const device float* __restrict X [[ buffer(0) ]],\n"
        "  device bfloat* __restrict Y [[ buffer(1) ]],\n"
        "  device float* __restrict Z [[ buffer(2) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        "  Y[((int)threadIdx.x)] = bfloat(X[((int)threadIdx.x)]);\n"
        "  Z[((int)threadIdx.x)] = ((float)Y[((int)threadIdx.x)]);\n"
        "}\n"
    )
    k = compile_kernel(src)
    special = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 3.0e38, -3.4e38, math.inf, -math.inf, 0.0, -0.0, 1e-40]
    x = torch.cat([torch.tensor(special), torch.randn(64 - len(special) - 2) * 100])
    x = torch.cat([x, torch.tensor([float("nan")]), -torch.tensor([float("nan")])])
    bits = x.view(torch.int32)
    bits[-1] = 0x7F800001  # signalling NaN payload
    y = torch.zeros(64, dtype=torch.bfloat16)
    z = torch.zeros(64)
    k.launch([x, y, z], (1, 1, 1), (64, 1, 1))
    expected = x.to(torch.bfloat16).view(torch.int16)
    expected[-2:] = 0x7FC0
    assert torch.equal(y.view(torch.int16), expected)
    assert torch.equal(z[:-2], y.float()[:-2])
    assert z[-2:].isnan().all()


def test_vector_types_and_conversions():
    src = K.header("vectors") + (
        "[[kernel, max_total_threads_per_threadgroup(16)]] void vectors(\n"
        "  const device float* __restrict X [[ buffer(0) ]],\n"
        "  device half* __restrict H [[ buffer(1) ]],\n"
        "  device float* __restrict F [[ buffer(2) ]],\n"
        "  device int* __restrict I [[ buffer(3) ]],\n"
        "  device bfloat* __restrict BF [[ buffer(4) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        "  int t = ((int)threadIdx.x);\n"
        "  float4 v = *(const device float4*)(X + (t * 4));\n"
        "  float local[8];\n"
        "  *(thread float4*)(local + 4) = ((v * 2.000000e+00f) + 1.000000e+00f);\n"
        "  float4 w = *(thread float4*)(local + 4);\n"
        "  half4 h = half4(w);\n"
        "  *(device half4*)(H + (t * 4)) = (h - (half)1.000000e+00f);\n"
        "  float2 lo = float2(v.x, v.y);\n"
        "  float4 sw = float4(v.w, v.z, lo);\n"
        "  float4 mx = max(sw, v);\n"
        "  float4 sel = select(float4(0.000000e+00f), float4(1.000000e+00f), (v > 0.000000e+00f));\n"
        "  *(device float4*)(F + (t * 12)) = sw;\n"
        "  *(device float4*)(F + ((t * 12) + 4)) = mx;\n"
        "  *(device float4*)(F + ((t * 12) + 8)) = (sel + float4(bfloat4(v)));\n"
        "  int4 iv = int4((v * 1.000000e+01f));\n"
        "  int4 r = ((iv % 3) + (iv / 4));\n"
        "  *(device int4*)(I + (t * 4)) = r;\n"
        "  *(device bfloat2*)(BF + (t * 2)) = bfloat2(float2(v.x, v.y) * 3.000000e+00f);\n"
        "}\n"
    )
    k = compile_kernel(src)
    x = torch.randn(64)
    h = torch.zeros(64, dtype=torch.float16)
    f = torch.zeros(16 * 12)
    i = torch.zeros(64, dtype=torch.int32)
    bf = torch.zeros(32, dtype=torch.bfloat16)
    k.launch([x, h, f, i, bf], (1, 1, 1), (16, 1, 1))
    v = x.view(16, 4)
    torch.testing.assert_close(h.view(16, 4), (v * 2 + 1).half() - 1, rtol=0, atol=0)
    f = f.view(16, 3, 4)
    sw = torch.stack([v[:, 3], v[:, 2], v[:, 0], v[:, 1]], 1)
    assert torch.equal(f[:, 0], sw)
    assert torch.equal(f[:, 1], torch.maximum(sw, v))
    assert torch.equal(f[:, 2], (v > 0).float() + v.bfloat16().float())
    iv = torch.trunc(v * 10).int()
    assert torch.equal(i.view(16, 4), torch.fmod(iv, 3) + torch.div(iv, 4, rounding_mode="trunc"))
    assert torch.equal(bf.view(16, 2), (v[:, :2] * 3).bfloat16())


@pytest.mark.parametrize("dtype,msl", [(torch.int32, "int"), (torch.uint8, "uchar"), (torch.int16, "short"), (torch.float16, "half")])
def test_scalar_buffer_types(dtype, msl):
    src = K.header(f"copy_{msl}") + (
        f"[[kernel, max_total_threads_per_threadgroup(32)]] void copy_{msl}(\n"
        f"  const device {msl}* __restrict X [[ buffer(0) ]],\n"
        f"  device {msl}* __restrict Y [[ buffer(1) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        f"  Y[((int)threadIdx.x)] = ({msl})(X[((int)threadIdx.x)] + ({msl})1);\n"
        "}\n"
    )
    k = compile_kernel(src)
    x = (torch.arange(32) * 3).to(dtype)
    y = torch.zeros(32, dtype=dtype)
    k.launch([x, y], (1, 1, 1), (32, 1, 1))
    assert torch.equal(y, x + 1)
