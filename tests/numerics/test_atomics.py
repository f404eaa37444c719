"""Element and tile atomics (T.atomic_add / atomic_max / atomic_min) run in the emulator with
contention: every thread of several threadgroups hits a handful of bins (16-bit neighbours in one
32-bit word collide too), in device and in threadgroup memory. Integers must be
exact; float adds are compared within a tolerance (the order of the adds is not fixed)."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.errors import CodegenError, MetalLoweringError

BLOCKS, THREADS, REPEAT, BINS = 3, 64, 4, 6  # even: 16-bit atomics need whole 32-bit words
N = BLOCKS * THREADS * REPEAT
TORCH = {"int32": torch.int32, "uint32": torch.uint32, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _start(dtype: str, which: str):
    """Start value of a max / min bin, representable in dtype."""
    if dtype == "uint32":
        return 0 if which == "max" else 4_000_000_000
    if dtype == "int32":
        return -2_000_000_000 if which == "max" else 2_000_000_000
    return -59904.0 if which == "max" else 59904.0  # exact in float16 and bfloat16


@functools.lru_cache(maxsize=None)
def histogram_kernel(dtype: str):
    """Every element i adds / maxes / mins V[i] into bin Idx[i], once in device memory and once in
    the threadgroup's own shared bins (copied out per threadgroup)."""
    lo, hi = _start(dtype, "max"), _start(dtype, "min")

    @T.prim_func
    def kernel(
        Idx: T.Tensor((N,), "int32"),
        V: T.Tensor((N,), dtype),
        AddD: T.Tensor((BINS,), dtype),
        MaxD: T.Tensor((BINS,), dtype),
        MinD: T.Tensor((BINS,), dtype),
        AddS: T.Tensor((BLOCKS, BINS), dtype),
        MaxS: T.Tensor((BLOCKS, BINS), dtype),
        MinS: T.Tensor((BLOCKS, BINS), dtype),
    ):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            s_add = T.alloc_shared((BINS,), dtype)
            s_max = T.alloc_shared((BINS,), dtype)
            s_min = T.alloc_shared((BINS,), dtype)
            tx = T.get_thread_binding()
            for j in T.Parallel(BINS):
                s_add[j] = T.cast(0, dtype)
                s_max[j] = T.cast(lo, dtype)
                s_min[j] = T.cast(hi, dtype)
            for r in T.serial(REPEAT):
                i = (bx * THREADS + tx) * REPEAT + r
                T.atomic_add(AddD[Idx[i]], V[i])
                T.atomic_max(MaxD[Idx[i]], V[i])
                T.atomic_min(MinD[Idx[i]], V[i])
                T.atomic_add(s_add[Idx[i]], V[i])
                T.atomic_max(s_max[Idx[i]], V[i])
                T.atomic_min(s_min[Idx[i]], V[i])
            for j in T.Parallel(BINS):
                AddS[bx, j] = s_add[j]
                MaxS[bx, j] = s_max[j]
                MinS[bx, j] = s_min[j]

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


def _values(dtype: str, gen: torch.Generator) -> torch.Tensor:
    if dtype == "float32":
        return torch.randn(N, generator=gen) * 100
    if dtype in ("float16", "bfloat16"):
        # small integers: every partial sum is exact in 16 bits, so any order gives the same bits
        return torch.randint(-3, 4, (N,), generator=gen).to(TORCH[dtype])
    if dtype == "uint32":
        return torch.randint(0, 2**32, (N,), generator=gen, dtype=torch.int64).to(torch.uint32)  # top bit set too
    return torch.randint(-(2**20), 2**20, (N,), generator=gen, dtype=torch.int32)


def _scatter(values: torch.Tensor, idx: torch.Tensor, kind: str, start) -> torch.Tensor:
    """Reference bins (int64 / float64 to stay exact), starting from `start`."""
    wide = torch.float64 if values.dtype.is_floating_point else torch.int64
    out = torch.full((BINS,), start, dtype=wide)
    return out.scatter_reduce(0, idx.long(), values.to(wide), reduce={"add": "sum", "max": "amax", "min": "amin"}[kind])


