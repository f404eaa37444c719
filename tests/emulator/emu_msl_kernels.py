"""Hand-written MSL kernels in the exact shape of docs/msl_contract.md, used by the emulator tests
and the benchmark. Each function returns one complete MSL file."""

from __future__ import annotations

HEADER = """// tilelang_metal test: {name}
#include <metal_stdlib>
#include <metal_simdgroup>
{mpp}using namespace metal;

"""

MPP_INCLUDE = "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n"


def header(name: str, mpp: bool = False) -> str:
    return HEADER.format(name=name, mpp=MPP_INCLUDE if mpp else "")


def add_half4() -> str:
    """C = A + B over half4 vectors; 128 threads x 4 elements per threadgroup."""
    return header("add_half4") + """[[kernel, max_total_threads_per_threadgroup(128)]] void add_half4(
  const device half* __restrict A [[ buffer(0) ]],
  const device half* __restrict B [[ buffer(1) ]],
  device half* __restrict C [[ buffer(2) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint3 threadIdx [[thread_position_in_threadgroup]]) {
  int off = ((((int)blockIdx.x) * 512) + (((int)threadIdx.x) * 4));
  half4 a = *(const device half4*)(A + off);
  half4 b = *(const device half4*)(B + off);
  *(device half4*)(C + off) = (a + b);
}
"""


def reverse_tile(with_barrier: bool = True) -> str:
    """B[tile] = reversed A[tile] through threadgroup memory (128 floats per threadgroup)."""
    barrier = "  threadgroup_barrier(mem_flags::mem_threadgroup);\n" if with_barrier else ""
    name = "reverse_tile" if with_barrier else "reverse_tile_no_barrier"
    return header(name) + f"""[[kernel, max_total_threads_per_threadgroup(128)]] void {name}(
  const device float* __restrict A [[ buffer(0) ]],
  device float* __restrict B [[ buffer(1) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint3 threadIdx [[thread_position_in_threadgroup]]) {{
  threadgroup float A_shared[128];
  A_shared[((int)threadIdx.x)] = A[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))];
{barrier}  B[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))] = A_shared[(127 - ((int)threadIdx.x))];
}}
"""


def first_group_writes_shared() -> str:
    """Only threadgroup 0 writes its threadgroup array; every group copies it out after a barrier."""
    return header("first_group_writes_shared") + """[[kernel, max_total_threads_per_threadgroup(64)]] void first_group_writes_shared(
  device float* __restrict B [[ buffer(0) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint3 threadIdx [[thread_position_in_threadgroup]]) {
  threadgroup half H_shared[64];
  threadgroup float F_shared[64];
  if (((int)blockIdx.x) == 0) {
    H_shared[((int)threadIdx.x)] = (half)1.000000e+00f;
    F_shared[((int)threadIdx.x)] = 2.000000e+00f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  B[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))] = ((float)H_shared[((int)threadIdx.x)]);
  B[(((((int)blockIdx.x) * 128) + 64) + ((int)threadIdx.x))] = F_shared[((int)threadIdx.x)];
}
"""


