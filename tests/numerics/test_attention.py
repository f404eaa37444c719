"""Attention on Metal, run in the emulator against torch on CPU.

- `T.gemm` with A in a register fragment (P . V): simdgroup and cooperative-tensor paths, B in shared
  or global memory, transposed B; the fragment is read in place (no threadgroup staging).
- flash attention forward (tilelang_metal/attention.py): MHA and GQA, causal or not, bshd and bhsd,
  fp16 and bf16, head dims 64 and 128, masked tails, a runtime sequence length.
- flash decoding: split-KV kernel plus combine kernel in one module.
- refusals: a producer with another layout, transpose_A, tiles that cannot be split, too much
  threadgroup memory.

Kernels are compiled once per configuration (lru_cache); the wide matrix is in the slow tier.
"""

import functools
import math

import pytest
import tilelang
import tilelang.language as T
import torch
import torch.nn.functional as F

from tilelang_metal.kernels.attention import MASKED_SCORE, flash_attention_program, flash_decoding_program
from tilelang_metal.kernels.attention_config import attention_dataflow
from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.kernels import metal4_target

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _target(name: str):
    return metal4_target() if name == "metal4" else "metal"


# ----------------------------------------------------------------------------- register-fragment A


def pv_program(M, N, K, D, threads, b_global, policy_s=T.GemmWarpPolicy.FullRow, dtype="float16"):
    """O = cast(Q K^T) V with the cast scores P in registers as the second GEMM's A operand.
    b_global: V is read from device memory, stored transposed (V^T is (K, N))."""
    v_shape = (K, N) if b_global else (N, K)

    @T.prim_func
    def main(Q: T.Tensor((M, D), dtype), Kt: T.Tensor((N, D), dtype), V: T.Tensor(v_shape, dtype), O: T.Tensor((M, K), "float32")):
        with T.Kernel(1, threads=threads) as _:
            Q_s = T.alloc_shared((M, D), dtype)
            K_s = T.alloc_shared((N, D), dtype)
            S = T.alloc_fragment((M, N), "float32")
            P = T.alloc_fragment((M, N), dtype)
            acc = T.alloc_fragment((M, K), "float32")
            T.copy(Q, Q_s)
            T.copy(Kt, K_s)
            T.clear(S)
            T.gemm(Q_s, K_s, S, transpose_B=True, policy=policy_s)
            T.copy(S, P)
            T.clear(acc)
            if b_global:
                T.gemm(P, V, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            else:
                V_s = T.alloc_shared((N, K), dtype)
                T.copy(V, V_s)
                T.gemm(P, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc, O)

    return main


@functools.lru_cache(maxsize=None)
def pv_kernel(target: str, M, N, K, D, threads, b_global):
    return tilelang.compile(pv_program(M, N, K, D, threads, b_global), target=_target(target), execution_backend="emulator")


@pytest.mark.parametrize(
    "target,M,N,K,D,threads,b_global",
    [
        ("metal", 32, 40, 24, 16, 64, False),  # N=40: five 8-column blocks of P per row block
        ("metal4", 64, 64, 32, 32, 128, True),  # cooperative tensors; V from device memory, transposed
        pytest.param("metal4", 32, 64, 64, 16, 64, False, marks=pytest.mark.slow),
        pytest.param("metal", 64, 16, 48, 8, 128, True, marks=pytest.mark.slow),
    ],
)
def test_register_fragment_a_operand(target, M, N, K, D, threads, b_global):
    kernel = pv_kernel(target, M, N, K, D, threads, b_global)
    torch.manual_seed(M + N + K)
    q, k = torch.randn(M, D).half(), torch.randn(N, D).half()
    v = torch.randn(N, K).half()
    out = torch.full((M, K), float("nan"))
    kernel(q, k, v.T.contiguous() if b_global else v, out)
    p = (q.float() @ k.float().T).half().float()
    torch.testing.assert_close(out, p @ v.float(), atol=2e-3, rtol=2e-3)


def test_register_operand_is_read_in_place():
    """P never goes through threadgroup memory: the only threadgroup buffers are the staged Q, K, V."""
    source = pv_kernel("metal4", 64, 64, 32, 32, 128, True).get_kernel_source()
    assert "matmul2d" in source  # both GEMMs on cooperative tensors
    assert "threadgroup half* P" not in source and "P_shared" not in source
    assert source.count("threadgroup_barrier") <= 2


def run_pv(kernel, M, N, K, D, b_global, poison_row=None):
    """Race-checked run of a pv_program kernel against torch; `poison_row`: a NaN in that query row,
    which must reach that output row and no other (a replica or row split mixing rows would spread it)."""
    torch.manual_seed(M * 3 + N + K)
    q, k = torch.randn(M, D).half(), torch.randn(N, D).half()
    v = torch.randn(N, K).half()
    if poison_row is not None:
        q[poison_row, 0] = float("nan")
    out = torch.full((M, K), float("nan"))
    racecheck(kernel, q, k, v.T.contiguous() if b_global else v, out)
    want = (q.float() @ k.float().T).half().float() @ v.float()
    torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3, equal_nan=True)
    if poison_row is not None:
        assert out[poison_row].isnan().all() and not out[torch.arange(M) != poison_row].isnan().any()


