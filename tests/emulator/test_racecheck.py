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
        return t, ["bitwise"] * len(t)

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
    from tilelang_metal import kernels as examples

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


def test_inputs_with_a_strided_size_one_dimension_are_compared():
    """`a.t()` of a (1, K) tensor is (K, 1) with strides (1, K): torch calls it contiguous, and the
    schedule comparison must still read its bytes (it raised a RuntimeError from `view`)."""
    from tilelang_metal import kernels as examples

    a = torch.randn(1, 13, dtype=torch.float16).t()  # (13, 1), strides (1, 13)
    assert a.is_contiguous() and a.stride(-1) == 13
    b = torch.randn(13, 97, dtype=torch.float16)
    kern = jit(examples.gemm_direct_global(1, 97, 13, trans_A=True, out_dtype="float32"), examples.metal4_target())
    c = racecheck(kern, a, b, seeds=(0, 1))
    torch.testing.assert_close(c, a.t().float() @ b.float(), rtol=1e-3, atol=1e-3)


def test_racy_tilelang_kernels_are_caught():
    import tilelang.language as T

    from tilelang_metal import kernels as examples

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


# ----------------------------------------------------------------- atomics

HIST = "device int* __restrict H [[ buffer(0) ]]"


def _add(target: str, index: str, value: str = "1", ty: str = "atomic_int", space: str = "device") -> str:
    return f"atomic_fetch_add_explicit(({space} {ty}*)({target} + ({index})), {value}, memory_order_relaxed)"


def atomic_bins(prologue: str = "", epilogue: str = "", name: str = "atomic_bins") -> str:
    """Every thread of every threadgroup adds 1 to bin (thread & 3) of H."""
    return kernel(name, [HIST, "device int* __restrict B [[ buffer(1) ]]", BLOCK_IDX, THREAD_IDX],
                  prologue + f"  {_add('H', TID + ' & 3')};\n" + epilogue, max_threads=64)


