"""Non-GEMM TileLang kernels that the in-tree Metal backend lowers: the plugin must lower them too,
and the emulator must reproduce torch. Each entry: (builder, input makers, reference)."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations
import tilelang.language as T
import torch


def add_fp16(n=1024, block=256):
    @T.prim_func
    def main(A: T.Tensor((n,), "float16"), B: T.Tensor((n,), "float16"), C: T.Tensor((n,), "float16")):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main, [lambda: torch.randn(n).half(), lambda: torch.randn(n).half()], lambda a, b: a + b


def math_fp32(n=512, block=128):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                x = A[bx * block + i]
                B[bx * block + i] = T.exp(x * 0.5) + T.sqrt(T.abs(x)) + T.max(x, 0.25) - T.tanh(x)

    return (
        main,
        [lambda: torch.randn(n)],
        lambda a: torch.exp(a * 0.5) + torch.sqrt(a.abs()) + torch.clamp(a, min=0.25) - torch.tanh(a),
    )


def cast_scale(m=64, n=96):
    @T.prim_func
    def main(A: T.Tensor((m, n), "float16"), B: T.Tensor((m, n), "float32")):
        with T.Kernel(T.ceildiv(n, 32), T.ceildiv(m, 16), threads=128) as (bx, by):
            for i, j in T.Parallel(16, 32):
                B[by * 16 + i, bx * 32 + j] = T.cast(A[by * 16 + i, bx * 32 + j], "float32") * 3.0

    return main, [lambda: torch.randn(m, n).half()], lambda a: a.float() * 3.0


def shared_transpose(m=128, n=64, tile=32):
    @T.prim_func
    def main(A: T.Tensor((m, n), "float32"), B: T.Tensor((n, m), "float32")):
        with T.Kernel(n // tile, m // tile, threads=128) as (bx, by):
            S = T.alloc_shared((tile, tile), "float32")
            T.copy(A[by * tile, bx * tile], S)
            for i, j in T.Parallel(tile, tile):
                B[bx * tile + i, by * tile + j] = S[j, i]

    return main, [lambda: torch.randn(m, n)], lambda a: a.T.contiguous()


def guarded_tail(n=1000, block=256):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    B[bx * block + i] = A[bx * block + i] * A[bx * block + i]

    return main, [lambda: torch.randn(n)], lambda a: a * a


def serial_loop(m=64, k=48):
    @T.prim_func
    def main(A: T.Tensor((m, k), "float32"), B: T.Tensor((m,), "float32")):
        with T.Kernel(1, threads=64) as bx:
            for i in T.Parallel(m):
                acc = T.alloc_var("float32")
                acc = 0.0
                for j in T.serial(k):
                    acc = acc + A[i, j]
                B[i] = acc

    return main, [lambda: torch.randn(m, k)], lambda a: a.sum(1)


def copy_fragment_roundtrip(m=64, n=64):
    @T.prim_func
    def main(A: T.Tensor((m, n), "float32"), B: T.Tensor((m, n), "float32")):
        with T.Kernel(1, threads=128) as bx:
            F = T.alloc_fragment((m, n), "float32")
            T.copy(A, F)
            for i, j in T.Parallel(m, n):
                F[i, j] = F[i, j] * 2.0 + 1.0
            T.copy(F, B)

    return main, [lambda: torch.randn(m, n)], lambda a: a * 2.0 + 1.0


def integer_ops(n=256):
    @T.prim_func
    def main(A: T.Tensor((n,), "int32"), B: T.Tensor((n,), "int32")):
        with T.Kernel(1, threads=n) as bx:
            for i in T.Parallel(n):
                B[i] = (A[i] * 7 + i) % 13 + A[i] // 5

    return (
        main,
        [lambda: torch.randint(0, 1000, (n,), dtype=torch.int32)],
        lambda a: (a * 7 + torch.arange(a.numel(), dtype=torch.int32)) % 13 + torch.div(a, 5, rounding_mode="floor"),
    )


def clear_and_fill(m=32, n=64):
    @T.prim_func
    def main(B: T.Tensor((m, n), "float32")):
        with T.Kernel(1, threads=64) as bx:
            S = T.alloc_shared((m, n), "float32")
            T.fill(S, 1.5)
            T.copy(S, B)

    return main, [], lambda: torch.full((m, n), 1.5)


CORPUS = {
    "add_fp16": add_fp16,
    "math_fp32": math_fp32,
    "cast_scale": cast_scale,
    "shared_transpose": shared_transpose,
    "guarded_tail": guarded_tail,
    "serial_loop": serial_loop,
    "copy_fragment_roundtrip": copy_fragment_roundtrip,
    "integer_ops": integer_ops,
    "clear_and_fill": clear_and_fill,
}
