"""Race detection (`racecheck`): deliberate races are caught with both accesses named; the suite's
GEMM kernels give no false positives."""

from __future__ import annotations

import re

import pytest
import torch
from test_errors import BLOCK_IDX, LANE, SIMD_ID, THREAD_IDX, kernel

from tilelang_metal.emulator import EmulatorRaceError, EmulatorRuntimeError, launch_racecheck, racecheck
from tilelang_metal.emulator.instrument import _compare_schedules, _race_launch

TID = "((int)threadIdx.x)"
IN = "const device float* __restrict A [[ buffer(0) ]]"
OUT = "device float* __restrict B [[ buffer(1) ]]"


def race(src: str, tensors, grid, block, match: str, seeds=(0, 1, 2)) -> str:
    with pytest.raises(EmulatorRaceError, match=match) as ei:
        launch_racecheck(src, tensors, grid, block, seeds=seeds)
    return str(ei.value)


def thread(tg: str, t: str, simd: int, lane: int) -> str:
    return re.escape(f"threadgroup ({tg}) thread ({t}) [simdgroup {simd}, lane {lane}]")


# ----------------------------------------------------------------- deliberate races


def neighbour_through_device(flags: str | None) -> str:
    barrier = f"  threadgroup_barrier({flags});\n" if flags else ""
    return kernel(
        "dev_neighbour" + ("" if flags is None else "_" + flags.split("::")[-1]),
        [IN, OUT, "device float* __restrict W [[ buffer(2) ]]", THREAD_IDX],
        f"  W[{TID}] = A[{TID}] * 2.0f;\n{barrier}  B[{TID}] = W[((({TID} + 1)) & 63)];\n",
        max_threads=64,
    )


def test_intra_threadgroup_race_through_device_memory():
    tensors = [torch.randn(64), torch.zeros(64), torch.zeros(64)]
    msg = race(neighbour_through_device(None), tensors, (1, 1, 1), (64, 1, 1), "data race on device buffer 'W'")
    assert re.search(r"element \d+: (write|read) by threadgroup \(0,0,0\) thread \(\d+,0,0\) \[simdgroup \d, lane \d+\], "
                     r"then (read|write) by threadgroup \(0,0,0\) thread", msg)
    assert "no threadgroup_barrier(mem_flags::mem_device) between them" in msg
    assert "schedule seed 0" in msg


def test_threadgroup_barrier_orders_device_memory_only_with_mem_device():
    tensors = [torch.randn(64), torch.zeros(64), torch.zeros(64)]
    race(neighbour_through_device("mem_flags::mem_threadgroup"), tensors, (1, 1, 1), (64, 1, 1), "data race on device buffer 'W'")
    launch_racecheck(neighbour_through_device("mem_flags::mem_device"), tensors, (1, 1, 1), (64, 1, 1))
    assert torch.equal(tensors[1], torch.roll(tensors[0], -1) * 2)