def test_square_producer_feeds_register_a():
    """S from a Square-policy GEMM feeds a register A operand: the plugin gives S the rows split P
    needs (transform/fragment_groups.py) instead of the policy's 2x2 simdgroups."""
    kernel = tilelang.compile(
        pv_program(64, 64, 32, 32, 128, False, policy_s=T.GemmWarpPolicy.Square), target="metal", execution_backend="emulator"
    )
    run_pv(kernel, 64, 64, 32, 32, False)


# M, N, K, D, threads: fewer 8-row (16-row on metal4) tiles than simdgroups (decoding's 16 heads per tile)
FEW_ROWS = [
    ("metal", 16, 32, 32, 16, 128, False),  # 2 simdgroups along M, C split in two along N
    ("metal", 8, 32, 24, 16, 256, True),  # 1 along M; C (3 column tiles) does not split: 8 replicas of S and C
    ("metal", 24, 40, 64, 16, 128, False),  # 3 row tiles on 4 simdgroups: 1 along M, 4 along N
    ("metal4", 16, 64, 64, 16, 256, False),  # cooperative tensors would need 8 replicas: simdgroup matrices
    # flash attention's block_m 32 on 4 simdgroups: S alone would take cooperative tensors 2x2, P . V
    # simdgroup matrices 4x1; both take simdgroup matrices 4x1 (one instruction per fragment group)
    ("metal4", 32, 64, 64, 32, 128, False),
]


@pytest.mark.parametrize("target,M,N,K,D,threads,b_global", FEW_ROWS)
def test_register_a_with_fewer_row_tiles_than_simdgroups(target, M, N, K, D, threads, b_global):
    run_pv(pv_kernel(target, M, N, K, D, threads, b_global), M, N, K, D, b_global, poison_row=M - 3)


def test_few_rows_partitions_are_replicated_rows():
    """16 rows on 4 simdgroups: S and its copy P hold whole rows (2 along M, 2 replicas), P . V splits
    its C along N (2 x 2): the lane layouts agree with no data movement."""
    from tilelang_metal.gemm import recorded_plans

    with recorded_plans() as plans:
        tilelang.lower(pv_program(16, 32, 32, 16, 128, False), target="metal")
    parts = {p.problem.C.buffer.name: p.partition for p in plans if hasattr(p, "partition")}
    assert (parts["S"].m_warp, parts["S"].n_warp, parts["S"].replicas) == (2, 1, 2)
    assert (parts["acc"].m_warp, parts["acc"].n_warp, parts["acc"].replicas) == (2, 2, 1)


def test_register_a_needs_whole_row_tiles():
    with pytest.raises(MetalLoweringError, match=r"register fragment \(A_f, 12x32\) needs whole 8x8 .*M=12 is not a multiple of 8 rows"):
        tilelang.lower(fragment_a_program(12, 32, 32, 64), target="metal")


