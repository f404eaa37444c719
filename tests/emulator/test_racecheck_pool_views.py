"""racecheck tracks initialization per pool view: tilelang's shared-memory planner
(MergeSharedMemoryAllocations) gives a buffer the bytes of an earlier, dead one, so reading a buffer
before writing it reads the other buffer's leftovers, which per-byte tracking of the pool took for
initialized memory."""

from __future__ import annotations

import functools

import pytest
import torch
from test_errors import THREAD_IDX, kernel

from tilelang_metal.emulator import EmulatorRaceError, launch_racecheck, racecheck

TID = "((int)threadIdx.x)"
SYNC = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"


def two_views(second_type: str, second_body: str, name: str, second_offset: int = 0) -> str:
    """a_s (float) and b_s (`second_type`) in one pool; a_s is written, read, then dead."""
    return kernel(
        name,
        ["const device float* __restrict A [[ buffer(0) ]]", "device float* __restrict B [[ buffer(1) ]]", THREAD_IDX],
        "  threadgroup uchar buf_dyn_shmem[512];\n"
        "  threadgroup float* a_s = (threadgroup float*)(buf_dyn_shmem + 0);  // 64 elements\n"
        f"  threadgroup {second_type}* b_s = (threadgroup {second_type}*)(buf_dyn_shmem + {second_offset});  // 64 elements\n"
        f"  a_s[{TID}] = (A[{TID}] * 2.000000e+00f);\n" + SYNC
        + f"  B[{TID}] = a_s[((({TID} + 1)) & 63)];\n" + SYNC + second_body,
        max_threads=64,
    )


def run(src: str) -> torch.Tensor:
    a, b = torch.randn(64, generator=torch.Generator().manual_seed(3)), torch.zeros(64)
    launch_racecheck(src, [a, b], (1, 1, 1), (64, 1, 1), seeds=(0, 1))
    return b


def test_read_of_a_reused_buffer_before_it_is_written_names_both_buffers():
    body = f"  B[{TID}] = (B[{TID}] + b_s[((({TID} + 3)) & 63)]);\n" + SYNC + f"  b_s[{TID}] = A[{TID}];\n"
    with pytest.raises(EmulatorRaceError, match=r"uninitialized read of threadgroup array 'b_s' element \d+ by threadgroup \(0,0,0\) thread \(\d+,0,0\) .*never written through 'b_s' before: .*'a_s' wrote"):
        run(two_views("float", body, "reuse_read_first"))


def test_partly_written_reused_buffer_reports_the_element_it_did_not_write():
    # the even threads fill b_s, every thread then reads its neighbour: odd elements are a_s's leftovers
    body = f"  if ((({TID} & 1) == 0)) {{\n    b_s[{TID}] = A[{TID}];\n  }}\n" + SYNC + f"  B[{TID}] = b_s[({TID} & 62) + 1];\n"
    with pytest.raises(EmulatorRaceError, match=r"uninitialized read of threadgroup array 'b_s' element \d*[13579] .*'a_s' wrote"):
        run(two_views("float", body, "reuse_partly_written"))


def test_reused_bytes_read_through_a_view_of_another_type_are_reported():
    body = f"  B[{TID}] = (float)b_s[{TID}];\n"
    with pytest.raises(EmulatorRaceError, match=r"uninitialized read of threadgroup array 'b_s' element \d+ .*'a_s' wrote"):
        run(two_views("half", body, "reuse_as_half"))


def test_reused_buffer_written_before_it_is_read_is_not_reported():
    body = f"  b_s[{TID}] = (A[{TID}] + 1.000000e+00f);\n" + SYNC + f"  B[{TID}] = (B[{TID}] + b_s[((({TID} + 3)) & 63)]);\n"
    b = run(two_views("float", body, "reuse_written_first"))
    a = torch.randn(64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(b, 2 * a.roll(-1) + (a + 1).roll(-3), rtol=0, atol=0)


def test_buffers_at_different_offsets_keep_per_byte_tracking():
    # b_s has bytes of its own (offset 256): a read before any write is the plain uninitialized read
    body = f"  B[{TID}] = b_s[{TID}];\n"
    with pytest.raises(EmulatorRaceError, match=r"uninitialized read of threadgroup array 'b_s' element \d+ by .*\(never written before\) \(schedule seed"):
        run(two_views("float", body, "separate_views", second_offset=256))


@functools.lru_cache(maxsize=None)
def planner_reuse(read_first: bool):
    """Two shared buffers with disjoint lifetimes (the planner puts them on the same bytes); with
    `read_first` the second one is read before any thread wrote it."""
    import tilelang
    import tilelang.language as T

    n = 64

    @T.prim_func
    def reuse(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n):
            tx = T.get_thread_binding()
            a_s = T.alloc_shared((n,), "float32")
            b_s = T.alloc_shared((n,), "float32")
            a_s[tx] = A[tx] * 2.0
            T.sync_threads()
            B[tx] = a_s[(tx + 1) % n]
            T.sync_threads()
            if read_first:
                B[tx] = B[tx] + b_s[(tx + 3) % n]
                b_s[tx] = A[tx]
            else:
                b_s[tx] = A[tx] + 1.0
                T.sync_threads()
                B[tx] = B[tx] + b_s[(tx + 3) % n]

    return tilelang.compile(reuse, target="metal", execution_backend="emulator")


def test_tilelang_buffer_reusing_a_dead_buffers_bytes_is_reported_when_read_first():
    racy = planner_reuse(True)
    source = racy.get_kernel_source()
    # the premise: the planner merged both buffers onto the same bytes
    assert "a_s = (threadgroup float*)(buf_dyn_shmem + 0)" in source and "b_s = (threadgroup float*)(buf_dyn_shmem + 0)" in source
    a = torch.randn(64)
    with pytest.raises(EmulatorRaceError, match=r"uninitialized read of threadgroup array 'b_s' .*'a_s' wrote"):
        racecheck(racy, a, torch.zeros(64))
    b = torch.zeros(64)
    racecheck(planner_reuse(False), a, b)
    torch.testing.assert_close(b, 2 * a.roll(-1) + (a + 1).roll(-3), rtol=0, atol=0)