@pytest.mark.parametrize("dtype", ["int32", "uint32", "float32", "float16", "bfloat16"])
def test_histogram_add_max_min_in_device_and_threadgroup_memory(dtype):
    gen = torch.Generator().manual_seed(7)
    kernel = histogram_kernel(dtype)
    idx = torch.randint(0, BINS, (N,), generator=gen, dtype=torch.int32)
    idx[: THREADS * REPEAT] = 2  # the whole first threadgroup on one bin: maximal contention
    v = _values(dtype, gen)
    ty = TORCH[dtype]
    add_start = torch.arange(BINS).to(ty)  # device bins start non-zero: the kernel must add to them
    add_d = add_start.clone()
    max_d = torch.full((BINS,), _start(dtype, "max"), dtype=ty)
    min_d = torch.full((BINS,), _start(dtype, "min"), dtype=ty)
    add_s, max_s, min_s = (torch.zeros(BLOCKS, BINS, dtype=ty) for _ in range(3))
    kernel(idx, v, add_d, max_d, min_d, add_s, max_s, min_s)

    def check(got, want, kind):
        if not dtype.startswith("float") and dtype != "bfloat16":
            wrap = want % 2**32 if dtype == "uint32" else (want + 2**31) % 2**32 - 2**31  # int adds wrap
            assert torch.equal(got.to(torch.int64), wrap if kind == "add" else want), (kind, got, want)
        elif dtype == "float32" and kind == "add":
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-2)
        else:
            assert torch.equal(got.double(), want), (kind, got, want)  # max / min and exact small sums

    check(add_d, _scatter(v, idx, "add", 0) + add_start.to(torch.float64 if ty.is_floating_point else torch.int64), "add")
    check(max_d, _scatter(v, idx, "max", _start(dtype, "max")), "max")
    check(min_d, _scatter(v, idx, "min", _start(dtype, "min")), "min")
    per = THREADS * REPEAT
    for b in range(BLOCKS):
        part, pidx = v[b * per : (b + 1) * per], idx[b * per : (b + 1) * per]
        check(add_s[b], _scatter(part, pidx, "add", 0), "add")
        check(max_s[b], _scatter(part, pidx, "max", _start(dtype, "max")), "max")
        check(min_s[b], _scatter(part, pidx, "min", _start(dtype, "min")), "min")


@functools.lru_cache(maxsize=None)
def ticket_kernel(dtype: str):
    """Every thread takes a ticket: the previous value of one shared counter (return_prev=True)."""

    @T.prim_func
    def kernel(Counter: T.Tensor((1,), dtype), Tickets: T.Tensor((BLOCKS * THREADS,), dtype)):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            tx = T.get_thread_binding()
            Tickets[bx * THREADS + tx] = T.atomic_add(Counter[0], T.cast(1, dtype), return_prev=True)

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_return_prev_hands_out_every_ticket_once(dtype):
    counter = torch.zeros(1, dtype=TORCH[dtype])
    tickets = torch.zeros(BLOCKS * THREADS, dtype=TORCH[dtype])
    ticket_kernel(dtype)(counter, tickets)
    assert int(counter[0]) == BLOCKS * THREADS
    assert torch.equal(tickets.sort().values.long(), torch.arange(BLOCKS * THREADS))


@functools.lru_cache(maxsize=None)
def tile_kernel():
    """Tile forms: a fragment added into device memory by every threadgroup, a shared tile maxed into
    a sub-region, a scalar broadcast min, and a one-element region."""
    M, K = 16, 20  # 320 elements: 5 per thread, rows not a multiple of the threads

    @T.prim_func
    def kernel(
        A: T.Tensor((BLOCKS * M, K), "float32"), C: T.Tensor((M, K), "float32"), D: T.Tensor((M + 3, K), "int32"), E: T.Tensor((2,), "int32")
    ):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            frag = T.alloc_fragment((M, K), "float32")
            tile = T.alloc_shared((M, K), "int32")
            T.copy(A[bx * M, 0], frag)
            T.atomic_add(C, frag)
            for i, j in T.Parallel(M, K):
                tile[i, j] = T.cast(A[bx * M + i, j] * 10, "int32")
            T.atomic_max(D[3 : M + 3, 0:K], tile)
            T.atomic_min(D[0:3, 2:7], bx)
            T.atomic_add(E[1:2], 1)  # a one-element region: once per threadgroup, not once per thread

    return tilelang.compile(kernel, target="metal", execution_backend="emulator"), M, K


