"""MLX's GEMM kernels (steel GEMM, split-K GEMM, GEMV), unmodified, launched in the emulator the way
MLX's host code launches them. Reused by tests/mlx_reference/test_mlx_gemm.py and by benchmarks.

Source of every launch value: `mlx/backend/metal/matmul.cpp` of MLX v0.32.1 (unchanged up to the
0.32.x tree whose kernel headers are byte-identical to the mlx-metal 0.32.4 wheel's steel GEMM, split-K
and GEMV headers); the functions are named in each comment. The wrappers are our own `.metal`-like
sources: they include MLX's headers as MLX's `steel_gemm_fused.metal`, `steel_gemm_splitk.metal` and
`gemv.metal` do and instantiate one template each with `template [[host_name(...)]] [[kernel]]`,
under MLX's host name for it.

The subset modelled: one 2-D row-major (or, with `transpose_*`, column-major) product (`steel_gemm`
also a batch of them and AddMM's output source: a bias, `alpha`, `beta`), a GPU without neural accelerators (`is_nax_available()` false: before
M5). Each entry point returns `(out, launch)`: `out` the result, `launch` the `Launch`
(mlx_launch.py) that can run the same launch again, take `counters()` or run `racecheck()`.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import torch

from tilelang_metal.emulator import ForeignKernel, compile_msl

from mlx_launch import Launch

# MLX's type_to_name (mlx/backend/metal/utils.cpp) and the MSL type its .metal files instantiate with.
TYPE_NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
MSL_TYPE = {torch.float16: "half", torch.bfloat16: "bfloat16_t", torch.float32: "float"}


@dataclass(frozen=True)
class Device:
    """What MLX's dispatch reads from the device: `get_architecture()` (its last letter, `devc`, is the
    size class: 'g' and 'p' are "small", 'd' "large", any other letter "medium"; which chip reports
    which letter: tilelang_metal.performance.roofline.ARCHITECTURES) and
    `get_architecture_gen()` (13 M1, 14 M2, 15 M3, 16 M4)."""

    architecture: str = "applegpu_g15g"  # an M3: no neural accelerators, gemv_wide available

    @property
    def size_class(self) -> str:
        return self.architecture[-1]

    @property
    def generation(self) -> int:
        return int("".join(c for c in self.architecture.split("_")[-1] if c.isdigit()))


DEFAULT_DEVICE = Device()


def _check(x: torch.Tensor, name: str) -> None:
    if x.dtype not in TYPE_NAME:
        raise ValueError(f"{name}: MLX's GEMM kernels are instantiated for float16, bfloat16 and float32, got {x.dtype}")
    if x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(f"{name}: pass a contiguous CPU tensor (transpose_* says how it is laid out)")


def _mkn(a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool) -> tuple[int, int, int]:
    _check(a, "a")
    _check(b, "b")
    if a.dim() != 2 or b.dim() != 2 or a.dtype != b.dtype:
        raise ValueError(f"a and b must be 2-D of one dtype, got {tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}")
    M, K = (a.shape[1], a.shape[0]) if transpose_a else tuple(a.shape)
    Kb, N = (b.shape[1], b.shape[0]) if transpose_b else tuple(b.shape)
    if K != Kb:
        raise ValueError(f"op(a) is {M}x{K} but op(b) is {Kb}x{N}: the inner dimensions differ")
    return int(M), int(N), int(K)


def batched_mkn(a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool) -> tuple[int, int, int, int]:
    """(batch, M, N, K): 2-D operands are one product (batch 1); 3-D ones a batch of them, B one per
    batch (MLX folds a B shared by the batch into M, a 2-D product: pass that as one)."""
    if a.dim() == 2:
        return (1, *_mkn(a, b, transpose_a, transpose_b))
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]:
        raise ValueError(f"a batch needs a (batch, ., .) and b (batch, ., .), got {tuple(a.shape)} and {tuple(b.shape)}")
    _check(a, "a")
    _check(b, "b")
    return (int(a.shape[0]), *_mkn(a[0], b[0], transpose_a, transpose_b))


class GEMMAddMMParams(ctypes.Structure):  # steel/gemm/params.h
    _fields_ = [("ldc", ctypes.c_int), ("fdc", ctypes.c_int), ("batch_stride_c", ctypes.c_int64), ("alpha", ctypes.c_float),
                ("beta", ctypes.c_float)]


def addmm_params(c: torch.Tensor, M: int, N: int, alpha: float, beta: float) -> GEMMAddMMParams:
    """AddMM::eval_gpu's output source: ldc and fdc are c's last two strides as broadcast to the output
    ((N,) a bias: 0 and 1; (M, N): N and 1), batch_stride_c collapse_batches' (M * N for a (batch, M,
    N) c, 0 when c has no batch)."""
    _check(c, "c")
    if tuple(c.shape) not in ((N,), (M, N)) and not (c.dim() == 3 and tuple(c.shape[1:]) == (M, N)):
        raise ValueError(f"c must be (N,), (M, N) or (batch, M, N) for an {M}x{N} output, got {tuple(c.shape)}")
    ldc = 0 if c.dim() == 1 else N
    return GEMMAddMMParams(ldc=ldc, fdc=1, batch_stride_c=M * N if c.dim() == 3 else 0, alpha=alpha, beta=beta)


# ---------------------------------------------------------------- MLX's dispatch decisions

def route(M: int, N: int, K: int, dtype: torch.dtype, transpose_a: bool, transpose_b: bool,
          device: Device = DEFAULT_DEVICE) -> str:
    """The kernel family Matmul::eval_gpu picks for a 2-D product (no batch): "dot_product",
    "gemv_wide", "gemv", "splitk" or "gemm"."""
    if M == 1 and N == 1:
        return "dot_product"
    if not transpose_a and transpose_b and _gemv_wide_applies(M, N, K, dtype, device):
        return "gemv_wide"
    if min(M, N) == 1:
        return "gemv"
    # steel_matmul_axpby, "Case 1: Small MxN with large K, use SIMD split-K" (not NAX)
    tm, tn, tk = (M + 15) // 16, (N + 15) // 16, K // 16
    min_tmn_threshold = 2048 if device.size_class in "sd" else 1024
    if tm * tn <= min_tmn_threshold and tk >= 8 and K >= max(M, N):
        return "splitk"
    return "gemm"


def _gemv_wide_applies(M: int, N: int, K: int, dtype: torch.dtype, device: Device) -> bool:
    # gemv_wide_config: M3 or later, several rows, K % 4 == 0, half / bfloat, at most 3 passes of 5
    # vectors (our operands are contiguous and unbatched, so the alignment conditions hold).
    return (device.generation >= 15 and M > 1 and N > 1 and K % 4 == 0
            and dtype in (torch.float16, torch.bfloat16) and (M + 4) // 5 <= 3)


def gemm_tile(M: int, N: int, K: int, dtype: torch.dtype, transpose_a: bool, transpose_b: bool,
              device: Device = DEFAULT_DEVICE, batch: int = 1) -> tuple[int, int, int, int, int]:
    """(bm, bn, bk, wm, wn) of steel_matmul_regular_axpby: defaults 64, 64, 16, 2, 2, then GEMM_TPARAM_MACRO."""
    bm, bn, bk, wm, wn = 64, 64, 16, 2, 2
    nt = not transpose_a and transpose_b
    half_like = dtype != torch.float32
    devc = device.size_class
    if devc in "gp":  # small device
        if nt:
            bm, bn, bk, wm, wn = 64, 32, 32, 2, 2
        elif half_like:
            bm, bn, bk, wm, wn = 64, 64, 16, 1, 2
    elif devc == "d":  # large device
        if batch * M * N >= 1 << 20:
            if half_like:
                if 2 * max(M, N) > K:
                    bm, bn, bk, wm, wn = 64, 64, 16, 1, 2
                elif nt:
                    bm, bn, bk, wm, wn = 64, 32, 32, 2, 2
                else:
                    bm, bn, bk, wm, wn = 32, 64, 16, 1, 2
        elif half_like:
            bm, bn, bk, wm, wn = (64, 32, 32, 2, 2) if nt else (64, 64, 16, 1, 2)
        else:
            bm, bn, bk, wm, wn = (32, 64, 16, 1, 2) if nt else (64, 32, 32, 2, 2)
    # medium device: the defaults
    return bm, bn, bk, wm, wn


# ---------------------------------------------------------------- parameter structs (steel/gemm/params.h)

class GEMMParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("M", "N", "K", "lda", "ldb", "ldd", "tiles_n", "tiles_m")] + [
        (n, ctypes.c_int64) for n in ("batch_stride_a", "batch_stride_b", "batch_stride_d")] + [
        (n, ctypes.c_int) for n in ("swizzle_log", "gemm_k_iterations_aligned", "batch_ndim")]


class GEMMSpiltKParams(ctypes.Structure):  # MLX's spelling
    _fields_ = [(n, ctypes.c_int) for n in (
        "M", "N", "K", "lda", "ldb", "ldc", "tiles_n", "tiles_m", "split_k_partitions",
        "split_k_partition_stride", "split_k_partition_size", "swizzle_log", "gemm_k_iterations_aligned")]


# ---------------------------------------------------------------- wrappers

_PRELUDE = '#include <metal_stdlib>\n#include "mlx/backend/metal/kernels/utils.h"\n'


def _instantiation(host_name: str, callee: str) -> str:
    return f'template [[host_name("{host_name}")]] [[kernel]] decltype({callee}) {callee};\n'


@functools.lru_cache(maxsize=None)
def _compile(kind: str, host_name: str, callee: str, include: str, constants: tuple[tuple[int, bool], ...] = ()) -> ForeignKernel:
    headers = {
        "fused": ("steel/gemm/gemm.h", "steel/gemm/kernels/steel_gemm_fused.h"),
        "splitk": ("steel/gemm/gemm.h", "steel/gemm/kernels/steel_gemm_splitk.h"),
        "gemv": ("gemv.h",),
    }[kind]
    source = _PRELUDE + "".join(f'#include "mlx/backend/metal/kernels/{h}"\n' for h in headers)
    source += _instantiation(host_name, callee)
    return compile_msl(source, host_name, include_dirs=[include], function_constants=dict(constants))


def _transposes(transpose_a: bool, transpose_b: bool) -> str:
    return ("t" if transpose_a else "n") + ("t" if transpose_b else "n")


def steel_gemm(a: torch.Tensor, b: torch.Tensor, *, transpose_a: bool = False, transpose_b: bool = False,
               include: str, device: Device = DEFAULT_DEVICE, tile: tuple[int, int, int, int, int] | None = None,
               c: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 1.0) -> tuple[torch.Tensor, Launch]:
    """op(a) @ op(b) with MLX's `gemm` kernel (steel_gemm_fused.h), launched as
    steel_matmul_regular_axpby does; op(x) is x.T when transpose_x (x then holds the K x M / N x K
    operand row-major, i.e. the M x K / K x N one column-major). `tile` overrides MLX's choice (bm,
    bn, bk, wm, wn) with another of the shapes steel_gemm_fused.metal instantiates. 3-D a and b: a
    batch on the grid's z axis (`batched_mkn`). `c`: AddMM's `alpha * op(a) @ op(b) + beta * c`
    (`addmm_params`; a bias (N,) with alpha = beta = 1 is its plain add)."""
    batch, M, N, K = batched_mkn(a, b, transpose_a, transpose_b)
    bm, bn, bk, wm, wn = tile or gemm_tile(M, N, K, a.dtype, transpose_a, transpose_b, device, batch)
    t = MSL_TYPE[a.dtype]
    host = (f"steel_gemm_fused_{_transposes(transpose_a, transpose_b)}_{TYPE_NAME[a.dtype]}_{TYPE_NAME[a.dtype]}"
            f"_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}")
    callee = f"gemm<{t}, {bm}, {bn}, {bk}, {wm}, {wn}, {str(transpose_a).lower()}, {str(transpose_b).lower()}, float>"
    # steel_matmul_regular_axpby's function constants: has_batch = batch_shape.size() > 1 is false for
    # one batch axis (collapse_batches; the batch strides below), use_out_source for AddMM, do_axpby
    # unless alpha = beta = 1
    use_out_source = c is not None
    do_axpby = use_out_source and not (alpha == 1.0 and beta == 1.0)
    constants = ((10, False), (100, use_out_source), (110, do_axpby), (200, M % bm == 0), (201, N % bn == 0), (202, K % bk == 0))
    kernel = _compile("fused", host, callee, include, constants)
    tn, tm = (N + bn - 1) // bn, (M + bm - 1) // bm
    swizzle_log = 0  # "TODO: Explore device-based tuning for swizzle": MLX fixes it at 0
    params = GEMMParams(M=M, N=N, K=K, lda=M if transpose_a else K, ldb=K if transpose_b else N, ldd=N,
                        tiles_n=tn, tiles_m=tm, batch_stride_a=M * K if batch > 1 else 0,
                        batch_stride_b=K * N if batch > 1 else 0, batch_stride_d=M * N,
                        swizzle_log=swizzle_log, gemm_k_iterations_aligned=K // bk, batch_ndim=1)
    tile_count = 1 << swizzle_log
    grid = (tn * tile_count, (tm + tile_count - 1) // tile_count, batch)
    out = torch.full((*a.shape[:-2], M, N), float("nan"), dtype=a.dtype)  # every element must be written
    # buffers 0 A, 1 B, 3 D, 4 params; 2 (C), 5 (addmm params) with use_out_source; 6 and 7 has_batch
    if use_out_source:
        args = (a, b, c, out, bytes(params), bytes(addmm_params(c, M, N, alpha, beta)))
    else:
        args = (a, b, out, bytes(params))
    launch = Launch.of(out, (kernel, args, grid, (32, wn, wm)))
    launch.run()
    return out, launch


def _split_k_partitions(M: int, N: int, K: int) -> int:
    # steel_gemm_splitk_axpby: "As _tk grows use more partitions, as _tm * _tn grow use fewer"
    tm, tn, tk = (M + 31) // 32, (N + 31) // 32, K // 16
    ratio = tk // (tm * tn)
    # next_power_of_2 (mlx/utils.h): n itself when a power of 2, else 2^ceil(log2 n); 0 stays 0
    pow2 = ratio if ratio & (ratio - 1) == 0 else 2 ** math.ceil(math.log2(ratio))
    return min(max(2, pow2), 32)


def _block_dims(dim0: int, dim1: int, dim2: int, pow2: int = 10) -> tuple[int, int, int]:
    """get_block_dims_common (mlx/backend/common/utils.cpp): powers of two, at most 2^pow2 threads."""
    pows, total = [0, 0, 0], 0
    while True:
        before = total
        for i, d in enumerate((dim0, dim1, dim2)):
            if d >= 1 << (pows[i] + 1):
                pows[i] += 1
                total += 1
            if total == 10:
                return (1 << pows[0], 1 << pows[1], 1 << pows[2])
        if total == before or total == pow2:
            return (1 << pows[0], 1 << pows[1], 1 << pows[2])


def splitk_tile(M: int, N: int) -> tuple[int, int]:
    """(bm, bn) of steel_gemm_splitk_axpby: 16 below 40 rows / columns, else 32 (bk 16, wm = wn = 2)."""
    return (16 if M < 40 else 32), (16 if N < 40 else 32)


def steel_gemm_splitk(a: torch.Tensor, b: torch.Tensor, *, transpose_a: bool = False, transpose_b: bool = False,
                      include: str, tile: tuple[int, int] | None = None, partitions: int | None = None,
                      ) -> tuple[torch.Tensor, Launch]:
    """op(a) @ op(b) with MLX's `gemm_splitk` (float32 partial products of K partitions) and
    `gemm_splitk_accum`, launched as steel_gemm_splitk_axpby does. `tile` (bm, bn) and `partitions`
    override MLX's choice for this shape (benchmark/compare_mlx.py keeps a larger problem's choice
    on its proxies)."""
    M, N, K = _mkn(a, b, transpose_a, transpose_b)
    (bm, bn), bk, wm, wn = tile or splitk_tile(M, N), 16, 2, 2
    partitions = partitions or _split_k_partitions(M, N, K)
    gemm_k_iterations = (K // bk) // partitions
    mn_aligned, k_aligned = M % bm == 0 and N % bn == 0, K % bk == 0
    t = MSL_TYPE[a.dtype]
    host = (f"steel_gemm_splitk_{_transposes(transpose_a, transpose_b)}_{TYPE_NAME[a.dtype]}_float32"
            f"_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}_MN_{'t' if mn_aligned else 'n'}aligned_K_{'t' if k_aligned else 'n'}aligned")
    callee = (f"gemm_splitk<{t}, float, {bm}, {bn}, {bk}, {wm}, {wn}, {str(transpose_a).lower()}, "
              f"{str(transpose_b).lower()}, {str(mn_aligned).lower()}, {str(k_aligned).lower()}>")
    partial = _compile("splitk", host, callee, include)
    tn, tm = (N + bn - 1) // bn, (M + bm - 1) // bm
    params = GEMMSpiltKParams(M=M, N=N, K=K, lda=M if transpose_a else K, ldb=K if transpose_b else N, ldc=N,
                              tiles_n=tn, tiles_m=tm, split_k_partitions=partitions,
                              split_k_partition_stride=M * N, split_k_partition_size=gemm_k_iterations * bk,
                              swizzle_log=0, gemm_k_iterations_aligned=gemm_k_iterations)
    c_split = torch.full((partitions, M, N), float("nan"), dtype=torch.float32)
    first = (partial, (a, b, c_split, bytes(params)), (tn, tm, partitions), (32, wn, wm))
    accum_host = f"steel_gemm_splitk_accum_{TYPE_NAME[a.dtype]}_float32"
    accum = _compile("splitk", accum_host, f"gemm_splitk_accum<float, {t}>", include)
    out = torch.full((M, N), float("nan"), dtype=a.dtype)
    # MLX dispatches N x M threads (dispatch_threads) in groups of get_block_dims(N, M, 1), the edge
    # groups partial; gemm_splitk_accum has no bounds check and relies on Metal not running threads
    # outside the grid. The emulator launches whole threadgroups only, so each group side is cut to
    # the largest power of two dividing the grid side: the same N x M threads run, and the kernel
    # reads nothing but thread_position_in_grid.
    bx, by, _ = _block_dims(N, M, 1)
    bx, by = math.gcd(bx, N), math.gcd(by, M)
    second = (accum, (c_split, out, partitions, M * N, N), (N // bx, M // by, 1), (bx, by, 1))
    launch = Launch.of(out, first, second)
    launch.run()
    return out, launch


def _gemv_config(transpose_mat: bool, in_len: int, out_len: int) -> tuple[int, int, int, int, int, int]:
    """(bm, bn, sm, sn, tm, tn) of gemv_axbpy."""
    tm, tn, sm, sn, bm, bn = 4, 4, 1, 32, 1, 1
    if transpose_mat:
        sm, sn = (4, 8) if in_len >= 8192 and out_len >= 2048 else (8, 4)
        bn = 16 if out_len >= 2048 else (4 if out_len >= 512 else 2)
        tn = 1 if out_len < tn else tn  # "Specialized kernel for very small outputs"
    else:
        bm = 8 if out_len >= 4096 else 4
        sn = 32
        if in_len <= 64:
            bm, sm, sn = 1, 8, 4
        elif in_len >= 16 * out_len:
            bm, bn = 1, 8
        tm = 1 if out_len < tm else tm
    return bm, bn, sm, sn, tm, tn


def _gemv(mat: torch.Tensor, vec: torch.Tensor, transpose_mat: bool, include: str) -> tuple[torch.Tensor, Launch]:
    _check(mat, "mat")
    _check(vec, "vec")
    if mat.dim() != 2 or vec.dim() != 1 or mat.dtype != vec.dtype:
        raise ValueError(f"need a 2-D matrix and a 1-D vector of one dtype, got {tuple(mat.shape)} {mat.dtype} and {tuple(vec.shape)} {vec.dtype}")
    in_len, out_len = (mat.shape[0], mat.shape[1]) if transpose_mat else (mat.shape[1], mat.shape[0])
    if vec.shape[0] != in_len:
        raise ValueError(f"the vector has {vec.shape[0]} elements, the matrix's reduced side {in_len}")
    bm, bn, sm, sn, tm, tn = _gemv_config(transpose_mat, in_len, out_len)
    name = "gemv_t" if transpose_mat else "gemv"
    t = MSL_TYPE[mat.dtype]
    host = f"{name}_{TYPE_NAME[mat.dtype]}_bm{bm}_bn{bn}_sm{sm}_sn{sn}_tm{tm}_tn{tn}_nc0_axpby0"
    callee = f"{name}<{t}, {bm}, {bn}, {sm}, {sn}, {tm}, {tn}, false, false>"
    # gemv.h also declares gemv_wide's function constants (0, 1): MLX's host sets none for gemv, and
    # neither Metal nor the emulator needs a value for constants the kernel does not use
    kernel = _compile("gemv", host, callee, include)
    n_out_per_tgp = bn * sn * tn if transpose_mat else bm * sm * tm
    grid = ((out_len + n_out_per_tgp - 1) // n_out_per_tgp, 1, 1)
    out = torch.full((out_len,), float("nan"), dtype=mat.dtype)
    # Buffers gemv_axbpy sets without axpby: 0 mat, 1 vec, 3 out, 4-6 sizes, 9-12 the batch (one 2-D
    # product: batch_shape {1}, strides {0}). 2 (bias), 7, 8 (alpha, beta), 13, 14 stay unset; the
    # emulator binds every index, so they get NaN / 0 values that would show if the kernel read them.
    nan = torch.full((1,), float("nan"), dtype=mat.dtype)
    zero64 = torch.zeros(1, dtype=torch.int64)
    args = (mat, vec, nan, out, int(in_len), int(out_len), int(mat.shape[1]), float("nan"), float("nan"),
            1, torch.ones(1, dtype=torch.int32), zero64, zero64.clone(), zero64.clone(), 0)
    launch = Launch.of(out, (kernel, args, grid, (32, bn, bm)))
    launch.run()
    return out, launch


def gemv(mat: torch.Tensor, vec: torch.Tensor, *, include: str) -> tuple[torch.Tensor, Launch]:
    """mat @ vec (mat M x K row-major) with MLX's `gemv`: Matmul with N == 1 routes there with the
    matrix untransposed."""
    return _gemv(mat, vec, False, include)


def gemv_t(vec: torch.Tensor, mat: torch.Tensor, *, include: str) -> tuple[torch.Tensor, Launch]:
    """vec @ mat (mat K x N row-major) with MLX's `gemv_t`: Matmul with M == 1 makes B the matrix and
    reads it transposed (transpose_mat = !transpose_b)."""
    return _gemv(mat, vec, True, include)
