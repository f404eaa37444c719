"""MLX's affine quantized matrix-vector kernels (`affine_qmv_fast`, `affine_qmv`, `affine_qvm` of
kernels/quantized.h) and its matrix-matrix kernel for transposed weights (`affine_qmm_t`), unmodified, launched in the emulator the way MLX's host code launches them.
Reused by tests/mlx_reference/test_mlx_quantized.py.

Layout (MLX's affine quantization): a weight matrix quantized along its last axis in groups of
`group_size` values; `w` packs 32 / bits values per uint32, value j of a word in bits
[bits * j, bits * (j + 1)) (little-endian bytes: the kernels read the same words as bytes or uint16
halves); `scales` and `biases` hold one value per group in the activation dtype, and a weight is
`scale * q + bias`. With `transpose` (what `mx.quantized_matmul` defaults to) `w` is N x K and
y = x @ W^T; without it `w` is K x N, quantized along N, and y = x @ W.

Source of every launch value: `mlx/backend/metal/quantized.cpp` (QuantizedMatmul::eval_gpu,
dispatch_qmv, qmv, qvm, qmm, qmm_splitk, get_qmv_batch_limit, qmv_fast_k_alignment) and the instantiations of
`mlx/backend/metal/kernels/quantized.metal`, both of ml-explore/mlx main at 846d17622 (version.h
0.32.2: the newest host code available here). The kernels come from the mlx-metal 0.32.4 wheel, whose
`quantized.h` is newer: `affine_qmv_fast` gained a `partial_rows` template parameter (rows past N
reuse the last row's weights and are not stored; 1-bit weights; a K tail for 1-bit) that the 0.32.2
host code never sets. `qmv(..., partial_rows=True)` launches that variant on an N that is not a
multiple of 8, which the 0.32.2 host sends to `affine_qmv`; the 0.32.4 host's choice is not known here.

Modelled: one unbatched product (x is M x K, w / scales / biases 2-D; from MLX's vector limit on, the
transposed product whose split-K count comes out at 1, which quantized.cpp hands to the plain qmm),
affine mode, no global scale. Each entry point returns `(kernel_family, launch)`; `launch.output` is y.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tilelang_metal.emulator import ForeignKernel, compile_msl

from mlx_gemm import DEFAULT_DEVICE, Device
from mlx_launch import Launch

# get_type_string (mlx/backend/common/compiled.cpp): the type in host names and in the instantiation.
TYPE_STRING = {torch.float16: "float16_t", torch.bfloat16: "bfloat16_t", torch.float32: "float"}
BITS = (2, 3, 4, 5, 6, 8)  # quantized.metal's instantiate_quantized_all (0.32.4 adds 1-bit kernels)
GROUP_SIZES = (32, 64, 128)  # instantiate_quantized_groups


def pack_factor(bits: int, wsize: int = 8) -> int:
    """get_pack_factor (mlx/backend/common/quantized.h): values per `wsize`-bit pack."""
    return 8 if bits in (3, 5) else (4 if bits == 6 else wsize // bits)


def qmv_fast_k_alignment(bits: int) -> int:
    """The K step of qmv_fast_impl that quantized.cpp requires K to be a multiple of for the fast
    kernel: pack_factor(bits, 32) * (1 value-pack per lane for 2-bit, else 2) * 32 lanes."""
    return pack_factor(bits, 32) * (1 if bits == 2 else 2) * 32


def qmv_batch_limit(K: int, N: int, device: Device = DEFAULT_DEVICE) -> int:
    """get_qmv_batch_limit: from this many vectors on, a transposed product is a matrix product (qmm)."""
    size, gen = device.size_class, device.generation
    small, mid = K <= 2048 and N <= 2048, K <= 4096 and N <= 4096
    if gen >= 17 and size != "d":
        return 33 if small else (25 if mid else 13)
    if gen >= 15 and size != "d":
        return 13 if small else (15 if mid else 13)
    if size == "d":
        return 32 if small else (18 if mid else 12)
    if gen >= 13:
        return 14 if small else (10 if mid else 6)
    return 18 if small else (12 if mid else 10)


def route(M: int, N: int, K: int, bits: int, transpose: bool, device: Device = DEFAULT_DEVICE) -> str:
    """The kernel QuantizedMatmul::eval_gpu picks for an unbatched affine product (no global scale):
    "qmm_splitk", "qmm", "qmv_quad", "qmv_wide", "qmv_fast", "qmv", "qvm" or "qvm_split_k"."""
    vector_limit = qmv_batch_limit(K, N, device) if transpose else 4
    if M >= vector_limit:
        return "qmm_splitk" if transpose else "qmm"  # split-K qmm only for transposed, unbatched
    if not transpose:
        return "qvm" if K < 1024 else "qvm_split_k"
    # dispatch_qmv
    if K in (64, 128) and bits & (bits - 1) == 0:
        return "qmv_quad"
    if M >= 2 and device.generation >= 15:  # use_qmv_wide: affine only from gen 15 (M3) on
        return "qmv_wide"
    # qmv: the fast kernel needs whole 8-row tiles and whole K steps
    return "qmv_fast" if N % 8 == 0 and K % qmv_fast_k_alignment(bits) == 0 else "qmv"


# ---------------------------------------------------------------- wrappers

# The one line of our wrapper that is not MLX's: the emulator's shim has no quadgroup functions, and
# quantized.h's qmv_quad_impl calls `quad_sum` on a non-dependent float, so the header does not parse
# without a declaration of it (whatever kernel is instantiated). Declared, never defined: the kernels
# launched here do not call it. The one that does, affine_qmv_quad, is out of reach anyway: the
# emulator rejects its [[quadgroup_index_in_threadgroup]] / [[thread_index_in_quadgroup]] parameters
# ("unsupported attribute", EmulatorCompileError).
SHIM_GAP = "namespace metal { template <typename T> T quad_sum(T); }  // missing from the emulator's shim\n"

# quantized.metal's includes, in its order (steel/gemm/gemm.h for the qmm kernels sharing the header)
_PRELUDE = "#include <metal_stdlib>\n" + SHIM_GAP + "".join(
    f'#include "mlx/backend/metal/kernels/{h}"\n' for h in ("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "quantized.h"))


@functools.lru_cache(maxsize=None)
def _compile(host_name: str, callee: str, include: str) -> ForeignKernel:
    source = _PRELUDE + f'template [[host_name("{host_name}")]] [[kernel]] decltype({callee}) {callee};\n'
    # quantized.h declares align_M / _N / _K (function constants 200-202) for its qmm kernels; the
    # matrix-vector kernels do not read them and MLX's host sets none for them.
    return compile_msl(source, host_name, include_dirs=[include])


def kernel(family: str, dtype: torch.dtype, group_size: int, bits: int, include: str,
           partial_rows: bool = False, aligned_n: bool = True) -> ForeignKernel:
    """One instantiation, named as quantized.metal's instantiate_quantized_batched (and, for qmm_t,
    instantiate_quantized_aligned_batched) names it (batch 0)."""
    t = TYPE_STRING[dtype]
    if family == "qmm_t":  # BM = BK = BN = 32: the template's defaults, which quantized.metal keeps
        aligned = "true" if aligned_n else "false"
        return _compile(f"affine_qmm_t_{t}_gs_{group_size}_b_{bits}_alN_{aligned}_batch_0",
                        f"affine_qmm_t<{t}, {group_size}, {bits}, {aligned}, false>", include)
    if partial_rows:  # not instantiated by the 0.32.2 quantized.metal; the name is ours
        assert family == "qmv_fast"
        return _compile(f"affine_qmv_fast_partial_rows_{t}_gs_{group_size}_b_{bits}_batch_0",
                        f"affine_qmv_fast<{t}, {group_size}, {bits}, false, true>", include)
    return _compile(f"affine_{family}_{t}_gs_{group_size}_b_{bits}_batch_0",
                    f"affine_{family}<{t}, {group_size}, {bits}, false>", include)


def _check(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int,
           bits: int, transpose: bool) -> tuple[int, int, int]:
    if x.dtype not in TYPE_STRING or scales.dtype != x.dtype or biases.dtype != x.dtype:
        raise ValueError(f"x, scales and biases must share one of {list(TYPE_STRING)}, got {x.dtype}, {scales.dtype}, {biases.dtype}")
    if w.dtype != torch.uint32:
        raise ValueError(f"w must be packed uint32, got {w.dtype}")
    if bits not in BITS or group_size not in GROUP_SIZES:
        raise ValueError(f"quantized.metal instantiates bits {BITS} and group sizes {GROUP_SIZES}, got {bits}, {group_size}")
    for t in (x, w, scales, biases):
        if t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 2:
            raise ValueError("pass contiguous 2-D CPU tensors")
    M, K = x.shape
    rows, cols = w.shape[0], w.shape[1] * 32 // bits  # 32 / bits values a word (3, 5, 6 bits: byte packs)
    N = rows if transpose else cols
    if (cols if transpose else rows) != K:
        raise ValueError(f"w unpacks to {rows} x {cols}, which does not fit x's K = {K} (transpose={transpose})")
    if scales.shape != (rows, cols // group_size) or biases.shape != scales.shape:
        raise ValueError(f"scales / biases must be {rows} x {cols // group_size}, got {tuple(scales.shape)} / {tuple(biases.shape)}")
    return int(M), int(N), int(K)


def _unbatched_tail() -> tuple[Any, ...]:
    """Buffers 7-14 (qmm: 8-15; x / w batch shapes and strides): add_strides_and_shapes skips them when there is
    one batch, so MLX leaves them unset and the unbatched kernels never read them. The emulator binds
    every index: zero counts and empty-looking shapes that would show if they were read."""
    i32, i64 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    return (0, i32, i64, 0, i32.clone(), i64.clone(), i64.clone(), i64.clone())


def qmv(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, *, group_size: int,
        bits: int, include: str, device: Device = DEFAULT_DEVICE, partial_rows: bool = False) -> tuple[str, Launch]:
    """y = x @ dequant(w)^T (w N x K) with `affine_qmv_fast` or `affine_qmv`, chosen and launched as
    quantized.cpp's qmv does; `partial_rows` launches the 0.32.4 `affine_qmv_fast<..., partial_rows>`
    instead (see the module docstring)."""
    M, N, K = _check(x, w, scales, biases, group_size, bits, True)
    family = route(M, N, K, bits, True, device)
    if partial_rows:
        if K % qmv_fast_k_alignment(bits):
            raise ValueError(f"partial_rows keeps qmv_fast's K loop: K must be a multiple of {qmv_fast_k_alignment(bits)}")
        family = "qmv_fast"
    elif family not in ("qmv_fast", "qmv"):
        raise NotImplementedError(f"MLX dispatches M={M}, N={N}, K={K}, {bits}-bit to {family}, not modelled here")
    # qmv: two simdgroups of 32 lanes, results_per_simdgroup 4 (2 only for nvfp4 on an M5 Max), so
    # bn = 8 output rows per threadgroup; grid (M, ceil(N / bn), B) with B = 1.
    results_per_simdgroup = 4
    bn = 2 * results_per_simdgroup
    grid, block = (M, (N + bn - 1) // bn, 1), (32, 2, 1)
    k = kernel(family, x.dtype, group_size, bits, include, partial_rows)
    y = torch.full((M, N), float("nan"), dtype=x.dtype)  # every output must be written
    # buffers: 0 w, 1 scales, 2 biases, 3 x, 4 y, 5 K (in_vec_size), 6 N (out_vec_size), 7-14 batch
    launch = Launch.of(y, (k, (w, scales, biases, x, y, K, N, *_unbatched_tail()), grid, block))
    launch.run()
    return family, launch


def qvm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, *, group_size: int,
        bits: int, include: str, device: Device = DEFAULT_DEVICE) -> tuple[str, Launch]:
    """y = x @ dequant(w) (w K x N, quantized along N) with `affine_qvm`, launched as quantized.cpp's
    qvm does (QuantizedMatmul with transpose=False, fewer than 4 vectors and K < 1024)."""
    M, N, K = _check(x, w, scales, biases, group_size, bits, False)
    family = route(M, N, K, bits, False, device)
    if family != "qvm":
        raise NotImplementedError(f"MLX dispatches M={M}, N={N}, K={K} (transpose=False) to {family}, not modelled here")
    # qvm: two simdgroups of bk = 32 lanes; bn = min(group_size, 32) * 2 output columns per threadgroup
    # (each simdgroup writes 32 columns: 32 / pack_factor words of each of the 32 rows it reads at once)
    bn = min(group_size, 32) * 2
    grid, block = (M, (N + bn - 1) // bn, 1), (32, 2, 1)
    k = kernel("qvm", x.dtype, group_size, bits, include)
    y = torch.full((M, N), float("nan"), dtype=x.dtype)
    launch = Launch.of(y, (k, (w, scales, biases, x, y, K, N, *_unbatched_tail()), grid, block))
    launch.run()
    return family, launch


QMM_TILE = 32  # qmm's bm = bn (and the kernel's BK): 2 x 2 simdgroups of 32 lanes per threadgroup


def qmm_split_k(M: int, N: int, K: int, group_size: int) -> int:
    """qmm_splitk's partition count: about 512 threadgroups, each partition whole groups and whole
    32-wide K tiles, K divisible by the partitions; 1 means quantized.cpp runs the plain qmm."""
    tiles = -(-N // QMM_TILE) * -(-M // QMM_TILE)
    k_align = max(group_size, QMM_TILE)
    split = min(max(1, 512 // tiles), K // k_align)
    while split > 1 and K % (split * k_align):
        split -= 1
    return split


def qmm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, *, group_size: int,
        bits: int, include: str, device: Device = DEFAULT_DEVICE,
        dispatch_shape: tuple[int, int] | None = None) -> tuple[str, Launch]:
    """y = x @ dequant(w)^T (w N x K) with `affine_qmm_t`, launched as quantized.cpp's qmm does for a
    transposed product of at least get_qmv_batch_limit vectors whose split-K count is 1 (on a device
    without neural accelerators: the NAX branch of qmm is not modelled). `dispatch_shape` (M, N): the
    product whose dispatch is checked when x and w are a proxy of it (one tile's work is the same;
    the proxy alone, with fewer tiles, would be split along K)."""
    M, N, K = _check(x, w, scales, biases, group_size, bits, True)
    routed_m, routed_n = dispatch_shape or (M, N)
    family = route(routed_m, routed_n, K, bits, True, device)
    if family != "qmm_splitk":
        raise NotImplementedError(f"MLX dispatches M={routed_m}, N={routed_n}, K={K}, {bits}-bit to {family}, not to qmm")
    split = qmm_split_k(routed_m, routed_n, K, group_size)
    if split > 1:
        raise NotImplementedError(f"MLX splits M={routed_m}, N={routed_n}, K={K} into {split} K partitions "
                                  "(affine_qmm_t_splitk), not modelled here")
    # grid (ceil(N / bn), ceil(M / bm), B), threadgroup (32, wn, wm) = (32, 2, 2); aligned_N when N % 32 == 0
    grid, block = (-(-N // QMM_TILE), -(-M // QMM_TILE), 1), (32, 2, 2)
    k = kernel("qmm_t", x.dtype, group_size, bits, include, aligned_n=N % QMM_TILE == 0)  # the launched N's
    y = torch.full((M, N), float("nan"), dtype=x.dtype)
    # buffers: 0 w, 1 scales, 2 biases, 3 x, 4 y, 5 K, 6 N, 7 M, 8-15 batch shapes and strides (unset)
    launch = Launch.of(y, (k, (w, scales, biases, x, y, K, N, M, *_unbatched_tail()), grid, block))
    launch.run()
    return "qmm_t", launch