def test_tile_atomics_from_fragments_shared_tiles_and_scalars():
    kernel, M, K = tile_kernel()
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(BLOCKS * M, K, generator=gen)
    c = torch.randn(M, K, generator=gen)
    d = torch.full((M + 3, K), 5, dtype=torch.int32)
    c_want = c + a.view(BLOCKS, M, K).sum(0)
    d_want = d.clone()
    d_want[3:] = torch.maximum(d_want[3:], (a * 10).to(torch.int32).view(BLOCKS, M, K).amax(0))
    d_want[0:3, 2:7] = 0
    e = torch.zeros(2, dtype=torch.int32)
    kernel(a, c, d, e)
    torch.testing.assert_close(c, c_want, rtol=1e-5, atol=1e-5)
    assert torch.equal(d, d_want)
    assert e.tolist() == [0, BLOCKS]


def _lower(func):
    return tilelang.lower(func, target="metal")


def test_non_relaxed_memory_order_is_refused():
    @T.prim_func
    def element(C: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            T.atomic_add(C[0], 1, memory_order="acquire")

    with pytest.raises(CodegenError, match="memory_order='acquire'.*relaxed only"):
        _lower(element)

    @T.prim_func
    def tile(C: T.Tensor((4,), "float32"), S: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=32):
            T.atomic_add(C, S, memory_order="seq_cst")

    with pytest.raises(MetalLoweringError, match="memory_order='seq_cst'.*relaxed only"):
        _lower(tile)


def test_atomics_on_unsupported_memory_or_dtype_are_refused():
    @T.prim_func
    def local(C: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=32):
            acc = T.alloc_local((4,), "int32")
            T.atomic_add(acc[0], 1)
            C[0] = acc[0]

    with pytest.raises(CodegenError, match="device or threadgroup memory"):
        _lower(local)

    @T.prim_func
    def wide(C: T.Tensor((4,), "int64")):
        with T.Kernel(1, threads=32):
            T.atomic_add(C[0], T.int64(1))

    with pytest.raises(CodegenError, match="int32, uint32, float32"):
        _lower(wide)


def test_mismatched_tile_regions_are_refused():
    @T.prim_func
    def kernel(C: T.Tensor((8, 8), "float32"), S: T.Tensor((8, 8), "float32")):
        with T.Kernel(1, threads=32):
            T.atomic_add(C[0:4, 0:8], S[0:8, 0:4])

    with pytest.raises(Exception, match="region|extent"):
        _lower(kernel)


def test_half_width_atomics_on_odd_buffers_are_refused():
    @T.prim_func
    def kernel(C: T.Tensor((5,), "float16")):
        with T.Kernel(1, threads=32):
            T.atomic_add(C[0], T.float16(1))

    with pytest.raises(MetalLoweringError, match="float16 buffer C of 5 elements.*even number"):
        _lower(kernel)


@functools.lru_cache(maxsize=None)
def vector_kernel():
    """T.atomic_addx2 / atomic_addx4 (one element atomic per lane on Metal), every threadgroup on the
    same destination; the x4 form also returns the previous values."""

    @T.prim_func
    def kernel(C: T.Tensor((96,), "float32"), S: T.Tensor((96,), "float32"), Prev: T.Tensor((BLOCKS, 64), "float32")):
        with T.Kernel(BLOCKS, threads=16) as bx:
            tx = T.get_thread_binding()
            T.atomic_addx2(C[tx * 2], S[tx * 2])
            prev = T.atomic_addx4(C[32 + tx * 4], S[32 + tx * 4], return_prev=True)
            Prev[bx, T.Ramp(tx * 4, 1, 4)] = prev

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


def test_vector_atomic_adds_are_element_atomics_per_lane():
    gen = torch.Generator().manual_seed(5)
    c = torch.randint(-50, 50, (96,), generator=gen).float()
    s = torch.randint(-50, 50, (96,), generator=gen).float()  # integers: exact in any order
    prev = torch.zeros(BLOCKS, 64)
    want = c.clone()
    want[:32] += BLOCKS * s[:32]
    want[32:] += BLOCKS * s[32:]
    start = c[32:].clone()
    vector_kernel()(c, s, prev)
    assert torch.equal(c, want)
    # every threadgroup saw start + k * s for a distinct k in 0..BLOCKS-1
    ks = ((prev - start) / torch.where(s[32:] == 0, 1, s[32:])).round()
    nonzero = s[32:] != 0
    assert torch.equal(ks[:, nonzero].sort(0).values, torch.arange(BLOCKS).float()[:, None].expand(BLOCKS, int(nonzero.sum())))


@functools.lru_cache(maxsize=None)
def counter_kernel():
    """Many threadgroups, each thread bumping the same two counters many times (int and float)."""

    @T.prim_func
    def kernel(Count: T.Tensor((2,), "int32"), FCount: T.Tensor((2,), "float32")):
        with T.Kernel(32, threads=64):
            for _ in T.serial(32):
                T.atomic_add(Count[0], 1)
                T.atomic_max(Count[1], T.get_thread_binding())
                T.atomic_add(FCount[0], 1.0)

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


def test_device_atomics_are_atomic_across_parallel_threadgroups(monkeypatch):
    # More workers than cores: the OS interleaves the threadgroups, so a read-modify-write that
    # is not atomic loses updates (checked: a plain load + store in the shim fails this test).
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_WORKERS", "6")
    count = torch.zeros(2, dtype=torch.int32)
    fcount = torch.zeros(2)
    counter_kernel()(count, fcount)
    assert count.tolist() == [32 * 64 * 32, 63]
    assert fcount[0].item() == 32 * 64 * 32  # exact: every partial sum is an integer below 2^24


@functools.lru_cache(maxsize=None)
def load_store_kernel():
    """Each thread atomically stores its id + 1 into a shared slot and a device slot (relaxed),
    then, after a barrier, atomically loads its neighbour's shared slot."""

    @T.prim_func
    def main(F: T.Tensor((64,), "float32"), I: T.Tensor((64,), "int32"), Out: T.Tensor((64,), "int32"), G: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            tx = T.get_thread_binding()
            slots = T.alloc_shared((64,), "int32")
            T.atomic_store(slots[tx], I[tx] + 1, memory_order="relaxed")
            T.atomic_store(G[tx], T.atomic_load(F[tx], memory_order="relaxed") * 2.0, memory_order="relaxed")
            T.sync_threads()
            Out[tx] = T.atomic_load(slots[(tx + 1) % 64], memory_order="relaxed")

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_atomic_load_and_store_in_device_and_threadgroup_memory():
    kernel = load_store_kernel()
    f, i = torch.randn(64), torch.randint(-100, 100, (64,), dtype=torch.int32)
    out, g = torch.empty(64, dtype=torch.int32), torch.empty(64)
    kernel(f, i, out, g)
    assert torch.equal(out, (i + 1).roll(-1))
    assert torch.equal(g, f * 2.0)
    src = kernel.get_kernel_source()
    assert "atomic_store_explicit((threadgroup atomic_int*)" in src and "atomic_load_explicit((const device atomic_float*)" in src


def test_atomic_load_store_refuse_non_relaxed_orders_and_16_bit_types():
    @T.prim_func
    def default_order(C: T.Tensor((4,), "int32"), D: T.Tensor((4,), "int32")):
        with T.Kernel(1, threads=4):
            tx = T.get_thread_binding()
            D[tx] = T.atomic_load(C[tx])

    with pytest.raises(CodegenError, match="memory_order='seq_cst'.*relaxed only"):
        _lower(default_order)

    @T.prim_func
    def half_store(C: T.Tensor((4,), "float16")):
        with T.Kernel(1, threads=4):
            T.atomic_store(C[T.get_thread_binding()], T.float16(1), memory_order="relaxed")

    with pytest.raises(CodegenError, match="take int32, uint32 or float32"):
        _lower(half_store)
