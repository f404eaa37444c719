"""Per-buffer checks inside merged threadgroup pools (`shared.dyn`): each typed view is checked
against its own extent and alignment, not only against the pool."""

from __future__ import annotations

import re

import pytest
import torch
from test_errors import BLOCK_IDX, THREAD_IDX, kernel, launch_fails

from tilelang_metal.emulator import compile_kernel
from tilelang_metal.emulator.handwritten import with_artifact
from tilelang_metal.emulator.signature import rewrite

OUT = "device float* __restrict C [[ buffer(0) ]]"
POOL = (
    "  threadgroup uchar buf_dyn_shmem[{pool}];\n"
    "  threadgroup half* A_s = (threadgroup half*)(buf_dyn_shmem + {a_off});\n"
    "  threadgroup float B_s = (threadgroup float*)(buf_dyn_shmem + {b_off});\n"
).replace("threadgroup float B_s", "threadgroup float* B_s")


def pool_kernel(name: str, body: str, pool: int = 768, a_off: int = 0, b_off: int = 256) -> str:
    return kernel(name, [OUT, THREAD_IDX], POOL.format(pool=pool, a_off=a_off, b_off=b_off) + body)


def test_view_extents_come_from_the_next_offset():
    sig = rewrite(with_artifact(pool_kernel("views", "  C[0] = 0.0f;\n")), checked=True).signature
    ends = {v.name: v.end for v in sig.threadgroup_views}
    assert ends == {"A_s": 256, "B_s": None}


def test_in_bounds_pool_accesses_run():
    body = (
        "  A_s[((int)threadIdx.x)] = (half)((int)threadIdx.x);\n"
        "  B_s[((int)threadIdx.x)] = 2.0f * ((float)((int)threadIdx.x));\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  C[((int)threadIdx.x)] = ((float)A_s[(127 - ((int)threadIdx.x))]) + B_s[(127 - ((int)threadIdx.x))];\n"
    )
    c = torch.zeros(128)
    compile_kernel(pool_kernel("pool_ok", body, pool=768)).launch([c], (1, 1, 1), (128, 1, 1))
    t = torch.arange(127, -1, -1, dtype=torch.float32)
    assert torch.equal(c, 3 * t)


def test_store_past_a_view_into_its_neighbour_is_reported():
    # A_s holds 128 halves (bytes 0..256); element 128 is inside the pool but belongs to B_s.
    body = "  A_s[(((int)threadIdx.x) + 1)] = (half)1.0f;\n  C[((int)threadIdx.x)] = 0.0f;\n"
    launch_fails(
        pool_kernel("pool_spill", body),
        re.escape("threadgroup array 'A_s': element index 128, buffer extent 128 elements")
        + r".*thread \(127,0,0\)",
        [torch.zeros(128)], (1, 1, 1), (128, 1, 1),
    )


def test_last_view_is_bounded_by_the_pool():
    body = "  B_s[(((int)threadIdx.x) + 1)] = 1.0f;\n  C[((int)threadIdx.x)] = 0.0f;\n"
    launch_fails(pool_kernel("pool_end", body), re.escape("'B_s': element index 128, buffer extent 128"), [torch.zeros(128)], (1, 1, 1), (128, 1, 1))


def test_vector_alignment_is_relative_to_the_pool():
    # B_s starts 8 bytes (two floats) into the pool: a float4 at view index 0 is misaligned in memory.
    body = "  *(threadgroup float4*)(B_s + 0) = float4(1.0f);\n  C[((int)threadIdx.x)] = 0.0f;\n"
    launch_fails(
        pool_kernel("pool_vec_misaligned", body, b_off=264),
        r"misaligned vector access to threadgroup array 'B_s': 4-element vector",
        [torch.zeros(128)], (1, 1, 1), (1, 1, 1),
    )


def test_view_not_aligned_to_its_element_is_reported():
    body = "  B_s[0] = 1.0f;\n  C[((int)threadIdx.x)] = 0.0f;\n"
    launch_fails(
        pool_kernel("pool_view_misaligned", body, b_off=258),
        re.escape("threadgroup view 'B_s' starts at byte 258 of pool 'buf_dyn_shmem' (768 bytes): not a multiple of its element size 4"),
        [torch.zeros(128)], (1, 1, 1), (1, 1, 1),
    )


def test_unchecked_build_keeps_views_as_raw_pointers():
    src = pool_kernel("pool_raw", "  C[((int)threadIdx.x)] = 0.0f;\n")
    text = rewrite(with_artifact(src), checked=False).text
    assert "threadgroup half* A_s = (threadgroup half*)(buf_dyn_shmem + 0);" in text


@pytest.fixture(scope="module")
def shared_gemm_msl() -> str:
    import tilelang

    from tilelang_metal import kernels as examples

    with pytest.MonkeyPatch.context() as mp:  # keep the staging (its views are what is tested)
        mp.setenv("TILELANG_METAL_STAGING_BYPASS", "0")
        k = tilelang.compile(examples.gemm_shared(64, 64, 64), out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator")
        return k.get_kernel_source()


def test_real_shared_gemm_views_are_checked(shared_gemm_msl):
    sig = rewrite(shared_gemm_msl, checked=True).signature
    assert {v.name for v in sig.threadgroup_views} == {"A_s", "B_s"}
    a = torch.randn(64, 64, dtype=torch.float16)
    b = torch.randn(64, 64, dtype=torch.float16)
    c = torch.full((64, 64), float("nan"))
    compile_kernel(shared_gemm_msl).launch([a, b, c], (1, 1, 1), (128, 1, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    # The same kernel with A_s's staging store shifted by one tile lands in B_s: reported.
    staging = re.search(r"\*\(threadgroup half4\*\)\(A_s \+ \((\w+)", shared_gemm_msl)
    assert staging is not None
    bad = shared_gemm_msl.replace(staging.group(0), staging.group(0) + " + 2048", 1)
    launch_fails(bad, r"threadgroup array 'A_s': 4-element vector at element index \d+, buffer extent 2048", [a, b, c], (1, 1, 1), (128, 1, 1))
