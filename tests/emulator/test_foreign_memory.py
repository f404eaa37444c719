"""Memory traffic of foreign kernels (compile_msl, ForeignKernel.counters): traced by address in the
counters flavour (clang only), counted as the plugin's counters count the same MSL. The cross-check on
the plugin's own GEMM, reduction and softmax kernels is tests/slow/test_foreign_memory_crosscheck.py."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal.emulator import compile_msl, launch_counters
from tilelang_metal.emulator.foreign import memory_counts_unavailable
from tilelang_metal.emulator.foreign.launcher import MEMORY_COUNTERS

_WHY = memory_counts_unavailable()
needs_clang = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

# Every kind of access the counters tell apart, in a form both the plugin's marks (launch_counters)
# and the tracing (compile_msl) read: a half4 load, a scalar half load (narrow), threadgroup stores
# and loads, a store under `if`, a `constant` argument (not traffic), simdgroup matrix loads and
# stores from device and threadgroup memory (one access per lane's run of 2 elements), a transposed
# simdgroup load (one access per element).
TRAFFIC = """
#include <metal_stdlib>
using namespace metal;
kernel void traffic(const device half* a [[buffer(0)]], device float* b [[buffer(1)]], constant int& n [[buffer(2)]],
                    device half* c [[buffer(3)]], uint i [[thread_position_in_threadgroup]]) {
  threadgroup float t[64];
  threadgroup half m[64];
  half4 v = *(const device half4*)(a + 4 * i);
  t[i] = float(v.x + v.w);
  m[i] = a[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if ((int)i < n) {
    b[i] = t[63 - i];
  }
  simdgroup_half8x8 x;
  simdgroup_half8x8 y;
  simdgroup_load(x, a, 8);
  simdgroup_load(y, m, 8);
  simdgroup_load(y, m, 8, ulong2(0, 0), true);
  simdgroup_store(x, c, 8);
}
"""


def _traffic_args(n: int) -> list:
    torch.manual_seed(0)
    return [torch.randn(256).half(), torch.zeros(64), n, torch.zeros(64).half()]


@needs_clang
def test_foreign_memory_counts_follow_the_source_and_equal_the_plugin_counts():
    n, threads = 40, 64
    foreign = compile_msl(TRAFFIC.replace("kernel void", "[[kernel]] void"), "traffic")
    got = foreign.counters(_traffic_args(n), (1, 1, 1), (threads, 1, 1))
    lanes = threads  # two simdgroups of 32 lanes, one 4-byte run (2 halves) per lane per matrix access
    assert got["device_load_instructions"] == threads + threads + lanes  # half4, half, simdgroup_load(x, a)
    assert got["device_load_bytes"] == 8 * threads + 2 * threads + 4 * lanes
    assert got["narrow_device_loads"] == threads  # a[i] only: a half4 is one 8-byte load
    assert got["device_store_instructions"] == n + lanes  # b[i] under the `if`, simdgroup_store
    assert got["device_store_bytes"] == 4 * n + 4 * lanes
    assert got["threadgroup_store_instructions"] == 2 * threads
    assert got["threadgroup_store_bytes"] == 4 * threads + 2 * threads
    # t[63 - i] under the `if`, simdgroup_load(y, m) one run per lane, transposed: one per element
    assert got["threadgroup_load_instructions"] == n + lanes + 2 * lanes
    assert got["threadgroup_load_bytes"] == 4 * n + 4 * lanes + 2 * 2 * lanes
    assert got["threadgroup_barriers"] == 1
    plugin_args = _traffic_args(n)
    plugin_args[2] = torch.tensor([n], dtype=torch.int32)
    plugin = launch_counters(TRAFFIC, plugin_args, (1, 1, 1), (threads, 1, 1)).total
    assert {k: got[k] for k in MEMORY_COUNTERS} == {k: plugin[k] for k in MEMORY_COUNTERS}


COMPOUND = """
#include <metal_stdlib>
using namespace metal;
kernel void compound(const device float* a [[buffer(0)]], device float* b [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  b[i] += a[i];
}
"""


@needs_clang
def test_compound_assignment_is_a_load_and_a_store_where_the_plugin_marks_a_store():
    """The documented difference: the plugin's marks see `b[i] += v` as a store only; the tracing
    sees what the statement does, a load and a store of b[i]."""
    a, b = torch.randn(32), torch.randn(32)
    foreign = compile_msl(COMPOUND.replace("kernel void", "[[kernel]] void"), "compound")
    got = foreign.counters([a, b.clone()], (1, 1, 1), (32, 1, 1))
    plugin = launch_counters(COMPOUND, [a, b.clone()], (1, 1, 1), (32, 1, 1)).total
    assert (got["device_load_instructions"], got["device_store_instructions"]) == (64, 32)
    assert (plugin["device_load_instructions"], plugin["device_store_instructions"]) == (32, 32)
    assert got["device_load_bytes"] == plugin["device_load_bytes"] + 4 * 32


STRUCTS = """
#include <metal_stdlib>
using namespace metal;
struct Pair { float4 lo; float4 hi; };
struct Params { int n; };
[[kernel]] void structs(const device Pair* p [[buffer(0)]], device float4* out [[buffer(1)]],
                        const constant Params* params [[buffer(2)]], const constant float* w [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
  if ((int)i >= params->n) return;
  Pair q = p[i];
  out[i] = (q.lo + q.hi) * w[0];
}
"""


@needs_clang
def test_a_struct_copy_is_one_access_per_16_bytes_and_constant_space_is_not_traffic():
    n = 24
    pairs, out = torch.randn(32, 8), torch.zeros(32, 4)
    k = compile_msl(STRUCTS, "structs")
    got = k.counters([pairs, out, n.to_bytes(4, "little"), torch.tensor([2.0])], (1, 1, 1), (32, 1, 1))
    # one 32-byte Pair per thread: one source access, two 16-byte instructions
    assert (got["device_load_instructions"], got["device_load_bytes"]) == (2 * n, 32 * n)
    assert (got["device_store_instructions"], got["device_store_bytes"]) == (n, 16 * n)
    assert got["narrow_device_loads"] == 0


@pytest.mark.slow  # builds the runtime and a kernel with g++ (cold: ~6 s)
def test_without_clang_memory_counts_are_left_out_with_the_reason(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CXX", "g++")
    why = memory_counts_unavailable()
    assert why is not None and "clang" in why
    k = compile_msl(COMPOUND.replace("kernel void", "[[kernel]] void"), "compound", instrument="counters")
    assert not k.memory_traced
    got = k.counters([torch.randn(32), torch.randn(32)], (1, 1, 1), (32, 1, 1))
    assert not set(MEMORY_COUNTERS) & set(got)  # absent, not 0
    assert got["threadgroup_barriers"] == 0


ATOMIC = """
#include <metal_stdlib>
using namespace metal;
kernel void tally(const device int* a [[buffer(0)]], device int* hist [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit((device atomic_int*)(hist + (a[i] & 3)), 1, memory_order_relaxed);
}
"""


@needs_clang
def test_atomics_are_not_traced_where_the_plugin_counts_the_atomic_access():
    """The documented difference: the atomic read-modify-write is left out of the traced counts; the
    plugin's marks count the atomic object's access as one device load."""
    a = torch.arange(32, dtype=torch.int32)
    foreign = compile_msl(ATOMIC.replace("kernel void", "[[kernel]] void"), "tally")
    hist = torch.zeros(4, dtype=torch.int32)
    got = foreign.counters([a, hist], (1, 1, 1), (32, 1, 1))
    assert hist.tolist() == [8, 8, 8, 8]  # it ran
    plugin = launch_counters(ATOMIC, [a, torch.zeros(4, dtype=torch.int32)], (1, 1, 1), (32, 1, 1)).total
    assert (got["device_load_instructions"], got["device_store_instructions"]) == (32, 0)  # a[i] only
    assert (plugin["device_load_instructions"], plugin["device_store_instructions"]) == (64, 0)


# A 32-byte struct copy (as MLX's BlockLoader reads a row of 16 halves) is two instructions on the GPU,
# whose widest load or store per thread is 16 bytes; a 16-byte one is one.
WIDE = """
#include <metal_stdlib>
using namespace metal;
struct row32 { uchar v[32]; };
struct row16 { uchar v[16]; };
[[kernel]] void wide(const device uchar* a [[buffer(0)]], device uchar* b [[buffer(1)]], uint i [[thread_position_in_threadgroup]]) {
  threadgroup row32 t[32];
  t[i] = *(const device row32*)(a + 32 * i);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  *(device row16*)(b + 16 * i) = *(threadgroup row16*)((threadgroup uchar*)t + 16 * i);
}
"""


@needs_clang
def test_an_access_wider_than_16_bytes_counts_one_instruction_per_16_bytes():
    threads = 32
    a, b = torch.arange(1024, dtype=torch.uint8), torch.zeros(512, dtype=torch.uint8)
    got = compile_msl(WIDE, "wide").counters([a, b], (1, 1, 1), (threads, 1, 1))
    assert got["device_load_instructions"] == 2 * threads and got["device_load_bytes"] == 32 * threads
    assert got["threadgroup_store_instructions"] == 2 * threads and got["threadgroup_store_bytes"] == 32 * threads
    assert got["threadgroup_load_instructions"] == threads and got["device_store_instructions"] == threads
    assert got["narrow_device_loads"] == 0
    assert torch.equal(b, a[:512])