def fragment_a_program(M, K, N, threads, transpose_A=False, annotate_A=False):
    """C = A B with A loaded by T.copy from device memory into a register fragment (stored (K, M)
    when transpose_A). annotate_A: A's fragment is given a thread layout by hand as well."""
    a_shape = (K, M) if transpose_A else (M, K)

    @T.prim_func
    def main(A: T.Tensor(a_shape, "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=threads) as _:
            A_f = T.alloc_fragment(a_shape, "float16")
            B_s = T.alloc_shared((K, N), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            if annotate_A:
                T.annotate_layout({A_f: T.Fragment(a_shape, forward_thread_fn=lambda i, j: (i * K + j) % threads)})
            T.copy(A, A_f)
            T.copy(B, B_s)
            T.clear(acc)
            T.gemm(A_f, B_s, acc, transpose_A=transpose_A)
            T.copy(acc, C)

    return main


def test_transposed_register_a_is_refused():
    with pytest.raises(MetalLoweringError, match="cannot transpose A"):
        tilelang.lower(fragment_a_program(32, 32, 32, 32, transpose_A=True), target="metal")


def test_annotated_register_a_layout_is_refused():
    with pytest.raises(MetalLoweringError, match="fragment A_f is given two different thread layouts"):
        tilelang.lower(fragment_a_program(64, 32, 48, 64, annotate_A=True), target="metal")


def test_register_a_loaded_by_copy_from_global():
    """A fragment A filled by T.copy from device memory takes the layout the GEMM proposes."""
    kernel = tilelang.compile(fragment_a_program(64, 32, 48, 64), target="metal", execution_backend="emulator")
    a, b = torch.randn(64, 32).half(), torch.randn(32, 48).half()
    c = torch.empty(64, 48)
    kernel(a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), atol=2e-3, rtol=2e-3)


def test_replicated_register_a_gemm_stores_device_c_once():
    """8 rows on 8 simdgroups with C in device memory: 1 simdgroup along M, 2 along N, 4 replicas of
    that grid; only the first replica stores C (racecheck: no two threads write one element)."""
    M, K, N, threads = 8, 24, 16, 256

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=threads) as _:
            A_f = T.alloc_fragment((M, K), "float16")
            B_s = T.alloc_shared((K, N), "float16")
            T.copy(A, A_f)
            T.copy(B, B_s)
            T.gemm(A_f, B_s, C, clear_accum=True)

    kernel = tilelang.compile(main, target="metal", execution_backend="emulator")
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    c = torch.full((M, N), float("nan"))
    racecheck(kernel, a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), atol=2e-3, rtol=2e-3)


# ----------------------------------------------------------------------------- flash attention


def attention_reference(q, k, v, causal, layout):
    if layout == "bshd":  # -> (batch, heads, seq, dim)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    return out.transpose(1, 2) if layout == "bshd" else out


@functools.lru_cache(maxsize=None)
def attention_kernel(target, heads, kv_heads, seq, dim, causal, layout, dtype, block_m, block_n, threads):
    program = flash_attention_program(
        1, heads, seq, dim, causal=causal, kv_heads=kv_heads, layout=layout, dtype=dtype, block_m=block_m, block_n=block_n, threads=threads,
        target=_target(target),
    )
    return tilelang.compile(program, out_idx=[3], target=_target(target), execution_backend="emulator")


def _shape(layout, heads, seq, dim):
    return (1, seq, heads, dim) if layout == "bshd" else (1, heads, seq, dim)


def assert_no_infinity(source):
    """Masks and initial maxima are the finite MASKED_SCORE: under Metal's fast math (the
    MTLCompileOptions default) the compiler may assume no infinities, so none is in the source."""
    assert "INFINITY" not in source and "HUGE_VAL" not in source and "NAN" not in source
    assert f"{MASKED_SCORE!r}f" in source, "the mask value MASKED_SCORE is not in the source"


def run_attention(target, heads, kv_heads, seq, dim, causal, layout, dtype, block_m, block_n, threads, seqs):
    kernel = attention_kernel(target, heads, kv_heads, seq, dim, causal, layout, dtype, block_m, block_n, threads)
    assert_no_infinity(kernel.get_kernel_source())
    for n in seqs:
        torch.manual_seed(n * 7 + dim)
        q = torch.randn(_shape(layout, heads, n, dim)).to(TORCH[dtype])
        k, v = (torch.randn(_shape(layout, kv_heads, n, dim)).to(TORCH[dtype]) for _ in range(2))
        out = kernel(q, k, v)
        assert out.shape == q.shape and torch.isfinite(out.float()).all()
        tol = 2e-2 if dtype == "bfloat16" else 4e-3
        torch.testing.assert_close(out.float(), attention_reference(q, k, v, causal, layout), atol=tol, rtol=tol)