def simd_collectives() -> str:
    """Reductions and shuffles over each simdgroup of a 128-thread threadgroup."""
    return header("simd_collectives") + """[[kernel, max_total_threads_per_threadgroup(128)]] void simd_collectives(
  const device float* __restrict X [[ buffer(0) ]],
  device float* __restrict Red [[ buffer(1) ]],
  device float* __restrict Butterfly [[ buffer(2) ]],
  device float* __restrict Shuf [[ buffer(3) ]],
  device int* __restrict Flags [[ buffer(4) ]],
  device half* __restrict HalfSum [[ buffer(5) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint3 threadIdx [[thread_position_in_threadgroup]],
  uint __simd_group_id [[simdgroup_index_in_threadgroup]],
  ushort __lane [[thread_index_in_simdgroup]]) {
  int gid = ((((int)blockIdx.x) * 128) + ((int)threadIdx.x));
  float v = X[gid];
  float s = simd_sum(v);
  float mx = simd_max(v);
  float mn = simd_min(v);
  half hs = simd_sum(((half)v));
  float x = v;
  for (ushort off = (ushort)16; off > (ushort)0; off = (ushort)(off >> 1)) {
    x = (x + simd_shuffle_xor(x, off));
  }
  Butterfly[gid] = x;
  simdgroup_barrier(mem_flags::mem_none);
  threadgroup_barrier(mem_flags::mem_device);
  if (((int)__lane) == 0) {
    int r = ((((int)blockIdx.x) * 4) + ((int)__simd_group_id));
    Red[(r * 3)] = s;
    Red[((r * 3) + 1)] = mx;
    Red[((r * 3) + 2)] = mn;
    HalfSum[r] = hs;
  }
  float4 sh = float4(simd_shuffle_up(v, (ushort)1), simd_shuffle_down(v, (ushort)3), simd_broadcast(v, (ushort)5),
                     simd_shuffle(v, (ushort)(31 - ((int)__lane))));
  *(device float4*)(Shuf + (gid * 4)) = sh;
  Flags[(gid * 2)] = ((int)simd_any((v > 2.000000e+00f)));
  Flags[((gid * 2) + 1)] = ((int)simd_all((v > -1.000000e+02f)));
}
"""


def simdgroup_gemm(elem: str, *, transpose_b: bool = False, store: str = "simdgroup_store") -> str:
    """C(64x64, float) = A(64x64) @ B(64x64) with 8x8 simdgroup matrices.

    Threadgroup tile 32x32, 128 threads = 4 simdgroups each owning 16x16 (2x2 fragments), K in steps
    of 16 staged through threadgroup memory. With transpose_b the B buffer holds B^T (N x K) and the
    fragments are loaded with transpose = true. `store` is "simdgroup_store" or "thread_elements"
    (the latter writes C with the documented 8x8 lane layout)."""
    frag = {"half": "simdgroup_half8x8", "float": "simdgroup_float8x8", "bfloat": "simdgroup_bfloat8x8"}[elem]
    name = f"sg_gemm_{elem}{'_bt' if transpose_b else ''}_{store}"
    if transpose_b:
        b_stage = "      B_shared[idx] = B[((((((int)blockIdx.x) * 32) + (idx >> 4)) * 64) + (ko * 16)) + (idx & 15)];"
        b_load = (
            "      for (int j = 0; j < 2; ++j) {\n"
            "        simdgroup_load(B_frag[j], B_shared + ((((wn * 16) + (j * 8)) * 16) + (ki * 8)), 16, ulong2(0, 0), true);\n"
            "      }"
        )
    else:
        b_stage = "      B_shared[idx] = B[(((((ko * 16) + (idx >> 5)) * 64) + (((int)blockIdx.x) * 32)) + (idx & 31))];"
        b_load = (
            "      for (int j = 0; j < 2; ++j) {\n"
            "        simdgroup_load(B_frag[j], B_shared + (((ki * 8) * 32) + ((wn * 16) + (j * 8))), 32, ulong2(0, 0), false);\n"
            "      }"
        )
    if store == "simdgroup_store":
        store_code = """  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      simdgroup_store(C_frag[((i * 2) + j)], C + ((((((int)blockIdx.y) * 32) + (wm * 16)) + (i * 8)) * 64 + (((((int)blockIdx.x) * 32) + (wn * 16)) + (j * 8))), 64, ulong2(0, 0), false);
    }
  }"""
    else:
        store_code = """  int q = (((int)__lane) / 4);
  int row = ((q & 4) + ((((int)__lane) / 2) % 4));
  int col = (((q & 2) * 2) + ((((int)__lane) % 2) * 2));
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      int cr = ((((((int)blockIdx.y) * 32) + (wm * 16)) + (i * 8)) + row);
      int cc = ((((((int)blockIdx.x) * 32) + (wn * 16)) + (j * 8)) + col);
      for (int e = 0; e < 2; ++e) {
        C[((cr * 64) + (cc + e))] = C_frag[((i * 2) + j)].thread_elements()[e];
      }
    }
  }"""
    return header(name) + f"""[[kernel, max_total_threads_per_threadgroup(128)]] void {name}(
  const device {elem}* __restrict A [[ buffer(0) ]],
  const device {elem}* __restrict B [[ buffer(1) ]],
  device float* __restrict C [[ buffer(2) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint3 threadIdx [[thread_position_in_threadgroup]],
  uint __simd_group_id [[simdgroup_index_in_threadgroup]],
  ushort __lane [[thread_index_in_simdgroup]]) {{
  threadgroup {elem} A_shared[512];
  threadgroup {elem} B_shared[512];
  simdgroup_float8x8 C_frag[4];
  {frag} A_frag[2];
  {frag} B_frag[2];
  for (int i = 0; i < 4; ++i) {{
    C_frag[i] = make_filled_simdgroup_matrix<float, 8, 8>(0.000000e+00f);
  }}
  int wm = (((int)__simd_group_id) / 2);
  int wn = (((int)__simd_group_id) % 2);
  for (int ko = 0; ko < 4; ++ko) {{
    for (int i = 0; i < 4; ++i) {{
      int idx = ((i * 128) + ((int)threadIdx.x));
      A_shared[idx] = A[((((((int)blockIdx.y) * 32) + (idx >> 4)) * 64) + ((ko * 16) + (idx & 15)))];
{b_stage}
    }}
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int ki = 0; ki < 2; ++ki) {{
      for (int i = 0; i < 2; ++i) {{
        simdgroup_load(A_frag[i], A_shared + ((((wm * 16) + (i * 8)) * 16) + (ki * 8)), 16, ulong2(0, 0), false);
      }}
{b_load}
      for (int i = 0; i < 2; ++i) {{
        for (int j = 0; j < 2; ++j) {{
          simdgroup_multiply_accumulate(C_frag[((i * 2) + j)], A_frag[i], B_frag[j], C_frag[((i * 2) + j)]);
        }}
      }}
    }}
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }}
{store_code}
}}
"""


