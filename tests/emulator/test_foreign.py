"""compile_msl: MSL the plugin did not write (templates, host names, implicit buffer indices,
constant structs, function constants, threadgroup variables in helpers, address-space overloads),
its launch checks, and the shim's additions for it (tlm/msl_library.h, tlm/foreign.h)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import pytest
import torch

from tilelang_metal.emulator import (
    EmulatorCompileError,
    EmulatorLaunchError,
    EmulatorRaceError,
    EmulatorRuntimeError,
    compile_msl,
)
from tilelang_metal.emulator.foreign import memory_counts_unavailable

HEADER = r"""
#pragma once
#include <metal_stdlib>
using namespace metal;

struct Params {
  int n;
  float scale;
  int64_t stride;
};

constant bool use_scale [[function_constant(7)]];

// A helper that declares its own threadgroup array: one per threadgroup and per instantiation.
template <typename T, int N>
METAL_FUNC T block_sum(T v, uint lid) {
  threadgroup T partial[N];
  partial[lid] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  T s = 0;
  for (int i = 0; i < N; i++) s += partial[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return s;
}

// Overloads that differ only in address space: the thread one is what a thread object calls.
struct Acc {
  float v;
  float get() const thread { return v; }
  float get() const threadgroup { return -1000.0f; }
};
"""

WRAPPER = r"""
#include <metal_stdlib>
#include "foreign_test/header.h"

template <typename T, int N>
[[kernel]] void scaled_block_sum(
    const device T* in,
    device float* out,
    constant Params& p,
    device int* where_ [[buffer(3)]],
    uint3 tg [[threadgroup_position_in_grid]],
    ushort2 lid2 [[thread_position_in_threadgroup]],
    uint lid [[thread_index_in_threadgroup]],
    uint simd_lane [[thread_index_in_simdgroup]]) {
  threadgroup float mine[4][N];
  int i = tg.x * N + lid;
  T v = i < p.n ? in[i * p.stride] : T(0);
  T total = block_sum<T, N>(v, lid);
  float f = block_sum<float, N>(float(v) * 2.0f, lid);  // second instantiation: its own array
  mine[lid % 4][lid] = f;
  Acc a{float(total)};
  if (lid == 0) {
    out[tg.x] = (use_scale ? p.scale : 1.0f) * a.get() + 0.0f * mine[0][0];
    where_[tg.x * 2] = lid2.x;
    where_[tg.x * 2 + 1] = int(simd_lane);
  }
}

template [[host_name("bsum_half")]] [[kernel]] decltype(scaled_block_sum<half, 32>) scaled_block_sum<half, 32>;
template [[host_name("bsum_float")]] [[kernel]] decltype(scaled_block_sum<float, 32>) scaled_block_sum<float, 32>;
"""


class Params(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int32), ("scale", ctypes.c_float), ("stride", ctypes.c_int64)]


@functools.cache
def _include_dir(tmp_root: str) -> str:
    d = Path(tmp_root) / "foreign_include"
    (d / "foreign_test").mkdir(parents=True, exist_ok=True)
    (d / "foreign_test" / "header.h").write_text(HEADER)
    return str(d)


@pytest.fixture(scope="module")
def include_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _include_dir(str(tmp_path_factory.mktemp("foreign")))


@functools.lru_cache(maxsize=None)
def _kernel(include_dir: str, host: str, use_scale: bool, instrument: str | None = None):
    return compile_msl(WRAPPER, host, include_dirs=[include_dir], function_constants={7: use_scale}, instrument=instrument)


@pytest.mark.parametrize("host,dtype", [("bsum_float", torch.float32), ("bsum_half", torch.float16)])
def test_template_kernel_with_struct_constant_and_helper_threadgroup_arrays(include_dir, host, dtype):
    k = _kernel(include_dir, host, True)
    assert [b.param.buffer for b in k.bindings] == [0, 1, 2, 3]  # implicit indices in order, explicit 3
    n, stride, groups = 70, 2, 3  # 70 = 2 full blocks of 32 + a partial one
    x = torch.randn(n * stride, dtype=torch.float32).to(dtype)
    out = torch.zeros(groups)
    where = torch.full((groups * 2,), -1, dtype=torch.int32)
    k.launch([x, out, Params(n, 0.5, stride), where], grid=(groups,), block=(32,))
    ref = torch.zeros(groups)
    vals = x[::stride].float()
    for g in range(groups):
        chunk = vals[g * 32 : (g + 1) * 32]
        acc = torch.zeros((), dtype=dtype)
        for v in chunk.to(dtype):  # the kernel sums in T, in lane order
            acc = (acc + v).to(dtype)
        ref[g] = 0.5 * float(acc)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert where.tolist() == [0, 0] * groups


def test_function_constant_value_changes_the_code_path(include_dir):
    k = _kernel(include_dir, "bsum_float", False)
    x = torch.ones(32)
    out = torch.zeros(1)
    k.launch([x, out, Params(32, 0.5, 1), torch.zeros(2, dtype=torch.int32)], grid=(1,), block=(32,))
    assert out.item() == 32.0  # scale not applied


def test_missing_function_constant_is_a_one_line_error(include_dir):
    with pytest.raises(EmulatorCompileError, match=r"function constant 'use_scale' \(index 7\) has no value: pass function_constants=\{7: \.\.\.\}"):
        compile_msl(WRAPPER, "bsum_float", include_dirs=[include_dir])


def test_unknown_host_name_lists_the_known_ones(include_dir):
    with pytest.raises(EmulatorCompileError, match=r"no kernel named 'bsum_int'.*known: bsum_float, bsum_half"):
        compile_msl(WRAPPER, "bsum_int", include_dirs=[include_dir], function_constants={7: True})


def test_launch_arguments_are_checked_against_the_compiled_types(include_dir):
    k = _kernel(include_dir, "bsum_float", True)
    ok = [torch.ones(32), torch.zeros(1), Params(32, 1.0, 1), torch.zeros(2, dtype=torch.int32)]
    with pytest.raises(EmulatorLaunchError, match=r"parameter 'in' .*expected dtype torch.float32, got torch.float16"):
        k.launch([ok[0].half(), *ok[1:]], grid=(1,), block=(32,))
    with pytest.raises(EmulatorLaunchError, match=r"parameter 'p' .*the struct has 16 bytes, got 8"):
        k.launch([*ok[:2], bytes(8), ok[3]], grid=(1,), block=(32,))
    with pytest.raises(EmulatorLaunchError, match=r"takes 4 buffer argument\(s\) \(in, out, p, where_\), got 3"):
        k.launch(ok[:3], grid=(1,), block=(32,))


def test_read_past_the_end_of_a_buffer_is_an_error_naming_it(include_dir):
    k = _kernel(include_dir, "bsum_float", True)
    # n = 64 elements with stride 1, but the buffer holds 40: threads 40.. read past its end
    with pytest.raises(EmulatorRuntimeError, match=r"out-of-bounds access to device buffer 'in' \(buffer 0, 160 bytes\) at byte offset 160"):
        k.launch([torch.ones(40), torch.zeros(2), Params(64, 1.0, 1), torch.zeros(4, dtype=torch.int32)],
                 grid=(2,), block=(32,))
    # the process survives and the kernel still runs correctly afterwards
    out = torch.zeros(1)
    k.launch([torch.ones(32), out, Params(32, 1.0, 1), torch.zeros(2, dtype=torch.int32)], grid=(1,), block=(32,))
    assert out.item() == 32.0


def test_racecheck_and_counters_of_a_foreign_kernel(include_dir):
    k = _kernel(include_dir, "bsum_float", True)
    args = [torch.randn(64), torch.zeros(2), Params(64, 1.0, 1), torch.zeros(4, dtype=torch.int32)]
    k.racecheck(args, grid=(2,), block=(32,), seeds=(0, 1))
    torch.testing.assert_close(args[1], args[0].reshape(2, 32).sum(1), rtol=1e-5, atol=1e-5)
    counts = k.counters(args, grid=(2,), block=(32,))
    assert counts["threadgroup_barriers"] == 2 * 4  # two block_sum calls, two barriers each, per threadgroup
    assert "predicated_device_loads" not in counts  # not measured for foreign kernels: left out, not reported as 0
    if memory_counts_unavailable() is None:  # traced (clang): `constant Params& p` is no traffic
        per_group = {"device_load_instructions": 32, "device_load_bytes": 4 * 32,  # in[i * p.stride]
                     "device_store_instructions": 3, "device_store_bytes": 12,  # out, where_ x2 (thread 0)
                     # block_sum twice: each thread stores its value and reads all 32; mine[..] stores, mine[0][0]
                     "threadgroup_store_instructions": 3 * 32, "threadgroup_load_instructions": 2 * 32 * 32 + 1,
                     "narrow_device_loads": 0}
        assert {k: counts[k] for k in per_group} == {k: 2 * v for k, v in per_group.items()}
    else:
        assert "device_load_bytes" not in counts


RACY = r"""
#include <metal_stdlib>
using namespace metal;
[[kernel]] void racy(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float s[64];
  s[lid] = float(lid);
  // missing threadgroup_barrier
  out[lid] = s[(lid + 37) % 64];
}
"""


def test_racecheck_reports_schedule_dependent_outputs():
    k = compile_msl(RACY, "racy")
    with pytest.raises(EmulatorRaceError, match=r"outputs depend on the schedule: buffer 0 \('out'\)"):
        k.racecheck([torch.zeros(64)], grid=(1,), block=(64,), seeds=(0, 1, 2))


def test_threadgroup_parameter_is_refused_with_the_fix():
    src = "#include <metal_stdlib>\n[[kernel]] void k(device float* o [[buffer(0)]], threadgroup float* t [[threadgroup(0)]]) { o[0] = 1; }\n"
    with pytest.raises(EmulatorCompileError, match=r"\[\[threadgroup\(n\)\]\] kernel parameters .* declare the array in the kernel"):
        compile_msl(src, "k")


LIBRARY = r"""
#include <metal_stdlib>
using namespace metal;
// A header adding a bfloat overload to fast:: (as MLX's bf16_math.h does) must not capture float calls.
namespace metal { namespace fast { METAL_FUNC bfloat exp(bfloat x) { return bfloat(metal::exp(float(x))); } } }

// Free function templates overloaded on address space (MLX's complex.h), and a `<` comparison in a
// template parameter list (MLX's reduction ops).
struct Cx { float v; };
template <typename T> constexpr thread T& bump(thread T& a) { a.v += 1; return a; }
template <typename T> constexpr threadgroup T& bump(threadgroup T& a) { a.v += 100; return a; }
template <typename T, metal::enable_if_t<sizeof(T) < 8, bool> = true> T twice(T x) { return x + x; }

[[kernel]] void library(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint lane [[thread_index_in_simdgroup]]) {
  float v = in[lane];
  out[0 * 32 + lane] = simd_shuffle_and_fill_up(v, v + 100.0f, ushort(3));
  out[1 * 32 + lane] = simd_shuffle_and_fill_down(v, v + 100.0f, ushort(5), ushort(8));
  out[2 * 32 + lane] = simd_shuffle_rotate_down(v, ushort(7));
  out[3 * 32 + lane] = simd_shuffle_rotate_up(v, ushort(7));
  out[4 * 32 + lane] = simd_prefix_inclusive_sum(v);
  out[5 * 32 + lane] = simd_prefix_exclusive_sum(v);
  out[6 * 32 + lane] = fast::exp(v);
  out[7 * 32 + lane] = float(numeric_limits<half>::max()) + float(numeric_limits<bfloat>::infinity() > 0.0f)
      + float(metal::is_floating_point_v<half>) + float(2.0h) + float(numeric_limits<float>::lowest() < 0);
  Cx c{v};
  bump(c);
  metal::array<float, 2> pair{{twice(c.v), float(_disjunction<is_same<int, int>>::value)}};
  out[8 * 32 + lane] = pair[0] + pair[1];
}
"""


def test_library_additions_match_their_metal_definitions():
    k = compile_msl(LIBRARY, "library")
    x = torch.randn(32) * 3
    out = torch.zeros(9 * 32)
    k.launch([x, out], grid=(1,), block=(32,))
    rows = out.reshape(9, 32)
    lane = torch.arange(32)
    fill_up = torch.where(lane >= 3, x[(lane - 3).clamp(min=0)], (x + 100)[(lane + 32 - 3) % 32])
    torch.testing.assert_close(rows[0], fill_up)
    seg, pos = lane // 8 * 8, lane % 8 + 5
    fill_down = torch.where(pos < 8, x[(seg + pos).clamp(max=31)], (x + 100)[(seg + pos - 8).clamp(max=31)])
    torch.testing.assert_close(rows[1], fill_down)
    torch.testing.assert_close(rows[2], x[(lane + 7) % 32])
    torch.testing.assert_close(rows[3], x[(lane - 7) % 32])
    torch.testing.assert_close(rows[4], torch.cumsum(x, 0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[5], torch.cumsum(x, 0) - x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[6], torch.exp(x), rtol=1e-6, atol=0)  # float precision, not bfloat's
    assert torch.all(rows[7] == 65504.0 + 1 + 1 + 2.0 + 1)
    torch.testing.assert_close(rows[8], 2 * (x + 1) + 1)  # the thread overload of bump


# What MLX's steel GEMM, GEMV, attention and sdpa_vector headers use: kernel attribute lists with
# arguments, parameters that exist only under a function constant, gaps in buffer indices, a pointer
# to a constant struct, partial specializations on address spaces, their own metal::is_empty / void_t
# (Metal's library has neither, so the shim must not declare them), remove_addrspace_t, uniform<T>,
# <metal_math>'s M_*_F constants, and a declared function constant the kernel does not use.
GATED = r"""
#include <metal_stdlib>
using namespace metal;
namespace metal {  // as MLX's steel/utils/type_traits.h
template <typename T> struct is_empty : metal::bool_constant<__is_empty(T)> {};
template <typename... Ts> struct make_void { typedef void type; };
template <typename... Ts> using void_t = typename make_void<Ts...>::type;
template <typename T> struct pointer_element {};
template <typename T> struct pointer_element<thread T*> { using type = remove_cv_t<T>; static constexpr int space = 0; };
template <typename T> struct pointer_element<device T*> { using type = remove_cv_t<T>; static constexpr int space = 1; };
template <typename T> struct pointer_element<constant T*> { using type = remove_cv_t<T>; static constexpr int space = 2; };
template <typename T>
struct pointer_element<threadgroup T*> {
  using type = remove_cv_t<T>;
  static constexpr int space = 3;
};
}
struct Scale { float a; int b; };
struct Empty {};
constant bool has_bias [[function_constant(1)]];
constant int unused_here [[function_constant(2)]];  // no value given: fine while nothing reads it

METAL_FUNC int read_unused() { return unused_here; }

template <int N>
[[kernel, max_total_threads_per_threadgroup(N)]] void gated(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    const constant Scale* scale [[buffer(3)]],
    const device float* bias [[buffer(4), function_constant(has_bias)]],
    const constant int& mode [[buffer(5)]],
    uint lid [[thread_position_in_threadgroup]]) {
  const uniform<float> a = make_uniform(scale->a);
  float v = in[lid] * a * M_LOG2E_F * M_LN2_F + float(scale->b);
  if (has_bias) v += bias[lid];
  if (mode == 1) v += float(read_unused());
  if (mode == 2 && !has_bias) v += bias[0];  // a read of the absent binding
  out[lid] = v + float(pointer_element<device float*>::space) + float(is_empty<Scale>::value) * 2.0f
      + float(is_empty<Empty>::value) * 4.0f + float(is_same_v<void_t<int>, void>) * 8.0f
      + float(is_same_v<remove_addrspace_t<device float>, float>) * 16.0f
      + float(is_same_v<pointer_element<const device float*>::type, float>) * 32.0f;
}
template [[host_name("gated32")]] [[kernel]] decltype(gated<32>) gated<32>;
"""


class Scale(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int32)]


@functools.lru_cache(maxsize=None)
def _gated(has_bias: bool):
    return compile_msl(GATED, "gated32", function_constants={"has_bias": has_bias})


@pytest.mark.parametrize("has_bias", [False, True])
def test_function_constant_parameters_attributes_and_indices_as_mlx_writes_them(has_bias):
    k = _gated(has_bias)
    # the absent binding takes no argument; the others keep their indices (and there is no buffer 2)
    assert [(b.param.name, b.param.buffer) for b in k.bindings] == [
        ("in", 0), ("out", 1), ("scale", 3), *([("bias", 4)] if has_bias else []), ("mode", 5)]
    x, bias = torch.randn(32), torch.randn(32)
    out = torch.full((32,), float("nan"))
    k.launch([x, out, Scale(2.0, 3), *([bias] if has_bias else []), 0], grid=(1,), block=(32,))
    # pointer_element<device float*> is the thread specialization here (address spaces are empty):
    # 0; Scale is not empty, Empty is: 4; void_t<int> is void: 8; removing an address space is the
    # identity: 16; pointer_element strips const: 32
    ref = x * 2.0 + 3 + (bias if has_bias else 0) + 4 + 8 + 16 + 32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_absent_parameter_and_unset_constant_fail_with_their_names():
    k = _gated(False)
    with pytest.raises(EmulatorLaunchError, match=r"takes 4 buffer argument\(s\) \(in, out, scale, mode; absent: bias \(has_bias is false\)\), got 5$"):
        k.launch([torch.zeros(32), torch.zeros(32), Scale(1.0, 0), torch.zeros(32), 0], grid=(1,), block=(32,))
    with pytest.raises(EmulatorLaunchError, match=r"parameter 'scale' .*4 bytes is not a whole number of 8-byte structs"):
        k.launch([torch.zeros(32), torch.zeros(32), bytes(4), 0], grid=(1,), block=(32,))
    # an access to the absent binding faults on a guard page that names the constant
    with pytest.raises(EmulatorRuntimeError,
                       match=r"device buffer 'bias \(absent: function_constant\(has_bias\) is false\)' \(buffer 4, 0 bytes\) at byte offset 0"):
        k.launch([torch.zeros(32), torch.zeros(32), Scale(1.0, 0), 2], grid=(1,), block=(32,))
    # a helper reads the constant that has no value: the launch stops and names it
    with pytest.raises(EmulatorRuntimeError, match=r"function constant 'unused_here' \(index 2\) has no value: pass function_constants=\{2: \.\.\.\}"):
        k.launch([torch.zeros(32), torch.zeros(32), Scale(1.0, 0), 1], grid=(1,), block=(32,))


def test_function_constant_errors_at_compile_time_are_one_line_and_name_the_constant():
    # the kernel body naming a constant without a value is refused before compiling
    body_uses = GATED.replace("if (mode == 1) v += float(read_unused());", "v += float(unused_here);")
    with pytest.raises(EmulatorCompileError, match=r"^kernel 'gated32': function constant 'unused_here' \(index 2\) has no value: pass function_constants=\{2: \.\.\.\} to compile_msl$"):
        compile_msl(body_uses, "gated32", function_constants={"has_bias": False})
    # so is a parameter gated on a constant without a value
    with pytest.raises(EmulatorCompileError, match=r"^kernel 'gated32': function constant 'has_bias' \(index 1\) has no value"):
        compile_msl(GATED, "gated32")
    # a binding gated on a name that is no function constant
    typo = GATED.replace("function_constant(has_bias)]]", "function_constant(has_biass)]]")
    with pytest.raises(EmulatorCompileError, match=r"parameter 'bias': function_constant\(has_biass\) names no .*\(known: has_bias, unused_here\)$"):
        compile_msl(typo, "gated32", function_constants={"has_bias": True})


# How Apple's samples and most hand-written Metal spell a kernel: the `kernel` qualifier, also after an
# attribute, on a template and in its explicit instantiations (both the declarator and the decltype form).
KEYWORD_KERNELS = r"""
#include <metal_stdlib>
using namespace metal;

kernel void add_arrays(device const float* inA,
                       device const float* inB,
                       device float* result,
                       uint index [[thread_position_in_grid]])
{
    result[index] = inA[index] + inB[index];
}

template <typename T>
[[max_total_threads_per_threadgroup(64)]]
kernel void axpy(device const T* x [[buffer(0)]], device T* y [[buffer(1)]], constant float& a [[buffer(2)]],
                 uint i [[thread_position_in_grid]]) {
    y[i] = T(a * float(x[i]) + float(y[i]));
}
template [[host_name("axpy_half")]] kernel void axpy<half>(device const half*, device half*, constant float&, uint);
template [[host_name("axpy_float")]] kernel decltype(axpy<float>) axpy<float>;

[[host_name("reverse_block")]] kernel void reverse_in_threadgroup(device const float* in, device float* out,
                                                                   uint gid [[thread_position_in_grid]],
                                                                   uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float staged[32];
    staged[lid] = in[gid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[gid] = staged[31 - lid];
}
"""


def test_kernel_qualifier_as_apple_writes_it():
    a, b = torch.randn(96), torch.randn(96)
    out = torch.full((96,), float("nan"))
    compile_msl(KEYWORD_KERNELS, "add_arrays").launch([a, b, out], grid=(3,), block=(32,))
    assert torch.equal(out, a + b)


def test_kernel_qualifier_on_an_attributed_template_instantiated_by_declaration():
    k = compile_msl(KEYWORD_KERNELS, "axpy_half")
    assert [b.param.name for b in k.bindings] == ["x", "y", "a"]
    x, y = torch.randn(64).half(), torch.randn(64).half()
    want = (0.5 * x.float() + y.float()).half()
    k.launch([x, y, 0.5], grid=(2,), block=(32,))
    assert torch.equal(y, want)


def test_kernel_qualifier_under_a_host_name_with_a_barrier_passes_racecheck():
    k = compile_msl(KEYWORD_KERNELS, "reverse_block")
    x, out = torch.randn(64), torch.full((64,), float("nan"))
    k.racecheck([x, out], grid=(2,), block=(32,), seeds=(0, 1))
    assert torch.equal(out, x.reshape(2, 32).flip(1).reshape(64))


RENDER_STAGES = r"""
#include <metal_stdlib>
using namespace metal;
struct VertexOut { float4 position [[position]]; float4 color; };
vertex VertexOut vertex_main(uint vid [[vertex_id]], const device float4* positions [[buffer(0)]]) {
    VertexOut o; o.position = positions[vid]; o.color = float4(1.0); return o;
}
[[fragment]] float4 shade(VertexOut in [[stage_in]]) { return in.color; }
kernel void fill(device float* out, uint i [[thread_position_in_grid]]) { out[i] = 1.0f; }
"""


@pytest.mark.parametrize("name,message", [
    ("vertex_main", r"^<source>:5: 'vertex_main' is a vertex function, not a compute kernel: the emulator runs only `kernel void` / `\[\[kernel\]\]` functions$"),
    ("shade", r"^<source>:8: 'shade' is a fragment function, not a compute kernel"),
    ("fill", r"^<source>:5: vertex function 'vertex_main' is a render stage the emulator cannot compile: pass compile_msl the source of kernel 'fill' without it$"),
])
def test_vertex_and_fragment_functions_are_refused_in_one_line(name, message):
    with pytest.raises(EmulatorCompileError, match=message):
        compile_msl(RENDER_STAGES, name)