# target, heads, kv_heads, seq (None: runtime), dim, causal, layout, dtype, block_m, block_n, threads, sequence lengths run
QUICK = [
    ("metal", 2, 2, 77, 64, False, "bshd", "float16", 32, 32, 64, (77,)),  # tail of 13 keys / queries
]
SLOW = [
    # GQA, runtime length; causal with block_m = 2 block_n: rows 0-31 of query block 0 see a fully masked key block 1
    ("metal4", 2, 1, None, 64, True, "bhsd", "bfloat16", 64, 32, 128, (45, 96)),
    # block_m 32 on 4 simdgroups: S would take cooperative tensors (2x2) and P . V simdgroup matrices
    # (4x1); both take simdgroup matrices 4x1 so S and P agree (transform/fragment_groups.py)
    ("metal4", 2, 2, 77, 64, False, "bshd", "float16", 32, 64, 128, (77,)),
    ("metal4", 2, 2, 128, 64, False, "bshd", "float16", 64, 64, 128, (128,)),
    ("metal", 2, 2, 100, 64, True, "bshd", "float16", 64, 64, 128, (100,)),
    ("metal", 4, 2, None, 64, True, "bhsd", "float16", 32, 32, 64, (33, 70)),
    ("metal", 1, 1, 50, 128, True, "bshd", "bfloat16", 32, 32, 64, (50,)),  # head_dim 128
    ("metal4", 2, 2, 77, 128, False, "bhsd", "float16", 64, 32, 128, (77,)),
    ("metal4", 4, 1, 90, 64, False, "bshd", "float16", 32, 32, 64, (90,)),
]


@pytest.mark.parametrize("config", QUICK + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW], ids=str)
def test_flash_attention_matches_sdpa(config):
    run_attention(*config)


# ----------------------------------------------------------------------------- wrong inputs

# The quick tier's GQA kernel: bhsd, bfloat16, 2 query heads on 1 KV head, head_dim 64, runtime seq_len.
GQA_RUNTIME = ("metal4", 2, 1, None, 64, True, "bhsd", "bfloat16", 64, 32, 128)


def _bhsd(heads, seq, dim=64, dtype=torch.bfloat16, batch=1):
    return torch.randn(batch, heads, seq, dim).to(dtype)


# (id, the arguments, the error, its message): each names the parameter and what to pass
WRONG_INPUTS = [
    # batch, heads, head_dim or seq_len that disagree with the kernel or with each other
    ("q-batch", lambda: (_bhsd(2, 40, batch=2), _bhsd(1, 40), _bhsd(1, 40)), ValueError, r"^Q: expected shape \(1, 2, 40, 64\)"),
    ("k-batch", lambda: (_bhsd(2, 40), _bhsd(1, 40, batch=2), _bhsd(1, 40)), ValueError, r"^K: expected shape \(1, 1, 40, 64\)"),
    ("q-heads", lambda: (_bhsd(3, 40), _bhsd(1, 40), _bhsd(1, 40)), ValueError, r"^Q: expected shape \(1, 2, 40, 64\).*got \(1, 3, 40, 64\)$"),
    ("gqa-kv-heads", lambda: (_bhsd(2, 40), _bhsd(2, 40), _bhsd(2, 40)), ValueError, r"^K: expected shape \(1, 1, 40, 64\).*got \(1, 2, 40, 64\)$"),
    ("head-dim", lambda: (_bhsd(2, 40, dim=32), _bhsd(1, 40, dim=32), _bhsd(1, 40, dim=32)), ValueError, r"^Q: expected shape \(1, 2, 40, 64\)"),
    ("k-seq-len", lambda: (_bhsd(2, 40), _bhsd(1, 50), _bhsd(1, 50)), ValueError, r"^seq_len: Q has 40 but K has 50; both are seq_len and must be equal$"),
    ("v-seq-len", lambda: (_bhsd(2, 40), _bhsd(1, 40), _bhsd(1, 41)), ValueError, r"seq_len: Q has 40 but V has 41; both are seq_len and must be equal$"),
    ("dtype", lambda: (_bhsd(2, 40), _bhsd(1, 40, dtype=torch.float16), _bhsd(1, 40)), TypeError, r"^K: expected dtype bfloat16, got float16; pass K\.to\(torch\.bfloat16\)$"),
]