# The cooperative-tensor layout formulas of docs/msl_contract.md, as MSL expressions of lane `l`
# and element `e`. Tests mutate them to prove that a wrong emitter mapping fails numerically.
CT_ROW = "(((((int)__lane >> 2) & 4) + (((int)__lane >> 1) & 3)) + (8 * ((e >> 2) & 1)))"
CT_COL = "(((16 * (e >> 3)) + (4 * ((((int)__lane >> 2) & 2) + ((int)__lane & 1)))) + (e & 3))"


def mpp_gemm(
    elem: str = "half",
    *,
    M: int = 64,
    N: int = 128,
    K: int = 64,
    store: str = "multidim",
    mode: str = "multiply_accumulate",
    ct_row: str = CT_ROW,
    ct_col: str = CT_COL,
) -> str:
    """C(MxN, float) = A(MxK) @ B(KxN) with MPP matmul2d(16, 32, 16) cooperative tensors.

    Threadgroup tile 32x64, 128 threads = 4 simdgroups each owning one 16x32 destination tensor.
    Every lane fills its left/right elements straight from device memory with the documented layout;
    the destination is stored with get_multidimensional_index (store="multidim") or with the layout
    formula (store="formula"). mode="multiply" runs a single K step without initialising the
    destination (K must be 16)."""
    assert M % 32 == 0 and N % 64 == 0 and K % 16 == 0
    if mode == "multiply":
        assert K == 16
    name = f"mpp_gemm_{elem}_{store}_{mode}"
    init = (
        "  for (int e = 0; e < 16; ++e) {\n    C_ct0[e] = 0.000000e+00f;\n  }\n" if mode == "multiply_accumulate" else ""
    )
    if store == "multidim":
        store_code = f"""  for (int e = 0; e < C_ct0.get_capacity(); ++e) {{
    if (C_ct0.is_valid_element(e)) {{
      auto __idx = C_ct0.get_multidimensional_index(e);
      C[(((m0 + ((int)__idx[1])) * {N}) + (n0 + ((int)__idx[0])))] = C_ct0[e];
    }}
  }}"""
    else:
        store_code = f"""  for (int e = 0; e < 16; ++e) {{
    C[(((m0 + {CT_ROW}) * {N}) + (n0 + {CT_COL}))] = C_ct0[e];
  }}"""
    relaxed = "false" if elem == "float" else "true"  # exact fp32, as the plugin prints it (the emulator rounds relaxed fp32 inputs)
    return header(name, mpp=True) + f"""[[kernel, max_total_threads_per_threadgroup(128)]] void {name}(
  const device {elem}* __restrict A [[ buffer(0) ]],
  const device {elem}* __restrict B [[ buffer(1) ]],
  device float* __restrict C [[ buffer(2) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint __simd_group_id [[simdgroup_index_in_threadgroup]],
  ushort __lane [[thread_index_in_simdgroup]]) {{
  constexpr auto __desc = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, false, false, {relaxed},
      mpp::tensor_ops::matmul2d_descriptor::mode::{mode});
  mpp::tensor_ops::matmul2d<__desc, metal::execution_simdgroup> __op;
  auto __ct_a = __op.get_left_input_cooperative_tensor<{elem}, {elem}, float>();
  auto __ct_b = __op.get_right_input_cooperative_tensor<{elem}, {elem}, float>();
  auto C_ct0 = __op.get_destination_cooperative_tensor<decltype(__ct_a), decltype(__ct_b), float>();
  int m0 = ((((int)blockIdx.y) * 32) + ((((int)__simd_group_id) >> 1) * 16));
  int n0 = ((((int)blockIdx.x) * 64) + ((((int)__simd_group_id) & 1) * 32));
{init}  for (int ko = 0; ko < {K // 16}; ++ko) {{
    for (int e = 0; e < 8; ++e) {{
      __ct_a[e] = A[(((m0 + {ct_row}) * {K}) + ((ko * 16) + {ct_col}))];
    }}
    for (int e = 0; e < 16; ++e) {{
      __ct_b[e] = B[((((ko * 16) + {ct_row}) * {N}) + (n0 + {ct_col}))];
    }}
    __op.run(__ct_a, __ct_b, C_ct0);
  }}
{store_code}
}}
"""


