"""float16 / bfloat16 atomic adds in the emulator: Metal has no 16-bit atomics, so every add is a
compare-and-swap on the 32-bit word holding the element, and the 2-lane form tilelang's vectorizer
makes of a 16-bit `T.atomic_add` (`tl.atomic_addx2_elem_op` with a vector value) updates both halves
of a word at once, or two words at an odd start. Many threadgroups hit the same outputs on parallel
worker threads; small integer values keep every partial sum exact, so a lost update is a wrong number."""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import MetalLoweringError

BLOCKS, M, N, THREADS = 5, 6, 22, 66
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@functools.lru_cache(maxsize=None)
def accumulate_kernel(dtype: str, form: str):
    """Every threadgroup adds its M x N slice of A into C, into D[:, 1:N+1] and into a threadgroup tile
    copied out per threadgroup. Two elements per thread: C and the tile get 2-lane atomics (both halves
    of a word in one compare-and-swap); D's odd start keeps its adds per element."""

    @T.prim_func
    def kernel(
        A: T.Tensor((BLOCKS * M, N), dtype),
        C: T.Tensor((M, N), dtype),
        D: T.Tensor((M, N + 2), dtype),
        Own: T.Tensor((BLOCKS, M, N), dtype),
    ):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            tile = T.alloc_shared((M, N), dtype)
            T.clear(tile)
            if form == "tile":
                frag = T.alloc_fragment((M, N), dtype)
                T.copy(A[bx * M : (bx + 1) * M, :], frag)
                T.atomic_add(C, frag)
                T.atomic_add(D[:, 1 : N + 1], frag)
                T.atomic_add(tile, frag)
            else:
                for i, j in T.Parallel(M, N):  # vectorized: 2-lane atomics
                    T.atomic_add(C[i, j], A[bx * M + i, j])
                    T.atomic_add(tile[i, j], A[bx * M + i, j])
                for i, j in T.Parallel(M, N):  # the odd start keeps this loop scalar
                    T.atomic_add(D[i, j + 1], A[bx * M + i, j])
            T.copy(tile, Own[bx, :, :])

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