def test_wrong_inputs_are_refused_at_call_time():
    """Every wrong call is refused before launch with one line; the kernel still works after. One test
    (not parametrized) so that one worker compiles the kernel, shared with the quick GQA case."""
    kernel = attention_kernel(*GQA_RUNTIME)
    for case, make, error, message in WRONG_INPUTS:
        with pytest.raises(error, match=message) as info:
            kernel(*make())
        assert "\n" not in str(info.value), case
    q, k, v = _bhsd(2, 20), _bhsd(1, 20), _bhsd(1, 20)  # seq_len 20: shorter than one block of keys or queries
    torch.testing.assert_close(kernel(q, k, v).float(), attention_reference(q, k, v, True, "bhsd"), atol=2e-2, rtol=2e-2)
    # Views of the right values in another layout are inputs: read as dense copies (calling_convention.md).
    q = torch.randn(1, 20, 2, 64).bfloat16().transpose(1, 2)  # bshd memory viewed as bhsd
    k, v = _bhsd(1, 20, dim=128)[..., :64], _bhsd(1, 20, dim=128)[..., ::2]  # sliced, strided
    torch.testing.assert_close(kernel(q, k, v).float(), attention_reference(q, k, v, True, "bhsd"), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: flash_attention_program(1, 2, 64, 63, block_m=32, block_n=32, threads=64), r"head_dim=63 is not a multiple of 8.*e\.g\. 56 or 64"),
        (lambda: flash_attention_program(1, 2, 64, 36, block_m=32, block_n=32, threads=64), r"head_dim=36 is not a multiple of 8"),
        (lambda: flash_attention_program(1, 2, 64, 64, block_m=32, block_n=20, threads=64), r"block_n=20 is not a multiple of 8.*use block_n=16 or 24"),
        (lambda: flash_attention_program(1, 2, 64, 64, block_m=36, block_n=32, threads=64), r"block_m=36 is not a multiple of 8.*use block_m=32 or 40"),
        (lambda: flash_attention_program(1, 2, 64, 64, block_m=32, block_n=32, threads=48), r"threads=48 must be a positive multiple of 32"),
        (lambda: flash_attention_program(1, 2, 64, 64, dtype="float8_e4m3"), r"dtype='float8_e4m3' is not supported"),
        (lambda: flash_attention_program(1, 6, 64, 64, kv_heads=4), r"heads \(6\) to be a multiple of kv_heads \(4\).*use kv_heads in \[1, 2, 3, 6\]"),
        (lambda: flash_decoding_program(1, 6, 4, 64, 64), r"heads \(6\) to be a multiple of kv_heads \(4\)"),
        # were TVM InternalErrors (a fragment layout that cannot be inferred; an is_int check)
        (lambda: flash_attention_program(1, 2, 0, 64), r"^flash_attention_program seq_len=0 must be at least 1; pass seq_len >= 1, or None \(a length given at run time\)$"),
        (lambda: flash_attention_program(1, 2, 16.0, 64), r"^flash_attention_program seq_len=16.0 must be an integer \(a float was given\); pass int\(seq_len\), or None"),
        (lambda: flash_decoding_program(1, 8, 2, 64, 64, block_h=12, threads=64, dataflow="staged"), r"block_h=12 is not a multiple of 8.*use block_h=8 or 16"),
    ],
    ids=["head-dim-odd", "head-dim-36", "block-n", "block-m", "threads", "dtype", "gqa", "gqa-decoding", "seq-len-0", "seq-len-float", "block-h"],
)
def test_configuration_errors_are_refused_when_the_program_is_built(build, message):
    with pytest.raises(MetalLoweringError, match=message):
        build()


def test_too_much_threadgroup_memory_names_buffers_and_a_fit():
    """The staged dataflow (plain metal) stages K and V: 2 x 128 x 128 halves do not fit, block_n=64
    does; the direct dataflow (metal4) stages nothing, so the same configuration builds there."""
    with pytest.raises(MetalLoweringError, match=r"stages 65536 B .*K_shared 32768 B.*Use block_n=64.*Metal 4 target"):
        flash_attention_program(1, 1, 128, 128, block_m=64, block_n=128)
    flash_attention_program(1, 1, 128, 128, block_m=64, block_n=128, target=metal4_target())


