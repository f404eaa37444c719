"""`T.view(buf, shape, dtype)` of threadgroup, thread and fragment storage reinterprets its bits, as
torch's `.view(dtype)` does: same-size views (float32 <-> int32 / uint32, float16 <-> int16 /
bfloat16) and size-changing ones (float16 -> int32, int8 -> int32, float32 -> float16 with a
doubled last dimension), read and written, through vectorized copies and scalar accesses. The
printer declared the storage with one view's type and printed every access through it: a numeric
conversion instead of the bits, or MSL that did not compile."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.errors import CodegenError
from tilelang_metal.emulator import EmulatorRuntimeError, racecheck

N = 128  # elements of each input; 32 threads
ROWS, COLS = 8, 16

INPUTS = {"F": ((N,), torch.float32), "H": ((N,), torch.float16), "Q": ((N,), torch.int8), "I": ((N,), torch.int32),
          "G": ((ROWS, COLS), torch.float32)}
# output name -> (shape, dtype, reference from the inputs)
OUTPUTS = {
    "F_as_int32": ((N,), "int32", lambda x: x["F"].view(torch.int32)),
    "F_as_uint32": ((N,), "uint32", lambda x: x["F"].view(torch.uint32)),
    "H_as_int16": ((N,), "int16", lambda x: x["H"].view(torch.int16)),
    "H_as_bfloat16": ((N,), "bfloat16", lambda x: x["H"].view(torch.bfloat16)),
    "H_as_int32": ((N // 2,), "int32", lambda x: x["H"].view(torch.int32)),
    "Q_as_int32": ((N // 4,), "int32", lambda x: x["Q"].view(torch.int32)),
    "G_as_float16": ((ROWS, 2 * COLS), "float16", lambda x: x["G"].view(torch.float16)),
    "I_as_float32": ((N,), "float32", lambda x: x["I"].view(torch.float32)),  # written through the int32 view
    "I_as_float16": ((2 * N,), "float16", lambda x: x["I"].view(torch.float16)),  # written through an int32 view of halves
    "I_as_int8": ((4 * N,), "int8", lambda x: x["I"].view(torch.int8)),  # the same halves read as bytes: 16-byte moves
}


def _alloc(scope: str, shape: tuple, dtype: str):
    return T.alloc_shared(shape, dtype) if scope == "shared" else T.alloc_fragment(shape, dtype)


def tile_views(scope: str):
    """Each input into a threadgroup array (`shared`) or fragment, out through a T.view of it with
    another dtype; T.copy vectorizes, the T.Parallel loops access single elements (reversed, for
    threadgroup memory: tilelang's layout inference takes no reversed fragment index)."""
    reversed_ = scope == "shared"

    @T.prim_func
    def main(
        F: T.Tensor((N,), "float32"), H: T.Tensor((N,), "float16"), Q: T.Tensor((N,), "int8"), I: T.Tensor((N,), "int32"),
        G: T.Tensor((ROWS, COLS), "float32"),
        F_as_int32: T.Tensor((N,), "int32"), F_as_uint32: T.Tensor((N,), "uint32"), H_as_int16: T.Tensor((N,), "int16"),
        H_as_bfloat16: T.Tensor((N,), "bfloat16"), H_as_int32: T.Tensor((N // 2,), "int32"), Q_as_int32: T.Tensor((N // 4,), "int32"),
        G_as_float16: T.Tensor((ROWS, 2 * COLS), "float16"), I_as_float32: T.Tensor((N,), "float32"),
        I_as_float16: T.Tensor((2 * N,), "float16"), I_as_int8: T.Tensor((4 * N,), "int8"),
    ):
        with T.Kernel(1, threads=32):
            f = _alloc(scope, (N,), "float32")
            h = _alloc(scope, (N,), "float16")
            q = _alloc(scope, (N,), "int8")
            g = _alloc(scope, (ROWS, COLS), "float32")
            back = _alloc(scope, (N,), "float32")
            halves = _alloc(scope, (2 * N,), "float16")
            T.copy(F, f)
            T.copy(H, h)
            T.copy(Q, q)
            T.copy(G, g)
            f_bits = T.view(f, (N,), "int32")
            f_ubits = T.view(f, (N,), "uint32")
            h_short = T.view(h, (N,), "int16")
            h_bf = T.view(h, (N,), "bfloat16")
            h_words = T.view(h, (N // 2,), "int32")
            q_words = T.view(q, (N // 4,), "int32")
            g_halves = T.view(g, (ROWS, 2 * COLS), "float16")
            T.copy(f_bits, F_as_int32)
            for i in T.Parallel(N):
                F_as_uint32[N - 1 - i if reversed_ else i] = f_ubits[N - 1 - i if reversed_ else i]
            T.copy(h_short, H_as_int16)
            T.copy(h_bf, H_as_bfloat16)  # reversed, it would lay the fragment h out against its 32-bit view
            T.copy(h_words, H_as_int32)
            T.copy(q_words, Q_as_int32)
            T.copy(g_halves, G_as_float16)
            # written through the view, read as the buffer's own dtype
            back_bits = T.view(back, (N,), "int32")
            for i in T.Parallel(N):
                back_bits[N - 1 - i if reversed_ else i] = I[N - 1 - i if reversed_ else i]
            T.copy(back, I_as_float32)
            halves_words = T.view(halves, (N,), "int32")
            T.copy(I, halves_words)
            T.copy(halves, I_as_float16)
            T.copy(T.view(halves, (4 * N,), "int8"), I_as_int8)

    return main


def thread_views():
    """The same views of thread arrays (T.alloc_local): each thread its own part, in vectorized and
    serial loops."""
    per = N // 32

    @T.prim_func
    def main(
        F: T.Tensor((N,), "float32"), H: T.Tensor((N,), "float16"), Q: T.Tensor((N,), "int8"), I: T.Tensor((N,), "int32"),
        G: T.Tensor((ROWS, COLS), "float32"),
        F_as_int32: T.Tensor((N,), "int32"), F_as_uint32: T.Tensor((N,), "uint32"), H_as_int16: T.Tensor((N,), "int16"),
        H_as_bfloat16: T.Tensor((N,), "bfloat16"), H_as_int32: T.Tensor((N // 2,), "int32"), Q_as_int32: T.Tensor((N // 4,), "int32"),
        G_as_float16: T.Tensor((ROWS, 2 * COLS), "float16"), I_as_float32: T.Tensor((N,), "float32"),
        I_as_float16: T.Tensor((2 * N,), "float16"), I_as_int8: T.Tensor((4 * N,), "int8"),
    ):
        with T.Kernel(1, threads=32):
            t = T.get_thread_binding()
            f = T.alloc_local((per,), "float32")
            h = T.alloc_local((per,), "float16")
            q = T.alloc_local((per,), "int8")
            g = T.alloc_local((COLS // 2,), "float32")  # half a row of G per thread
            back = T.alloc_local((per,), "float32")
            halves = T.alloc_local((2 * per,), "float16")
            for i in T.vectorized(per):
                f[i] = F[t * per + i]
                h[i] = H[t * per + i]
                q[i] = Q[t * per + i]
            for i in T.vectorized(COLS // 2):
                g[i] = G[t // 2, (t % 2) * (COLS // 2) + i]
            f_bits = T.view(f, (per,), "int32")
            f_ubits = T.view(f, (per,), "uint32")
            h_short = T.view(h, (per,), "int16")
            h_bf = T.view(h, (per,), "bfloat16")
            h_words = T.view(h, (per // 2,), "int32")
            q_words = T.view(q, (per // 4,), "int32")
            g_halves = T.view(g, (COLS,), "float16")
            for i in T.vectorized(per):
                F_as_int32[t * per + i] = f_bits[i]
            for i in T.serial(per):
                F_as_uint32[t * per + i] = f_ubits[i]
                H_as_bfloat16[t * per + i] = h_bf[i]
            for i in T.vectorized(per):
                H_as_int16[t * per + i] = h_short[i]
            for i in T.vectorized(per // 2):
                H_as_int32[t * (per // 2) + i] = h_words[i]
            for i in T.serial(per // 4):
                Q_as_int32[t * (per // 4) + i] = q_words[i]
            for i in T.vectorized(COLS):
                G_as_float16[t // 2, (t % 2) * COLS + i] = g_halves[i]
            back_bits = T.view(back, (per,), "int32")
            halves_words = T.view(halves, (per,), "int32")
            for i in T.serial(per):
                back_bits[i] = I[t * per + i]
            for i in T.vectorized(per):
                halves_words[i] = I[t * per + i]
            for i in T.vectorized(per):
                I_as_float32[t * per + i] = back[i]
            for i in T.vectorized(2 * per):
                I_as_float16[t * 2 * per + i] = halves[i]
            halves_bytes = T.view(halves, (4 * per,), "int8")
            for i in T.vectorized(4 * per):
                I_as_int8[t * 4 * per + i] = halves_bytes[i]

    return main


@functools.cache
def compiled(scope: str, target: str = "metal"):
    func = thread_views() if scope == "local" else tile_views(scope)
    tgt = E.metal4_target() if target == "metal4" else E.plain_metal_target()
    return tilelang.compile(func, out_idx=list(range(len(INPUTS), len(INPUTS) + len(OUTPUTS))), target=tgt, execution_backend="emulator")


def inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, (shape, dtype) in INPUTS.items():
        if dtype.is_floating_point:
            out[name] = (torch.randn(shape, generator=gen) * 100).to(dtype)
        else:
            info = torch.iinfo(dtype)
            out[name] = torch.randint(info.min, info.max, shape, generator=gen, dtype=dtype)
    return out


def check_bits(results, x: dict[str, torch.Tensor]) -> None:
    """Every output bit for bit equal to torch's `.view(dtype)` of its input (NaN bit patterns included)."""
    for got, (name, (shape, _, reference)) in zip(results, OUTPUTS.items()):
        want = reference(x).reshape(shape)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        wrong = (got.view(torch.uint8) != want.view(torch.uint8)).sum().item()
        assert wrong == 0, f"{name}: {wrong} bytes differ; got {got.flatten()[:4]}, expected {want.flatten()[:4]}"


@pytest.mark.parametrize("scope", ["shared", "fragment", "local"])
def test_views_reinterpret_the_bits(scope):
    x = inputs()
    check_bits(compiled(scope)(*x.values()), x)


def test_threadgroup_views_under_racecheck():
    x = inputs()
    check_bits(racecheck(compiled("shared"), *x.values(), seeds=(0, 1)), x)


def test_vectorized_copies_through_views_on_metal4():
    source = compiled("shared", "metal4").get_kernel_source()
    assert "(threadgroup int4*)" in source  # the half -> int32 and int8 -> int32 views read whole vectors
    x = inputs()
    check_bits(compiled("shared", "metal4")(*x.values()), x)


def test_scalar_view_of_a_threadgroup_array_reads_bits_not_values():
    """One threadgroup array (no merged pool), element by element: `s_bits[i]` printed as `s[i]` of an
    `int` array converted each float to a number (1, 2, -1) instead of reading its bits. An index
    past the view's end is still reported by the emulator."""

    @T.prim_func
    def main(A: T.Tensor((64,), "float32"), shift: T.int32, B: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64,), "float32")
            s_bits = T.view(s, (64,), "int32")
            for i in T.Parallel(64):
                s[i] = A[i]
            for i in T.Parallel(64):
                B[i] = s_bits[63 - i + shift]

    kernel = tilelang.compile(main, out_idx=[-1], target=E.plain_metal_target(), execution_backend="emulator")
    a = torch.randn(64) * 10
    assert torch.equal(kernel(a, 0), a.view(torch.int32).flip(0))
    with pytest.raises(EmulatorRuntimeError, match=r"out-of-bounds access to threadgroup array 's_bits': element index 64, buffer extent 64 elements"):
        kernel(a, 1)


def gemm_of(a_view: bool, accumulator_view: bool, size: int = 32, a_bits: str = "int16"):
    """C = A @ B with A staged as `a_bits` read through a float16 view (`a_view`), or the float32
    accumulator written out through an int32 view (`accumulator_view`)."""
    a_cols = {"int16": size, "int8": 2 * size}[a_bits]  # a row of float16 bits

    @T.prim_func
    def main(A: T.Tensor((size, a_cols), a_bits), B: T.Tensor((size, size), "float16"),
             C: T.Tensor((size, size), "int32" if accumulator_view else "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((size, a_cols), a_bits)
            B_s = T.alloc_shared((size, size), "float16")
            C_l = T.alloc_fragment((size, size), "float32")
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.clear(C_l)
            T.gemm(T.view(A_s, (size, size), "float16") if a_view else A_s, B_s, C_l)
            T.copy(T.view(C_l, (size, size), "int32") if accumulator_view else C_l, C)

    return main


@pytest.mark.parametrize("target", ["metal", "metal4"])
def test_gemm_reads_a_float16_view_of_int16_threadgroup_storage(target):
    """simdgroup_load takes a pointer of the view's type: the storage is declared with it."""
    tgt = E.metal4_target() if target == "metal4" else E.plain_metal_target()
    kernel = tilelang.compile(gemm_of(a_view=True, accumulator_view=False), out_idx=[-1], target=tgt, execution_backend="emulator")
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(32, 32, generator=gen).half(), torch.randn(32, 32, generator=gen).half()
    torch.testing.assert_close(kernel(a.view(torch.int16), b), a.float() @ b.float(), rtol=1e-3, atol=1e-3)


def test_view_of_a_gemm_accumulator_in_matrix_registers_is_refused():
    with pytest.raises(CodegenError, match=r"^C_l: T.view reads it as float32 and int32, but the GEMM keeps it in matrix registers"):
        tilelang.compile(gemm_of(a_view=True, accumulator_view=True), out_idx=[-1], target=E.plain_metal_target(), execution_backend="emulator")


def test_gemm_operand_view_wider_than_its_storage_is_refused():
    """simdgroup_load takes a float16 pointer; int8 storage read as float16 gives it none (the
    emulator could not bound the matrix read through a cast)."""
    with pytest.raises(CodegenError, match=r"^A_s: a matrix operation reads its float16 view, but the storage is declared int8"):
        tilelang.compile(gemm_of(a_view=True, accumulator_view=False, a_bits="int8"), out_idx=[-1], target=E.plain_metal_target(), execution_backend="emulator")


def test_atomic_on_reinterpreted_storage_is_refused():
    @T.prim_func
    def main(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64,), "float32")
            s_bits = T.view(s, (64,), "int32")
            for i in T.Parallel(64):
                s[i] = A[i]
            for i in T.Parallel(64):
                T.atomic_add(s_bits[(i + 1) % 64], 1)
            for i in T.Parallel(64):
                B[i] = s_bits[i]

    with pytest.raises(CodegenError, match=r"^s_bits: an atomic on storage that T.view reads as float32 and int32"):
        tilelang.compile(main, out_idx=[-1], target=E.plain_metal_target(), execution_backend="emulator")