def test_intra_threadgroup_race_through_threadgroup_memory():
    # After the barrier, thread t reads S[t + 1] while thread t + 1 overwrites it: no barrier between.
    src = kernel(
        "tg_neighbour",
        [IN, OUT, THREAD_IDX],
        "  threadgroup float S[64];\n"
        f"  S[{TID}] = A[{TID}];\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        f"  float v = S[((({TID} + 1)) & 63)];\n"
        f"  S[{TID}] = (v * 2.0f);\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        f"  B[{TID}] = S[{TID}];\n",
        max_threads=64,
    )
    msg = race(src, [torch.randn(64), torch.zeros(64)], (1, 1, 1), (64, 1, 1), "data race on threadgroup array 'S' element (\\d+)")
    elem = int(re.search(r"element (\d+)", msg).group(1))
    # the two threads are the element's owner (write) and its left neighbour (read)
    owner, reader = thread("0,0,0", f"{elem},0,0", elem // 32, elem % 32), thread("0,0,0", f"{(elem - 1) % 64},0,0", ((elem - 1) % 64) // 32, (elem - 1) % 32)
    assert re.search(f"(read by {reader}, then write by {owner}|write by {owner}, then read by {reader})", msg), msg
    assert "no threadgroup_barrier(mem_flags::mem_threadgroup) between them" in msg


def test_race_across_threadgroups():
    # Every threadgroup writes the same 32 elements.
    src = kernel("cross_group", [IN, OUT, BLOCK_IDX, THREAD_IDX], f"  B[{TID}] = A[((((int)blockIdx.x) * 32) + {TID})];\n", max_threads=32)
    msg = race(src, [torch.randn(96), torch.zeros(32)], (3, 1, 1), (32, 1, 1), r"data race on device buffer 'B' element (\d+): write by threadgroup \((\d),0,0\) thread \((\d+),0,0\).*then write by threadgroup \((\d),0,0\) thread \((\d+),0,0\)")
    m = re.search(r"element (\d+): write by threadgroup \((\d),0,0\) thread \((\d+),0,0\).*then write by threadgroup \((\d),0,0\) thread \((\d+),0,0\)", msg)
    assert m.group(2) != m.group(4) and m.group(1) == m.group(3) == m.group(5)
    assert "different threadgroups are not ordered within a launch" in msg


def test_read_of_what_another_threadgroup_writes():
    # Threadgroup g reads element g + 1 of B, which threadgroup g + 1 writes.
    src = kernel(
        "cross_group_read",
        [IN, OUT, BLOCK_IDX, THREAD_IDX],
        f"  if ({TID} == 0) {{\n    B[((int)blockIdx.x)] = (A[((int)blockIdx.x)] + B[((((int)blockIdx.x) + 1) & 3)]);\n  }}\n",
        max_threads=32,
    )
    race(src, [torch.randn(4), torch.zeros(4)], (4, 1, 1), (32, 1, 1), r"data race on device buffer 'B' element \d: (read|write) by threadgroup .*different threadgroups")


def sg_exchange(barrier: bool) -> str:
    """Each simdgroup stores an 8x8 matrix into threadgroup memory, then loads the *other* one's."""
    sync = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n" if barrier else ""
    return kernel(
        "sg_exchange" + ("" if barrier else "_no_barrier"),
        [IN, OUT, SIMD_ID, LANE],
        "  threadgroup float S[128];\n"
        "  S[((((int)__simd_group_id) * 32) + ((int)__lane))] = 0.0f;\n"
        "  S[(((((int)__simd_group_id) * 32) + ((int)__lane)) + 64)] = 0.0f;\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  simdgroup_float8x8 M;\n"
        "  simdgroup_load(M, (A + (((int)__simd_group_id) * 64)), 8, ulong2(0, 0), 0);\n"
        "  simdgroup_store(M, (S + (((int)__simd_group_id) * 64)), 8, ulong2(0, 0), false);\n"
        + sync
        + "  simdgroup_float8x8 X;\n"
        "  simdgroup_load(X, (S + ((1 - ((int)__simd_group_id)) * 64)), 8, ulong2(0, 0), 0);\n"
        "  simdgroup_store(X, (B + (((int)__simd_group_id) * 64)), 8, ulong2(0, 0), false);\n",
        max_threads=64,
    )


def test_missing_barrier_between_shared_write_and_cross_simdgroup_read():
    a = torch.randn(128)
    msg = race(sg_exchange(False), [a, torch.zeros(128)], (1, 1, 1), (64, 1, 1), "data race on threadgroup array 'S'")
    # simdgroup_load / simdgroup_store count as accesses by the lanes that own the elements
    m = re.search(r"element (\d+): (write|read) by .*\[simdgroup (\d), lane (\d+)\], then (write|read) by .*\[simdgroup (\d), lane (\d+)\]", msg)
    assert m and {m.group(2), m.group(5)} == {"read", "write"} and m.group(3) != m.group(6)
    # the lanes are those of the 8x8 layout: element (r, c) of a matrix belongs to lane l with
    # row(l) = r and col(l) <= c <= col(l) + 1, in both simdgroups
    e = int(m.group(1)) % 64
    for lane in (int(m.group(4)), int(m.group(7))):
        row, col = ((lane // 4) & 4) + (lane // 2) % 4, ((lane // 4) & 2) * 2 + (lane % 2) * 2
        assert e // 8 == row and col <= e % 8 <= col + 1
    b = torch.zeros(128)
    launch_racecheck(sg_exchange(True), [a, b], (1, 1, 1), (64, 1, 1))
    assert torch.equal(b, torch.cat([a[64:], a[:64]]))


def test_uninitialized_reads_of_threadgroup_memory_and_thread_arrays():
    tg = kernel("tg_uninit", [IN, OUT, THREAD_IDX], "  threadgroup float S[64];\n  S[" + TID + "] = A[" + TID + "];\n"
                "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  B[" + TID + "] = S[(" + TID + " + 32)];\n", max_threads=32)
    msg = race(tg, [torch.randn(64), torch.zeros(64)], (1, 1, 1), (32, 1, 1), r"uninitialized read of threadgroup array 'S' element (3[2-9]|[4-6]\d) by threadgroup \(0,0,0\) thread")
    local = kernel("local_uninit", [IN, OUT, THREAD_IDX], "  float loc[4];\n  loc[0] = A[" + TID + "];\n  loc[2] = 1.0f;\n"
                   "  B[" + TID + "] = (loc[0] + loc[(" + TID + " & 3)]);\n", max_threads=32)
    msg = race(local, [torch.randn(32), torch.zeros(32)], (1, 1, 1), (32, 1, 1), r"uninitialized read of thread array 'loc' element [13] by threadgroup \(0,0,0\) thread \(\d+,0,0\)")


def test_schedule_dependent_outputs_are_reported():
    # Inputs that differ between runs stand in for a race the shadow state cannot see: the bitwise
    # comparison of the outputs of the schedules reports it.
    from emu_msl_kernels import add_half4

    def run(seed):
        a = torch.full((512,), float(seed), dtype=torch.float16)
        t = [a, torch.zeros(512, dtype=torch.float16), torch.zeros(512, dtype=torch.float16)]
        _race_launch(add_half4(), t, (1, 1, 1), (128, 1, 1), seed)
        return t

    with pytest.raises(EmulatorRaceError, match=r"outputs depend on the schedule: launch tensor 0 element 0 is 0.0 with seed 0 and 1.0 with seed 1"):
        _compare_schedules(run, "launch tensor", (0, 1))


def test_other_errors_stay_runtime_errors():
    src = kernel("rc_oob", [IN, OUT, THREAD_IDX], f"  B[({TID} + 1)] = A[{TID}];\n", max_threads=32)
    with pytest.raises(EmulatorRuntimeError, match="out-of-bounds access to device buffer 'B'") as ei:
        launch_racecheck(src, [torch.randn(32), torch.zeros(32)], (1, 1, 1), (32, 1, 1))
    assert not isinstance(ei.value, EmulatorRaceError)


# ----------------------------------------------------------------- no false positives on GEMMs


def jit(func, target):
    import tilelang

    return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")


@pytest.mark.parametrize(
    "which, shape",
    [
        ("direct", (128, 128, 64)),
        ("shared_metal4", (128, 128, 64)),
        ("shared_simdgroup", (128, 128, 64)),
        ("shared_metal4", (100, 72, 40)),
        ("shared_simdgroup", (100, 72, 40)),
        ("direct", (96, 160, 48)),
    ],
)
def test_gemm_kernels_have_no_races(which, shape):
    from tilelang_metal import examples

    m, n, k = shape
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    ref = a.float() @ b.float()
    if which == "direct":
        kern = jit(examples.gemm_direct_global(m, n, k, out_dtype="float32"), examples.metal4_target())
        c = racecheck(kern, a, b, seeds=(0, 1))
    else:
        target = examples.metal4_target() if which == "shared_metal4" else examples.plain_metal_target()
        kern = jit(examples.gemm_shared(m, n, k), target)
        c = racecheck(kern, a, b, torch.zeros(n), seeds=(0, 1))
    torch.testing.assert_close(c, ref, rtol=1e-3, atol=1e-3)


def test_racy_tilelang_kernels_are_caught():
    import tilelang.language as T

    from tilelang_metal import examples

    @T.prim_func
    def last_writer_wins(A: T.Tensor((128,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(4, threads=32) as bx:
            tx = T.get_thread_binding()
            B[bx] = A[bx * 32 + tx]  # 32 threads write one element

    @T.prim_func
    def shared_rows(A: T.Tensor((128,), "float32"), B: T.Tensor((32,), "float32")):
        with T.Kernel(4, threads=32) as bx:
            tx = T.get_thread_binding()
            B[tx] = A[bx * 32 + tx]  # 4 threadgroups write the same 32 elements

    a = torch.randn(128)
    k = jit(last_writer_wins, examples.metal4_target())
    with pytest.raises(EmulatorRaceError, match=r"data race on device buffer 'B' element \d: write by threadgroup \((\d),0,0\) thread \(\d+,0,0\) \[simdgroup 0, lane \d+\], then write by threadgroup \(\1,0,0\) .*mem_device"):
        racecheck(k, a)
    k = jit(shared_rows, examples.metal4_target())
    with pytest.raises(EmulatorRaceError, match=r"data race on device buffer 'B' element \d+: write by .*different threadgroups"):
        racecheck(k, a)