# ----------------------------------------------------------------------------- flash decoding


@functools.lru_cache(maxsize=None)
def decoding_kernel(target, batch, heads, kv_heads, seq, dim, num_split, block_h, block_n, threads):
    program = flash_decoding_program(  # the target's GEMM dataflow (the vector one has its own tests)
        batch, heads, kv_heads, seq, dim, num_split=num_split, block_h=block_h, block_n=block_n, threads=threads, target=_target(target),
        dataflow=attention_dataflow(_target(target)),
    )
    return tilelang.compile(program, out_idx=[3, 4, 5], target=_target(target), execution_backend="emulator")


@pytest.mark.parametrize(
    "target,batch,heads,kv_heads,seq,dim,num_split,block_h,block_n,threads",
    [
        ("metal4", 2, 8, 2, 101, 64, 3, 16, 32, 64),  # 4 query heads per KV head, padded to 16 rows
        # 20 keys in 6 splits of 4: the last split has no key at all (its rows never see a real score)
        ("metal", 1, 4, 2, 20, 64, 6, 16, 32, 64),
        # 16 heads per tile on 4 and 8 simdgroups: rows split over 2, replicated (transform/fragment_groups.py)
        pytest.param("metal", 1, 16, 1, 70, 64, 3, 16, 32, 128, marks=pytest.mark.slow),
        pytest.param("metal4", 1, 32, 2, 45, 64, 2, 16, 32, 256, marks=pytest.mark.slow),
        pytest.param("metal", 1, 4, 4, 70, 64, 4, 16, 32, 64, marks=pytest.mark.slow),  # MHA: 1 real row of 16
    ],
)
def test_flash_decoding_split_kv_and_combine(target, batch, heads, kv_heads, seq, dim, num_split, block_h, block_n, threads):
    kernel = decoding_kernel(target, batch, heads, kv_heads, seq, dim, num_split, block_h, block_n, threads)
    assert_no_infinity(kernel.get_kernel_source())
    torch.manual_seed(seq)
    q = torch.randn(batch, heads, dim).half()
    k, v = (torch.randn(batch, seq, kv_heads, dim).half() for _ in range(2))
    partial_out, partial_lse, out = kernel(q, k, v)
    group = heads // kv_heads
    kk, vv = (x.transpose(1, 2).repeat_interleave(group, 1).float() for x in (k, v))
    ref = F.scaled_dot_product_attention(q.float()[:, :, None], kk, vv)[:, :, 0]
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=4e-3)
    # each split's log-sum-exp (base 2) agrees with its keys alone
    split_len = -(-seq // num_split)
    scores = (q.float()[:, :, None] @ kk.transpose(-1, -2))[:, :, 0] / math.sqrt(dim)
    assert torch.isfinite(partial_out).all() and torch.isfinite(partial_lse).all()  # no inf/NaN, even for empty splits
    for s in range(num_split):
        part = scores[..., s * split_len : (s + 1) * split_len]
        if part.shape[-1] == 0:  # no key: a zero partial output whose weight in the combine is exactly 0
            assert (partial_out[:, :, s] == 0).all() and (partial_lse[:, :, s] == torch.tensor(MASKED_SCORE)).all()
            continue
        torch.testing.assert_close(partial_lse[:, :, s], torch.logsumexp(part, -1) / math.log(2), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("target", ["metal4", "metal"])
def test_nan_and_inf_inputs_reach_the_output_as_in_torch(target):
    """A NaN in one query row made every score of the row NaN; Metal's max ignores NaN, so the row
    kept the mask value as its maximum, was treated as a row without keys and came out 0 (torch:
    NaN). Now the NaN survives the softmax, in the forward kernel and in GEMM-based decoding. A
    +inf in a key gives +inf or -inf scores by the sign of q: NaN rows or zero weights, as torch."""
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 40, 2, 64).half() for _ in range(3))
    q[0, 5, 1, 3] = math.nan
    k[0, 7, 0, 9] = math.inf
    out = attention_kernel(target, 2, 2, 40, 64, False, "bshd", "float16", 32, 32, 64)(q, k, v).float()
    ref = attention_reference(q, k, v, False, "bshd")
    assert torch.isnan(ref[0, 5, 1]).all() and torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    torch.testing.assert_close(out[finite], ref[finite], atol=4e-3, rtol=4e-3)
    decode = decoding_kernel(target, 1, 4, 1, 20, 64, 3, 16, 32, 64)
    qd, kd, vd = torch.randn(1, 4, 64).half(), torch.randn(1, 20, 1, 64).half(), torch.randn(1, 20, 1, 64).half()
    qd[0, 1, 3] = math.nan
    assert torch.isnan(decode(qd, kd, vd)[-1][0]).any(-1).tolist() == [False, True, False, False]