def _inputs(dtype: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ty = TORCH[dtype]
    a = torch.randint(-3, 4, (BLOCKS * M, N), generator=gen).to(ty)
    c = torch.randint(-8, 9, (M, N), generator=gen).to(ty)  # non-zero start: the adds must keep it
    d = torch.randint(-8, 9, (M, N + 2), generator=gen).to(ty)
    return a, c, d, torch.zeros(BLOCKS, M, N, dtype=ty)


def _expected(a, c, d):
    total = a.float().view(BLOCKS, M, N).sum(0)  # exact: small integers
    want_d = d.float().clone()
    want_d[:, 1 : N + 1] += total
    return c.float() + total, want_d, a.float().view(BLOCKS, M, N)


@pytest.mark.parametrize("form", ["tile", "element"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_atomic_adds_from_many_threadgroups_match_torch(dtype, form, monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_WORKERS", "5")  # threadgroups on parallel threads
    kernel = accumulate_kernel(dtype, form)
    assert f"__tlm_atomic_add_{'half' if dtype == 'float16' else 'bfloat'}2((device" in kernel.get_kernel_source()
    a, c, d, own = _inputs(dtype, 3)
    want_c, want_d, want_own = _expected(a, c, d)
    kernel(a, c, d, own)
    assert torch.equal(c.float(), want_c)
    assert torch.equal(d.float(), want_d)  # columns 0 and N+1 untouched, the rest summed
    assert torch.equal(own.float(), want_own)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_atomic_adds_propagate_inf_and_nan_without_touching_the_other_half(dtype):
    kernel = accumulate_kernel(dtype, "tile")
    a, c, d, own = _inputs(dtype, 4)
    a[0, 2], a[M + 1, 3] = float("inf"), float("nan")  # C[0, 2] inf; C[1, 3] nan, its neighbours finite
    a[2 * M + 4, 6], a[3 * M + 4, 6] = float("inf"), float("-inf")  # inf + -inf: nan
    want_c, want_d, want_own = _expected(a, c, d)
    kernel(a, c, d, own)
    for got, want in ((c, want_c), (d, want_d), (own, want_own)):
        torch.testing.assert_close(got.float(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("form", ["tile", "element"])
def test_16_bit_atomic_adds_are_race_free(form):
    a, c, d, own = _inputs("float16", 5)
    want_c, want_d, _ = _expected(a, c, d)
    racecheck(accumulate_kernel("float16", form), a, c, d, own)
    assert torch.equal(c.float(), want_c) and torch.equal(d.float(), want_d)


def test_16_bit_atomic_adds_with_rounding_match_torch():
    # random values: the order of the adds is not fixed, so compare within fp16's rounding of BLOCKS adds
    # (the printed adds round each partial sum to fp16, as CUDA's half atomicAdd does)
    kernel = accumulate_kernel("float16", "element")
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(BLOCKS * M, N, generator=gen).half()
    c, d = torch.randn(M, N, generator=gen).half(), torch.randn(M, N + 2, generator=gen).half()
    c_start, d_start = c.clone(), d.clone()
    want_c, want_d, want_own = _expected(a, c, d)
    kernel(a, c, d, own := torch.zeros(BLOCKS, M, N, dtype=torch.float16))
    # each of the BLOCKS roundings is at most half an fp16 ulp of a partial sum, |partial| <= |start| + sum |a|
    magnitude = a.float().abs().view(BLOCKS, M, N).sum(0)
    assert ((c.float() - want_c).abs() <= BLOCKS * 2**-11 * (c_start.float().abs() + magnitude)).all()
    inner = want_d[:, 1 : N + 1]
    bound = BLOCKS * 2**-11 * (d_start[:, 1 : N + 1].float().abs() + magnitude)
    assert ((d[:, 1 : N + 1].float() - inner).abs() <= bound).all()
    assert torch.equal(d[:, [0, N + 1]], d_start[:, [0, N + 1]])
    assert torch.equal(own.float(), want_own)  # one add onto zero: exact


@functools.lru_cache(maxsize=None)
def float32_into_16_bit_kernel(dtype: str):
    """The split-K shape: float32 partial tiles added into a 16-bit output (the vector value is a cast)."""

    @T.prim_func
    def kernel(A: T.Tensor((BLOCKS * M, N), "float32"), C: T.Tensor((M, N), dtype)):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            frag = T.alloc_fragment((M, N), "float32")
            T.copy(A[bx * M : (bx + 1) * M, :], frag)
            T.atomic_add(C, frag)

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_tiles_added_into_16_bit_outputs_match_torch(dtype):
    kernel = float32_into_16_bit_kernel(dtype)
    msl = "half" if dtype == "float16" else "bfloat"
    assert f"__tlm_atomic_add_{msl}2((device atomic_uint*)(C + " in kernel.get_kernel_source()
    gen = torch.Generator().manual_seed(8)
    a = torch.randint(-6, 7, (BLOCKS * M, N), generator=gen).float() / 4  # quarters: exact sums
    c = torch.randint(-8, 9, (M, N), generator=gen).to(TORCH[dtype])
    want = c.float() + a.view(BLOCKS, M, N).sum(0)
    kernel(a, c)
    assert torch.equal(c.float(), want)


HALVES_THREADS, HALVES_ROUNDS = 64, 2000
# Threadgroups per dtype: every partial sum must stay an exactly representable integer (fp16: up to
# 2048; bf16: up to 256), so fp16 carries the heavier contention.
HALVES_BLOCKS = {"float16": 16, "bfloat16": 4}


@functools.lru_cache(maxsize=None)
def neighbour_halves_kernel(dtype: str):
    """Neighbouring threads update the two halves of one 32-bit word: element adds to H[tx % 8]; 2-lane
    adds at odd starts 1, 3, 5, 7 of P (each spans two words); 4-lane adds at 1 / 3 of Q with
    return_prev. H and P get many rounds of +v then -v (the contention; a partial sum never exceeds
    what the threads hold at once) and then one +v (the count)."""
    blocks = HALVES_BLOCKS[dtype]

    @T.prim_func
    def kernel(
        H: T.Tensor((8,), dtype), P: T.Tensor((10,), dtype), Q: T.Tensor((8,), dtype),
        V: T.Tensor((8,), dtype), NegV: T.Tensor((8,), dtype), Prev: T.Tensor((blocks * HALVES_THREADS, 4), dtype),
    ):
        with T.Kernel(blocks, threads=HALVES_THREADS) as bx:
            tx = T.get_thread_binding()
            for _ in T.serial(HALVES_ROUNDS):
                T.atomic_add(H[tx % 8], T.cast(1, dtype))
                T.atomic_addx2(P[1 + 2 * (tx % 4)], V[2 * (tx % 4)])
                T.atomic_add(H[tx % 8], T.cast(-1, dtype))
                T.atomic_addx2(P[1 + 2 * (tx % 4)], NegV[2 * (tx % 4)])
            T.atomic_add(H[tx % 8], T.cast(1, dtype))
            T.atomic_addx2(P[1 + 2 * (tx % 4)], V[2 * (tx % 4)])
            prev = T.atomic_addx4(Q[1 + 2 * (tx % 2)], V[0], return_prev=True)
            Prev[bx * HALVES_THREADS + tx, T.Ramp(0, 1, 4)] = prev

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_concurrent_updates_of_both_halves_of_a_word_are_not_lost(dtype, monkeypatch):
    # More workers than cores: the OS interleaves the threadgroups (checked: a plain store in place of
    # the 2-lane helper's compare-and-swap fails the float16 case in most runs).
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_WORKERS", "6")
    for _ in range(3):  # a lost update is a matter of timing: give it several launches
        _check_neighbour_halves(dtype)


def _check_neighbour_halves(dtype: str) -> None:
    blocks = HALVES_BLOCKS[dtype]
    ty = TORCH[dtype]
    h, q = torch.zeros(8, dtype=ty), torch.zeros(8, dtype=ty)
    p = torch.zeros(10, dtype=ty)
    v = torch.tensor([1, 1, 1, 1, 2, 1, 1, 1]).to(ty)  # 2-lane sources (1, 1) at 0, 2 and 6, (2, 1) at 4
    prev = torch.zeros(blocks * HALVES_THREADS, 4, dtype=ty)
    neighbour_halves_kernel(dtype)(h, p, q, v, -v, prev)

    threads = torch.arange(blocks * HALVES_THREADS) % HALVES_THREADS
    want_h = torch.bincount(threads % 8, minlength=8).float()
    want_p, want_q = torch.zeros(10), torch.zeros(8)
    for t in threads.tolist():
        k = t % 4
        want_p[1 + 2 * k : 3 + 2 * k] += v[2 * k : 2 * k + 2].float()
        want_q[1 + 2 * (t % 2) : 5 + 2 * (t % 2)] += v[:4].float()
    assert torch.equal(h.float(), want_h)
    assert torch.equal(p.float(), want_p)
    assert torch.equal(q.float(), want_q)
    # return_prev: the threads adding at start 1 saw Q[1] = 0, 1, 2, ... in some order, each value once
    at_one = prev[threads % 2 == 0, 0].float().sort().values
    assert torch.equal(at_one, torch.arange(at_one.numel()).float())


def test_vector_16_bit_atomics_on_odd_buffers_are_refused():
    @T.prim_func
    def kernel(C: T.Tensor((5,), "float16"), S: T.Tensor((4,), "float16")):
        with T.Kernel(1, threads=1):
            T.atomic_addx2(C[3], S[0])

    with pytest.raises(MetalLoweringError, match="float16 buffer C of 5 elements.*even number"):
        tilelang.compile(kernel, target="metal", execution_backend="emulator")