def mpp_gemm_bench(M: int = 1024, N: int = 1024, K: int = 1024) -> str:
    """Benchmark GEMM: C(float) = A(half) @ B(half), threadgroup tile 64x128, 128 threads = 4
    simdgroups each owning 32x64 = 2x2 destination tensors, K loop in steps of 16. Operands are
    read from device memory with half4 vector loads (elements 4q..4q+3 are consecutive columns)."""
    return header("mpp_gemm_bench", mpp=True) + f"""[[kernel, max_total_threads_per_threadgroup(128)]] void mpp_gemm_bench(
  const device half* __restrict A [[ buffer(0) ]],
  const device half* __restrict B [[ buffer(1) ]],
  device float* __restrict C [[ buffer(2) ]],
  uint3 blockIdx [[threadgroup_position_in_grid]],
  uint __simd_group_id [[simdgroup_index_in_threadgroup]],
  ushort __lane [[thread_index_in_simdgroup]]) {{
  constexpr auto __desc = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, false, false, true,
      mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  mpp::tensor_ops::matmul2d<__desc, metal::execution_simdgroup> __op;
  auto __ct_a0 = __op.get_left_input_cooperative_tensor<half, half, float>();
  auto __ct_a1 = __op.get_left_input_cooperative_tensor<half, half, float>();
  auto __ct_b0 = __op.get_right_input_cooperative_tensor<half, half, float>();
  auto __ct_b1 = __op.get_right_input_cooperative_tensor<half, half, float>();
  auto C_ct0 = __op.get_destination_cooperative_tensor<decltype(__ct_a0), decltype(__ct_b0), float>();
  auto C_ct1 = __op.get_destination_cooperative_tensor<decltype(__ct_a0), decltype(__ct_b0), float>();
  auto C_ct2 = __op.get_destination_cooperative_tensor<decltype(__ct_a0), decltype(__ct_b0), float>();
  auto C_ct3 = __op.get_destination_cooperative_tensor<decltype(__ct_a0), decltype(__ct_b0), float>();
  int m0 = ((((int)blockIdx.y) * 64) + ((((int)__simd_group_id) >> 1) * 32));
  int n0 = ((((int)blockIdx.x) * 128) + ((((int)__simd_group_id) & 1) * 64));
  int lr = ((((int)__lane >> 2) & 4) + (((int)__lane >> 1) & 3));
  int lc = (4 * ((((int)__lane >> 2) & 2) + ((int)__lane & 1)));
  for (int e = 0; e < 16; ++e) {{
    C_ct0[e] = 0.000000e+00f;
    C_ct1[e] = 0.000000e+00f;
    C_ct2[e] = 0.000000e+00f;
    C_ct3[e] = 0.000000e+00f;
  }}
  for (int ko = 0; ko < {K // 16}; ++ko) {{
    for (int q = 0; q < 2; ++q) {{
      half4 a0 = *(const device half4*)(A + ((((m0 + lr) + (8 * q)) * {K}) + ((ko * 16) + lc)));
      half4 a1 = *(const device half4*)(A + (((((m0 + 16) + lr) + (8 * q)) * {K}) + ((ko * 16) + lc)));
      __ct_a0[(q * 4)] = a0.x; __ct_a0[((q * 4) + 1)] = a0.y; __ct_a0[((q * 4) + 2)] = a0.z; __ct_a0[((q * 4) + 3)] = a0.w;
      __ct_a1[(q * 4)] = a1.x; __ct_a1[((q * 4) + 1)] = a1.y; __ct_a1[((q * 4) + 2)] = a1.z; __ct_a1[((q * 4) + 3)] = a1.w;
    }}
    for (int q = 0; q < 4; ++q) {{
      int kr = (((ko * 16) + lr) + (8 * (q & 1)));
      int nc = ((16 * (q >> 1)) + lc);
      half4 b0 = *(const device half4*)(B + ((kr * {N}) + (n0 + nc)));
      half4 b1 = *(const device half4*)(B + ((kr * {N}) + ((n0 + 32) + nc)));
      __ct_b0[(q * 4)] = b0.x; __ct_b0[((q * 4) + 1)] = b0.y; __ct_b0[((q * 4) + 2)] = b0.z; __ct_b0[((q * 4) + 3)] = b0.w;
      __ct_b1[(q * 4)] = b1.x; __ct_b1[((q * 4) + 1)] = b1.y; __ct_b1[((q * 4) + 2)] = b1.z; __ct_b1[((q * 4) + 3)] = b1.w;
    }}
    __op.run(__ct_a0, __ct_b0, C_ct0);
    __op.run(__ct_a0, __ct_b1, C_ct1);
    __op.run(__ct_a1, __ct_b0, C_ct2);
    __op.run(__ct_a1, __ct_b1, C_ct3);
  }}
  for (int q = 0; q < 4; ++q) {{
    int r = (lr + (8 * (q & 1)));
    int c = ((16 * (q >> 1)) + lc);
    *(device float4*)(C + (((m0 + r) * {N}) + (n0 + c))) = float4(C_ct0[(q * 4)], C_ct0[((q * 4) + 1)], C_ct0[((q * 4) + 2)], C_ct0[((q * 4) + 3)]);
    *(device float4*)(C + (((m0 + r) * {N}) + ((n0 + 32) + c))) = float4(C_ct1[(q * 4)], C_ct1[((q * 4) + 1)], C_ct1[((q * 4) + 2)], C_ct1[((q * 4) + 3)]);
    *(device float4*)(C + ((((m0 + 16) + r) * {N}) + (n0 + c))) = float4(C_ct2[(q * 4)], C_ct2[((q * 4) + 1)], C_ct2[((q * 4) + 2)], C_ct2[((q * 4) + 3)]);
    *(device float4*)(C + ((((m0 + 16) + r) * {N}) + ((n0 + 32) + c))) = float4(C_ct3[(q * 4)], C_ct3[((q * 4) + 1)], C_ct3[((q * 4) + 2)], C_ct3[((q * 4) + 3)]);
  }}
}}
"""
