"""GPU-level counts (docs/emulator.md, "GPU-level counts"): what a GPU would issue, by the same rules
for the plugin's marked accesses and for foreign MSL traced by address. Each probe is one MSL kernel
counted both ways (the two must agree) plus, for the vector-width pair, a TileLang kernel; the counts
must not change when the same work is spelled differently (four `half` reads vs one `half4`)."""


import pytest
import torch

from tilelang_metal.emulator import compile_msl, counters, launch_counters
from tilelang_metal.emulator.foreign import memory_counts_unavailable

_WHY = memory_counts_unavailable()
needs_clang = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

GPU_LEVEL = ("load_instructions", "store_instructions", "unique_device_load_bytes", "device_transactions",
             "threadgroup_replays", "memory_barriers", "lockstep_barriers")
THREADS = 32  # one simdgroup: every probe below is one simdgroup-wide access per statement

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"

# The same 8 bytes per thread read as four `half`s or as one `half4`.
FOUR_HALVES = HEADER + """
kernel void probe(const device half* a [[buffer(0)]], device half* b [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  half x0 = a[4 * i];
  half x1 = a[4 * i + 1];
  half x2 = a[4 * i + 2];
  half x3 = a[4 * i + 3];
  b[i] = x0 + x1 + x2 + x3;
}
"""
ONE_HALF4 = HEADER + """
kernel void probe(const device half* a [[buffer(0)]], device half* b [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  half4 v = *(const device half4*)(a + 4 * i);
  b[i] = v.x + v.y + v.z + v.w;
}
"""
# One address read twice with nothing written between: one load, its bytes once.
READ_TWICE = HEADER + """
kernel void probe(const device half* a [[buffer(0)]], device half* b [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  half x = a[4 * i];
  half y = a[4 * i];
  b[i] = x * y;
}
"""


def _device_probe(stride: int) -> str:
    """One float per lane at `lane * stride` floats, written to b[lane]."""
    return HEADER + f"""
kernel void probe(const device float* a [[buffer(0)]], device float* b [[buffer(1)]], uint i [[thread_position_in_grid]]) {{
  b[i] = a[i * {stride}];
}}
"""


def _bank_probe(index: str) -> str:
    """Fill 33 x 32 floats of threadgroup memory row by row (conflict-free), then one read per lane
    at `index`."""
    return HEADER + f"""
kernel void probe(const device float* a [[buffer(0)]], device float* b [[buffer(1)]], uint lane [[thread_position_in_grid]]) {{
  threadgroup float t[1056];
  for (uint j = 0; j < 33; ++j) {{
    t[j * 32 + lane] = a[j * 32 + lane];
  }}
  threadgroup_barrier(mem_flags::mem_threadgroup);
  b[lane] = t[{index}];
}}
"""


BARRIERS = HEADER + """
kernel void probe(const device float* a [[buffer(0)]], device float* b [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  threadgroup float t[32];
  t[i] = a[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float x = t[31 - i];
  threadgroup_barrier(mem_flags::mem_none);
  b[i] = x;
}
"""


def _half_args():
    torch.manual_seed(0)
    return [torch.randn(4 * THREADS).half(), torch.zeros(THREADS).half()]


def _float_args(n: int):
    torch.manual_seed(0)
    return [torch.randn(n), torch.zeros(THREADS)]


def both_ways(msl: str, args) -> dict[str, int]:
    """GPU-level counts of one launch of `msl`, traced as foreign MSL and through the plugin's marks;
    the two must agree."""
    foreign = compile_msl(msl.replace("kernel void", "[[kernel]] void"), "probe").counters([a.clone() for a in args], (1, 1, 1), (THREADS, 1, 1))
    marked = launch_counters(msl, [a.clone() for a in args], (1, 1, 1), (THREADS, 1, 1)).total
    got = {k: foreign[k] for k in GPU_LEVEL}
    assert got == {k: marked[k] for k in GPU_LEVEL}, (got, {k: marked[k] for k in GPU_LEVEL})
    return {**foreign, **got}


