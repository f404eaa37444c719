"""The tiled GEMM with a batch on the grid's z axis and a fused epilogue: what `kernels.matmul`
builds for `batch=` or `epilogue=` on its `gemm` route.

    out[z] = epilogue(A[z] @ B[z])       A (batch, M, K); B (batch, K, N) or (K, N) shared; out (batch, M, N)

Without a batch the operands are 2-D, as in `gemm_staged` / `gemm_direct_global`. The product is
accumulated in a float32 register fragment (staged through threadgroup memory when `stages`, else
T.gemm on the device tiles), the epilogue is applied to it in registers and each in-bounds element is
stored once, so the extra inputs (bias, C) are read only inside the matrix. Epilogues (`EPILOGUES`):

- none, relu (NaN stays NaN, as torch.relu), gelu_tanh, silu: elementwise on A @ B;
- bias: A @ B + bias, bias (N,) shared by every row and batch (torch.addmm with a 1-D input);
- scale: alpha * (A @ B);
- alpha_beta: alpha * (A @ B) + beta * C (torch.addmm / baddbmm, MLX's addmm); with beta = 0 C is not
  read, so NaN or inf in it does not propagate (torch's rule);
- residual: A @ B + C.

C (for alpha_beta and residual) has the output's shape; bias and C have the output dtype. The result
is a new tensor: the kernel is called `kernel(A, B)`, `kernel(A, B, bias)` or `kernel(A, B, C)`.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any, Optional

import tilelang.language as T

from .gemm import check_gemm_arguments, gelu_tanh, staged_pads
from .sizes import integer_sizes

EPILOGUES = ("none", "relu", "bias", "scale", "alpha_beta", "gelu_tanh", "silu", "residual")
EXTRA_INPUT = {"bias": "bias", "alpha_beta": "C", "residual": "C"}  # the epilogue's third argument


def check_batch(what: str, batch: Any, shared_B: Any) -> Optional[int]:
    """`batch` as a Python int (None: not batched) once it and `shared_B` are valid; one-line errors
    naming `what` (matmul, GEMV, gemm_batched)."""
    if batch is not None:
        (batch,) = integer_sizes(what, batch=batch)
        if not 1 <= batch <= 2**31 - 1:
            raise ValueError(f"{what} needs 1 <= batch <= {2**31 - 1} (got batch={batch}); pass batch=None for one A (M, K)")
    if not isinstance(shared_B, bool):
        raise ValueError(f"{what} shared_B={shared_B!r} must be True or False")
    if shared_B and batch is None:
        raise ValueError(f"{what} shared_B=True needs batch=: it says B (K, N) is shared by every batch of A (batch, M, K)")
    return batch


def _epilogue(epilogue: str, alpha: float, beta: float) -> Any:
    """The epilogue as a function of (accumulator value, extra-input value or None) in float32."""
    if epilogue == "relu":
        return lambda x, _: T.if_then_else(x < 0, T.float32(0), x)  # not max(x, 0): Metal's fmax drops NaN
    if epilogue == "bias" or epilogue == "residual":
        return lambda x, extra: x + T.cast(extra, "float32")
    if epilogue == "scale":
        return lambda x, _: x * T.float32(alpha)
    if epilogue == "alpha_beta":
        if beta == 0:
            return lambda x, _: x * T.float32(alpha)
        return lambda x, extra: x * T.float32(alpha) + T.float32(beta) * T.cast(extra, "float32")
    if epilogue == "gelu_tanh":
        return lambda x, _: gelu_tanh(x)
    if epilogue == "silu":
        return lambda x, _: x / (1.0 + T.exp(-x))
    return lambda x, _: x


def gemm_batched(
    M: int,
    N: int,
    K: int,
    block_M: int = 64,
    block_N: int = 128,
    block_K: int = 32,
    *,
    batch: Optional[int] = None,
    shared_B: bool = False,
    dtype: str = "float16",
    out_dtype: str = "float16",
    threads: int = 128,
    num_stages: int = 0,
    epilogue: str = "none",
    alpha: float = 1.0,
    beta: float = 1.0,
) -> Any:
    """The `T.prim_func` of out = epilogue(A @ B), batched over the grid's z axis when `batch`
    (`shared_B`: B is (K, N) for every batch). `num_stages` > 0 stages A and B through threadgroup
    memory in steps of `block_K` (kept as written: the plain-metal route's structure); 0 runs T.gemm
    on the device tiles (the metal4 route's direct-global structure). Arguments are checked by
    `kernels.matmul_config`."""
    M, N, K, block_M, block_N, block_K, threads, _, num_stages = check_gemm_arguments(
        "gemm_batched", M=M, N=N, K=K, block_M=block_M, block_N=block_N, block_K=block_K, threads=threads, num_stages=num_stages)
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm_batched epilogue={epilogue!r} is not one of {', '.join(EPILOGUES)}")
    batch = check_batch("gemm_batched", batch, shared_B)
    batched = batch is not None
    lead = (batch,) if batched else ()
    a_shape, c_shape = (*lead, M, K), (*lead, M, N)
    b_shape = (K, N) if shared_B or not batched else (batch, K, N)
    extra = EXTRA_INPUT.get(epilogue)
    if epilogue == "alpha_beta" and beta == 0:
        extra_shape = c_shape  # still an argument (addmm's signature), never read
    else:
        extra_shape = (N,) if extra == "bias" else c_shape
    apply = _epilogue(epilogue, alpha, beta)
    reads_extra = extra is not None and not (epilogue == "alpha_beta" and beta == 0)
    b_per_batch = batched and not shared_B
    a_pad, b_pad = staged_pads((block_M, block_K), (block_K, block_N), num_stages, dtype)

    @T.macro
    def tile(A, B, X, C, bx, by, bz):
        acc = T.alloc_fragment((block_M, block_N), "float32")
        if num_stages:
            A_s = T.alloc_shared((block_M, block_K + a_pad), dtype)  # rows padded: no bank conflicts (kernels.gemm.staged_pads)
            B_s = T.alloc_shared((block_K, block_N + b_pad), dtype)
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                if batched:
                    T.copy(A[bz, by * block_M : (by + 1) * block_M, ko * block_K : (ko + 1) * block_K], A_s[0:block_M, 0:block_K])
                else:
                    T.copy(A[by * block_M : (by + 1) * block_M, ko * block_K : (ko + 1) * block_K], A_s[0:block_M, 0:block_K])
                if b_per_batch:
                    T.copy(B[bz, ko * block_K : (ko + 1) * block_K, bx * block_N : (bx + 1) * block_N], B_s[0:block_K, 0:block_N])
                else:
                    T.copy(B[ko * block_K : (ko + 1) * block_K, bx * block_N : (bx + 1) * block_N], B_s[0:block_K, 0:block_N])
                T.gemm(A_s[0:block_M, 0:block_K], B_s[0:block_K, 0:block_N], acc)
        elif batched and b_per_batch:
            T.gemm(A[bz, by * block_M : (by + 1) * block_M, 0:K], B[bz, 0:K, bx * block_N : (bx + 1) * block_N], acc, clear_accum=True)
        elif batched:
            T.gemm(A[bz, by * block_M : (by + 1) * block_M, 0:K], B[0:K, bx * block_N : (bx + 1) * block_N], acc, clear_accum=True)
        else:
            T.gemm(A[by * block_M : (by + 1) * block_M, 0:K], B[0:K, bx * block_N : (bx + 1) * block_N], acc, clear_accum=True)
        for i, j in T.Parallel(block_M, block_N):
            row, col = by * block_M + i, bx * block_N + j
            if row < M and col < N:
                if batched:
                    if extra == "bias":
                        C[bz, row, col] = T.cast(apply(acc[i, j], X[col]), out_dtype)
                    elif reads_extra:
                        C[bz, row, col] = T.cast(apply(acc[i, j], X[bz, row, col]), out_dtype)
                    else:
                        C[bz, row, col] = T.cast(apply(acc[i, j], None), out_dtype)
                elif extra == "bias":
                    C[row, col] = T.cast(apply(acc[i, j], X[col]), out_dtype)
                elif reads_extra:
                    C[row, col] = T.cast(apply(acc[i, j], X[row, col]), out_dtype)
                else:
                    C[row, col] = T.cast(apply(acc[i, j], None), out_dtype)

    grid = (T.ceildiv(N, block_N), T.ceildiv(M, block_M), batch if batched else 1)
    if extra is None:

        @T.prim_func
        def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor(c_shape, out_dtype)):
            with T.Kernel(*grid, threads=threads) as (bx, by, bz):
                tile(A, B, None, C, bx, by, bz)

    else:

        @T.prim_func
        def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), X: T.Tensor(extra_shape, out_dtype),
                 C: T.Tensor(c_shape, out_dtype)):
            with T.Kernel(*grid, threads=threads) as (bx, by, bz):
                tile(A, B, X, C, bx, by, bz)

    if num_stages:
        from ..transform.shared_staging import keep_shared_staging

        return keep_shared_staging(main)
    return main