@pytest.mark.slow
def test_guide_attention_snippet():
    """The attention example of docs/guide.md runs as written."""
    import pathlib
    import re

    guide = (pathlib.Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    marker = "<!-- tested: tests/numerics/test_attention.py::test_guide_attention_snippet -->"
    block = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", guide, re.S)
    assert block, "the guide's attention snippet is missing"
    exec(compile(block.group(1), "docs/guide.md", "exec"), {})


@pytest.mark.parametrize("target", ["metal4", pytest.param("metal", marks=pytest.mark.slow)])
def test_accumulator_is_next_gemms_a_operand(target):
    """One fp32 fragment is C of the first GEMM, edited in place, then A of the second (no copy)."""
    M, N, K, D = 64, 64, 32, 32

    @T.prim_func
    def main(Q: T.Tensor((M, D), "float32"), Kt: T.Tensor((N, D), "float32"), V: T.Tensor((N, K), "float32"), O: T.Tensor((M, K), "float32")):
        with T.Kernel(1, threads=128) as _:
            Q_s = T.alloc_shared((M, D), "float32")
            K_s = T.alloc_shared((N, D), "float32")
            V_s = T.alloc_shared((N, K), "float32")
            S = T.alloc_fragment((M, N), "float32")
            acc = T.alloc_fragment((M, K), "float32")
            T.copy(Q, Q_s)
            T.copy(Kt, K_s)
            T.copy(V, V_s)
            T.clear(S)
            T.gemm(Q_s, K_s, S, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(M, N):
                S[i, j] = T.max(S[i, j], 0)
            T.clear(acc)
            T.gemm(S, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc, O)

    kernel = tilelang.compile(main, target=_target(target), execution_backend="emulator")
    assert ("matmul2d" in kernel.get_kernel_source()) == (target == "metal4")
    q, k, v = torch.randn(M, D), torch.randn(N, D), torch.randn(N, K)
    out = torch.full((M, K), float("nan"))
    kernel(q, k, v, out)
    torch.testing.assert_close(out, torch.relu(q @ k.T) @ v, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- extreme scores

TORCH_ALL = {**TORCH, "float32": torch.float32}
HUGE = 2.0**61  # 32 products of +-2^61 sum exactly to +-2^127 = 1.7e38: below the old sentinel -1e38


@functools.lru_cache(maxsize=None)
def extreme_forward_kernel(target, dtype, causal):
    program = flash_attention_program(1, 1, 40, 32, causal=causal, dtype=dtype, block_m=32, block_n=32, threads=64, target=_target(target))
    return tilelang.compile(program, out_idx=[3], target=_target(target), execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def extreme_decoding_kernel(target, dtype, dataflow):
    program = flash_decoding_program(1, 4, 1, 20, 32, num_split=3, dtype=dtype, block_h=16, block_n=32, threads=64, target=_target(target),
                                     dataflow=dataflow)
    return tilelang.compile(program, out_idx=[3, 4, 5], target=_target(target), execution_backend="emulator")


def extreme_inputs(queries, keys, dtype, factors=None):
    """Scores of +-2^127 * f (f per key: `factors`, or 1 or 0.75 at random; exact in every dtype but
    float16), so torch's softmax is exactly uniform over the keys of the row's best f: q row 0 is
    +inf (every score -inf: torch 2.13 gives 0), row 1 is -2^61 (scores +2^127 f: the largest f
    wins), the others +2^61 (scores -2^127 f: the smallest f wins)."""
    g = torch.Generator().manual_seed(queries + keys)
    q = torch.full((queries, 32), HUGE)
    q[0], q[1] = math.inf, -HUGE
    f = torch.where(torch.rand(keys, 1, generator=g) < 0.5, 1.0, 0.75) if factors is None else torch.tensor(factors)[:, None]
    k = -HUGE * f.expand(keys, 32)
    v = torch.randn(keys, 32, generator=g)
    return (x.to(TORCH_ALL[dtype]) for x in (q, k, v))


# Decoding: 20 keys in 3 splits of 7; each row's best keys lie in one split (keys 8, 10: f 0.75; keys
# 15, 17: f 1). Splits whose maxima tie at 1e37 would weigh alike: log2 of a split's key count is
# below the ulp of its log-sum-exp there, which is all the combine gets.
DECODING_FACTORS = [0.875] * 20
DECODING_FACTORS[8] = DECODING_FACTORS[10] = 0.75
DECODING_FACTORS[15] = DECODING_FACTORS[17] = 1.0


@pytest.mark.parametrize("target,dtype,causal", [("metal", "float32", True), ("metal4", "bfloat16", False)])
def test_scores_below_any_sentinel_match_torch(target, dtype, causal):
    """Scores below -1e38 (the old finite sentinel MASKED_SCORE) lost to it: such rows came out 0,
    and the masked tail keys (at the sentinel) outranked the real ones. Masked keys now weigh 0 by
    position, so the forward kernel and both GEMM decoding dataflows give torch's average of V; a
    row of -inf scores gives torch 2.13's 0."""
    q, k, v = extreme_inputs(40, 40, dtype)
    out = extreme_forward_kernel(target, dtype, causal)(q[None, :, None], k[None, :, None], v[None, :, None])
    ref = attention_reference(q[None, :, None], k[None, :, None], v[None, :, None], causal, "bshd")
    assert torch.isfinite(ref).all() and (ref[0, 0] == 0).all()
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    qd, kd, vd = extreme_inputs(4, 20, dtype, DECODING_FACTORS)
    for dataflow in (attention_dataflow(_target(target)), "vector"):
        *_, out = extreme_decoding_kernel(target, dtype, dataflow)(qd[None], kd[None, :, None], vd[None, :, None])
        ref = F.scaled_dot_product_attention(qd.float()[None, :, None], kd.float()[None, None], vd.float()[None, None])[:, :, 0]
        torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2, msg=lambda m: f"{dataflow}: {m}")


@pytest.mark.parametrize("target", ["metal4", "metal"])
def test_rows_of_minus_infinity_scores_match_torch(target):
    """float16 cannot reach the scores above, but +-inf in q can: a row of -inf scores is 0 in torch
    2.13, and -inf among finite scores weighs 0 (the kernels of the NaN test: no new compile)."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 40, 2, 64).half() for _ in range(3))
    k[..., 1, :] = -k[..., 1, :].abs() - 0.5  # KV head 1: negative keys
    q[0, 3, 1] = math.inf  # every score of the row -inf
    q[0, 4, 1, 7] = math.inf  # one element: -inf scores, except where k is 0 (NaN in torch too)
    out = attention_kernel(target, 2, 2, 40, 64, False, "bshd", "float16", 32, 32, 64)(q, k, v).float()
    ref = attention_reference(q, k, v, False, "bshd")
    assert (ref[0, 3, 1] == 0).all()
    torch.testing.assert_close(out, ref, atol=4e-3, rtol=4e-3, equal_nan=True)
    qd, kd, vd = torch.randn(1, 4, 64).half(), -torch.rand(1, 20, 1, 64).half() - 0.5, torch.randn(1, 20, 1, 64).half()
    qd[0, 2] = math.inf
    *_, out = decoding_kernel(target, 1, 4, 1, 20, 64, 3, 16, 32, 64)(qd, kd, vd)
    ref = F.scaled_dot_product_attention(qd.float()[:, :, None], kd.float().transpose(1, 2).expand(1, 4, 20, 64),
                                         vd.float().transpose(1, 2).expand(1, 4, 20, 64))[:, :, 0]
    assert (ref[0, 2] == 0).all()
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=4e-3)
