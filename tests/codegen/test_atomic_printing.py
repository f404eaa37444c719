"""MSL text of atomics: native relaxed MSL atomics where Metal has them, one CAS helper per kind
and file where it does not, one element atomic per lane for tile and vector forms."""

from __future__ import annotations

import re

import tilelang
import tilelang.language as T
from tilelang import tvm


def lower(func) -> str:
    target = tvm.target.Target("metal")
    with tvm.transform.PassContext(), target:
        return tilelang.lower(func, target=target).kernel_source


def test_native_and_compare_and_swap_forms():
    @T.prim_func
    def main(I: T.Tensor((64,), "int32"), U: T.Tensor((64,), "uint32"), F: T.Tensor((64,), "float32"), H: T.Tensor((64,), "float16")):
        with T.Kernel(2, threads=32):
            tx = T.get_thread_binding()
            S = T.alloc_shared((64,), "float32")
            T.atomic_add(I[tx], 1)
            T.atomic_min(U[tx], T.uint32(7))
            T.atomic_add(F[tx], 1.0)
            T.atomic_max(F[tx + 1], 2.0)
            T.atomic_max(F[tx + 2], 3.0)
            T.atomic_min(S[tx], 1.0)
            T.atomic_add(H[tx], T.float16(1))
            F[tx + 32] = S[tx]

    src = lower(main)
    assert "atomic_fetch_add_explicit((device atomic_int*)(I + (" in src
    assert "atomic_fetch_min_explicit((device atomic_uint*)(U + (" in src
    assert "atomic_fetch_add_explicit((device atomic_float*)(F + (" in src
    # float max / min: no native MSL overload, a CAS loop on the bits; one definition per kind
    assert len(re.findall(r"inline float __tlm_atomic_max_float\(", src)) == 1
    assert src.count("__tlm_atomic_max_float((device atomic_uint*)(F + (") == 2
    assert "__tlm_atomic_min_float((threadgroup atomic_uint*)(S + (" in src
    assert "inline half __tlm_atomic_add_half(" in src
    assert "memory_order_relaxed" in src and "memory_order_seq_cst" not in src
    assert src.index("__tlm_atomic_max_float(P word") < src.index("[[kernel")  # helpers precede the kernel


def test_tile_atomic_add_is_one_element_atomic_per_lane():
    @T.prim_func
    def main(C: T.Tensor((16, 16), "float32"), A: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=64):
            frag = T.alloc_fragment((16, 16), "float32")
            T.copy(A, frag)
            T.atomic_add(C, frag)

    src = lower(main)
    assert "atomic_fetch_add_explicit((device atomic_float*)(C + (" in src
    assert "float4" not in src.split("atomic_fetch_add_explicit", 1)[1]  # no vector atomics after the load


def test_16_bit_vectorized_atomic_add_is_one_compare_and_swap_per_pair():
    # tilelang's vectorizer turns a 16-bit T.atomic_add in a 2-element-per-thread loop into
    # tl.atomic_addx2_elem_op(address, half2 value): one helper call on the word holding both lanes
    @T.prim_func
    def main(C: T.Tensor((8, 16), "float16"), A: T.Tensor((8, 16), "float16"), B: T.Tensor((8, 16), "bfloat16")):
        with T.Kernel(1, threads=64):
            frag = T.alloc_fragment((8, 16), "float16")
            T.copy(A, frag)
            T.atomic_add(C, frag)
            for i, j in T.Parallel(8, 16):
                T.atomic_add(B[i, j], A[i, j])

    src = lower(main)
    assert len(re.findall(r"inline half2 __tlm_atomic_add_half2\(", src)) == 1
    assert re.search(r"__tlm_atomic_add_half2\(\(device atomic_uint\*\)\(C \+ .*\*\(thread half2\*\)\(frag", src)
    assert re.search(r"__tlm_atomic_add_bfloat2\(\(device atomic_uint\*\)\(B \+ .*bfloat2\(\*\(const device half2\*\)\(A", src)