@needs_clang
def test_four_half_reads_and_one_half4_read_are_the_same_instructions():
    four, one = both_ways(FOUR_HALVES, _half_args()), both_ways(ONE_HALF4, _half_args())
    # source-level: 4 vs 1 load per thread; GPU-level: one 8-byte load per thread either way
    assert (four["device_load_instructions"], one["device_load_instructions"]) == (4 * THREADS, THREADS)
    assert four["load_instructions"] == one["load_instructions"] == THREADS
    assert four["unique_device_load_bytes"] == one["unique_device_load_bytes"] == 8 * THREADS
    assert four["store_instructions"] == one["store_instructions"] == THREADS
    # 32 lanes x 8 contiguous bytes: 256 bytes, two 128-byte segments (+1 for the 64-byte store)
    assert four["device_transactions"] == one["device_transactions"] == 2 + 1


@needs_clang
def test_a_repeated_read_counts_once_in_instructions_and_bytes():
    got = both_ways(READ_TWICE, _half_args())
    assert got["device_load_instructions"] == 2 * THREADS and got["device_load_bytes"] == 4 * THREADS
    assert got["load_instructions"] == THREADS and got["unique_device_load_bytes"] == 2 * THREADS


@needs_clang
@pytest.mark.parametrize("stride, segments", [(1, (1, 2)), (32, (32, 32))])
def test_device_transactions_count_the_segments_a_simdgroup_access_touches(stride, segments):
    got = both_ways(_device_probe(stride), _float_args(THREADS * stride))
    store_segments = 1  # b[lane]: 128 contiguous bytes of a buffer the emulator aligns
    lo, hi = segments
    assert lo + store_segments <= got["device_transactions"] <= hi + store_segments, got
    assert got["load_instructions"] == got["store_instructions"] == THREADS


@needs_clang
@pytest.mark.parametrize("index, replays", [("lane * 32", 31), ("lane * 33", 0), ("lane", 0), ("0", 0)])
def test_threadgroup_replays_follow_the_banks(index, replays):
    got = both_ways(_bank_probe(index), _float_args(33 * 32))
    # the fill is 33 conflict-free row stores; only the probed read can replay
    assert got["threadgroup_replays"] == replays, got
    assert got["store_instructions"] == 33 * THREADS + THREADS  # fill + b[lane]


@needs_clang
def test_barriers_are_told_apart_by_their_memory_flags():
    got = both_ways(BARRIERS, _float_args(THREADS))
    assert got["memory_barriers"] == 1 and got["lockstep_barriers"] == 1
    assert got["threadgroup_barriers"] == 2


def _tilelang_copy(vectorized: bool):
    import tilelang.language as T

    n = 4 * THREADS

    @T.prim_func
    def copy4(A: T.Tensor((n,), "float16"), B: T.Tensor((n,), "float16")):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            if vectorized:
                for v in T.vectorized(4):
                    B[tx * 4 + v] = A[tx * 4 + v]
            else:
                for v in T.unroll(4):
                    B[tx * 4 + v] = A[tx * 4 + v]

    return copy4


def test_plugin_kernels_count_the_same_instructions_however_the_copy_is_spelled():
    import tilelang

    from tilelang_metal import kernels

    stats = {}
    for vectorized in (False, True):
        kernel = tilelang.compile(_tilelang_copy(vectorized), target=kernels.plain_metal_target(),
                                  execution_backend="emulator")
        a, b = torch.randn(4 * THREADS).half(), torch.zeros(4 * THREADS).half()
        stats[vectorized] = counters(kernel, a, b).total
        kernel(a, b)
        assert torch.equal(a, b)
    scalar, vector = stats[False], stats[True]
    assert (scalar["device_load_instructions"], vector["device_load_instructions"]) == (4 * THREADS, THREADS)
    for name in ("load_instructions", "store_instructions", "unique_device_load_bytes", "device_transactions"):
        assert scalar[name] == vector[name], (name, scalar[name], vector[name])
    assert vector["load_instructions"] == vector["store_instructions"] == THREADS