def test_atomics_do_not_race_with_each_other():
    h, b = torch.zeros(4, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    launch_racecheck(atomic_bins(), [h, b], (3, 1, 1), (64, 1, 1))
    assert h.tolist() == [48] * 4


def test_plain_store_racing_with_atomic_add_is_reported():
    # thread 0 resets the bin while the others add to it: no barrier orders the store
    src = atomic_bins(f"  if ({TID} == 0) {{\n    H[0] = 0;\n  }}\n", name="reset_then_add")
    msg = race(src, [torch.zeros(4, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)], (1, 1, 1), (64, 1, 1),
               r"data race on device buffer 'H' element 0: (write by .*thread \(0,0,0\).*then atomic write|atomic write by .*then write by .*thread \(0,0,0\))")
    assert "no threadgroup_barrier(mem_flags::mem_device) between them" in msg
    # with the barrier the store is ordered before every add
    ordered = atomic_bins(f"  if ({TID} == 0) {{\n    H[0] = 0;\n  }}\n  threadgroup_barrier(mem_flags::mem_device);\n",
                          name="reset_barrier_add")
    h = torch.full((4,), 7, dtype=torch.int32)
    launch_racecheck(ordered, [h, torch.zeros(64, dtype=torch.int32)], (1, 1, 1), (64, 1, 1))
    assert h.tolist() == [16, 23, 23, 23]


def test_plain_read_racing_with_atomic_add_is_reported():
    read = f"  B[{TID}] = H[0];\n"
    msg = race(atomic_bins(epilogue=read, name="add_then_read"), [torch.zeros(4, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)],
               (1, 1, 1), (64, 1, 1), r"data race on device buffer 'H' element 0: (atomic write by .* then read by|read by .* then atomic write by)")
    b = torch.zeros(64, dtype=torch.int32)
    launch_racecheck(atomic_bins(epilogue="  threadgroup_barrier(mem_flags::mem_device);\n" + read, name="add_barrier_read"),
                     [torch.zeros(4, dtype=torch.int32), b], (1, 1, 1), (64, 1, 1))
    assert b.tolist() == [16] * 64
    # across threadgroups no barrier helps: threadgroup 1 reads while others still add
    race(atomic_bins(epilogue="  threadgroup_barrier(mem_flags::mem_device);\n" + read, name="add_barrier_read_3"),
         [torch.zeros(4, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)], (3, 1, 1), (64, 1, 1),
         r"data race on device buffer 'H' element 0: .*different threadgroups")


def test_atomics_in_threadgroup_memory_need_the_barriers_around_them():
    def shared_bins(racy_reset: bool) -> str:
        sync = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        return kernel(
            "shared_bins" + ("_racy_reset" if racy_reset else ""),
            [HIST, "device int* __restrict B [[ buffer(1) ]]", BLOCK_IDX, THREAD_IDX],
            "  threadgroup int S[4];\n"
            f"  if ({TID} < 4) {{\n    S[{TID}] = 0;\n  }}\n"
            + sync
            # thread 63 resets bin 3 while the other threads add to it
            + (f"  if ({TID} == 63) {{\n    S[3] = 0;\n  }}\n" if racy_reset else "")
            + f"  {_add('S', TID + ' & 3', space='threadgroup')};\n"
            + sync
            + f"  if ({TID} < 4) {{\n    H[((((int)blockIdx.x) * 4) + {TID})] = S[{TID}];\n  }}\n",
            max_threads=64,
        )

    h = torch.zeros(8, dtype=torch.int32)
    launch_racecheck(shared_bins(False), [h, torch.zeros(1, dtype=torch.int32)], (2, 1, 1), (64, 1, 1))
    assert h.tolist() == [16] * 8
    msg = race(shared_bins(True), [torch.zeros(8, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)], (2, 1, 1), (64, 1, 1),
               r"data race on threadgroup array 'S' element 3: (write by .*thread \(63,0,0\).*then atomic write|atomic write by .*then write by .*thread \(63,0,0\))")
    assert "no threadgroup_barrier(mem_flags::mem_threadgroup) between them" in msg


def test_float_atomic_sums_are_compared_within_a_tolerance():
    # The rounding of a float sum depends on the order of the adds (which the schedule picks).
    src = kernel("float_sum", [IN, "device float* __restrict S [[ buffer(1) ]]", BLOCK_IDX, THREAD_IDX],
                 f"  {_add('S', '0', f'A[((((int)blockIdx.x) * 64) + {TID})]', ty='atomic_float')};\n", max_threads=64)
    a = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 1000
    sums = []
    for seed in (0, 1, 2):
        s = torch.zeros(1)
        _race_launch(src, [a, s], (4, 1, 1), (64, 1, 1), seed)
        sums.append(s.item())
    assert len(set(sums)) > 1, "the schedules should round differently"  # else this test proves nothing
    s = torch.zeros(1)
    launch_racecheck(src, [a, s], (4, 1, 1), (64, 1, 1))
    assert abs(s.item() - a.double().sum().item()) < 1e-5 * a.abs().sum().item()


def test_tolerance_is_only_for_float_atomics():
    from tilelang_metal.emulator.instrument import BITWISE, CLOSE, UNCOMPARED, _policies
    from tilelang_metal.emulator.atomic_usage import AtomicUsage

    f, i, other = torch.zeros(4), torch.zeros(4, dtype=torch.int32), torch.zeros(4)
    no_atomics = AtomicUsage(frozenset(), False, False)
    int_atomics = AtomicUsage(frozenset({1}), False, False)
    float_atomics = AtomicUsage(frozenset({0}), True, False)
    tickets = AtomicUsage(frozenset({1}), False, True)
    assert _policies([f, i, other], [(no_atomics, [f, i, other])]) == [BITWISE] * 3
    assert _policies([f, i, other], [(int_atomics, [f, i, other])]) == [BITWISE] * 3
    assert _policies([f, i, other], [(float_atomics, [f, i, other])]) == [CLOSE, BITWISE, CLOSE]
    assert _policies([f, i, other], [(tickets, [f, i, other])]) == [UNCOMPARED, BITWISE, UNCOMPARED]

    def run(seed):
        return [torch.tensor([1000.0, 1.0 + seed])], [CLOSE]  # 1.0 vs 2.0: far beyond rounding

    with pytest.raises(EmulatorRaceError, match=r"beyond float-atomic rounding: launch tensor 0 element 1 is 1.0 with seed 0 and 2.0 with seed 1"):
        _compare_schedules(run, "launch tensor", (0, 1))
    _compare_schedules(lambda seed: ([torch.tensor([1000.0, 1.0 + seed * 1e-3])], [CLOSE]), "launch tensor", (0, 1))


def test_atomic_usage_reads_the_printed_shapes():
    from tilelang_metal.emulator import compile_kernel
    from tilelang_metal.emulator.atomic_usage import atomic_usage

    tickets = kernel("tickets", [HIST, "device int* __restrict T [[ buffer(1) ]]", THREAD_IDX],
                     f"  T[{TID}] = {_add('H', '0')};\n", max_threads=64)
    u = atomic_usage(compile_kernel(tickets, instrument="racecheck").signature)  # the front door's record
    assert u.targets == {0} and u.results_used and not u.float_atomics
    u = atomic_usage(compile_kernel(atomic_bins(), instrument="racecheck").signature)
    assert u.targets == {0} and not u.results_used
    # tickets are schedule-dependent by design: not compared, the counter is (bitwise)
    h, t = torch.zeros(4, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    launch_racecheck(tickets, [h, t], (1, 1, 1), (64, 1, 1))
    assert h[0].item() == 64 and sorted(t.tolist()) == list(range(64))


def test_racy_tilelang_atomics_are_caught_and_correct_ones_pass():
    import tilelang
    import tilelang.language as T

    from tilelang_metal import kernels as examples

    def make(reset_first: bool):
        @T.prim_func
        def reset_and_add(A: T.Tensor((64,), "int32"), B: T.Tensor((2,), "int32")):
            with T.Kernel(2, threads=64) as bx:
                tx = T.get_thread_binding()
                if bx == 0 and tx == 0:
                    B[0] = 0  # plain store; threadgroup 1's atomic adds are not ordered with it
                T.atomic_add(B[0], A[tx])
                T.atomic_max(B[1], A[tx])

        @T.prim_func
        def only_atomics(A: T.Tensor((64,), "int32"), B: T.Tensor((2,), "int32")):
            with T.Kernel(2, threads=64):
                tx = T.get_thread_binding()
                T.atomic_add(B[0], A[tx])
                T.atomic_max(B[1], A[tx])

        func = reset_and_add if reset_first else only_atomics
        return tilelang.compile(func, target=examples.metal4_target(), execution_backend="emulator")

    a = torch.randint(-100, 100, (64,), dtype=torch.int32)
    with pytest.raises(EmulatorRaceError, match=r"data race on device buffer 'B' element 0: (write by .*then atomic write|atomic write by .*then write).*different threadgroups"):
        racecheck(make(True), a, torch.zeros(2, dtype=torch.int32))
    b = torch.tensor([5, -1000], dtype=torch.int32)
    racecheck(make(False), a, b)
    assert b.tolist() == [5 + 2 * int(a.sum()), int(a.max())]


# ----------------------------------------------------------------- the user guide's example


def test_guide_racecheck_example_runs(capsys, tmp_path):
    import pathlib
    import runpy

    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text()
    after = guide.split("<!-- racecheck example", 1)[1]
    block = after.split("```python\n", 1)[1].split("```", 1)[0]
    shown = re.split(r"prints\n\n(?:<!-- doc-test: output -->\n)?```\n", after, maxsplit=1)[1].split("\n```", 1)[0]
    script = tmp_path / "guide_racecheck.py"  # a file: T.prim_func reads its function's source
    script.write_text(block)
    runpy.run_path(str(script))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kernel ")]  # not tilelang's log
    assert printed == [shown]  # seed 0's schedule is deterministic, so the guide shows the real report


def test_garbage_in_registers_is_reported_only_when_it_is_stored():
    # TVM's allreduce shape: every lane shuffles and adds, only lanes < 2 loaded a value, lane 0 stores.
    def allreduce_tail(store_lane: int) -> str:
        return kernel(
            f"allreduce_tail_{store_lane}",
            [IN, OUT, THREAD_IDX],
            "  float v[1];\n  float t[1];\n"
            f"  if (({TID} < 2)) {{\n    v[0] = A[{TID}];\n  }}\n"
            "  t[0] = simd_shuffle_down(v[0], (ushort)(1));\n"
            "  v[0] = (v[0] + t[0]);\n"
            f"  if (({TID} == {store_lane})) {{\n    B[0] = v[0];\n  }}\n",
            max_threads=32,
        )

    a, b = torch.randn(32), torch.zeros(1)
    launch_racecheck(allreduce_tail(0), [a, b], (1, 1, 1), (32, 1, 1))
    assert b.item() == (a[0] + a[1]).item()
    race(allreduce_tail(3), [a, torch.zeros(1)], (1, 1, 1), (32, 1, 1),
         r"uninitialized read of thread array 'v' element 0 by threadgroup \(0,0,0\) thread \(3,0,0\) .*\(it holds a value computed from an uninitialized read\); "
         r"the value can reach device buffer 'B' element 0, stored next")
