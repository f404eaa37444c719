"""Global workspaces: `T.alloc_global` buffers in the prim_func body, outside `T.Kernel` (TileLang's
flash-decoding examples keep their partial outputs and log-sum-exp there). tilelang hoists them to
the host function; the plugin's host allocates them for each call and passes them to every kernel
of the module that names them. Run in the emulator (workspaces start poisoned: NaN / -1, so a read
of an element no kernel wrote shows up) and through the torch (MPS) adapter with a recording
stand-in for torch.mps.compile_shader; the MLX adapter runs these modules in test_mlx_backend.py."""

import functools
import math
import types

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.execution import backends, mps_adapter
from tilelang_metal.execution.binding import Device


def scale_then_mix(rows_var: bool = True):
    """Kernel 1 writes W = 2 * A (a workspace sized by A's symbolic row count) and a second
    workspace Count of int32 row markers; kernel 2 reads W at a neighbouring row (another
    threadgroup's result: only ordered by the launch boundary) and writes Out."""
    M = T.dynamic("M") if rows_var else 40

    @T.prim_func
    def main(A: T.Tensor((M, 8), "float32"), Out: T.Tensor((M, 8), "float32")):
        W = T.alloc_global((M, 8), "float32")
        Count = T.alloc_global((M,), "int32")
        with T.Kernel(T.ceildiv(M, 4), threads=32) as bx:
            tx = T.get_thread_binding()
            row = bx * 4 + tx // 8
            if row < M:
                W[row, tx % 8] = A[row, tx % 8] * 2.0
                if tx % 8 == 0:
                    Count[row] = row + 1
        with T.Kernel(T.ceildiv(M, 4), threads=32) as bx:
            tx = T.get_thread_binding()
            row = bx * 4 + tx // 8
            if row < M:
                Out[row, tx % 8] = W[row, tx % 8] + W[(row + 1) % M, 7 - tx % 8] + T.cast(Count[row], "float32")

    return main


def mix_reference(a: torch.Tensor) -> torch.Tensor:
    m = a.shape[0]
    w = 2 * a
    return w + w.roll(-1, 0).flip(1) + torch.arange(1, m + 1, dtype=torch.float32)[:, None]


@functools.lru_cache(maxsize=None)
def mix_kernel(backend: str = "emulator"):
    return tilelang.compile(scale_then_mix(), out_idx=[1], target="metal", execution_backend=backend)


def test_two_kernels_share_a_workspace_sized_per_call():
    kernel = mix_kernel()
    assert [ws.name for ws in kernel.adapter.call.workspaces] == ["W", "Count"]
    for m in (7, 40, 1):  # a partial last threadgroup; one row: its own neighbour
        a = torch.randn(m, 8)
        torch.testing.assert_close(kernel(a), mix_reference(a), rtol=1e-6, atol=1e-6)


def test_each_call_gets_fresh_workspaces_and_both_kernels_the_same_one():
    kernel = mix_kernel()
    call = kernel.adapter.call
    first, second = call.launches
    for launch in (first, second):
        assert sorted(a.workspace for a in launch.arguments if a.is_buffer and a.position is None) == [0, 1]
    one = call.bind((torch.zeros(5, 8),), Device("cpu", "emulator"), poison=True)
    two = call.bind((torch.zeros(6, 8),), Device("cpu", "emulator"), poison=True)
    # the host holds flattened buffers: a workspace is its element count, evaluated per call
    assert one.workspaces[0].shape == (5 * 8,) and two.workspaces[0].shape == (6 * 8,)
    assert one.workspaces[1].dtype == torch.int32 and torch.all(one.workspaces[1] == -1)  # poisoned
    assert torch.isnan(one.workspaces[0]).all()
    slot = lambda launch: next(i for i, a in enumerate(launch.arguments) if a.workspace == 0)  # noqa: E731
    assert first.values(one)[slot(first)] is second.values(one)[slot(second)] is one.workspaces[0]


def test_a_workspace_module_is_race_free():
    a = torch.randn(13, 8)
    out = racecheck(mix_kernel(), a)
    torch.testing.assert_close(out, mix_reference(a), rtol=1e-6, atol=1e-6)


def test_an_unwritten_workspace_element_reads_as_poison():
    # the first kernel skips row 3: the second reads poison there (NaN), never a stale or zero value
    @T.prim_func
    def main(A: T.Tensor((8,), "float32"), Out: T.Tensor((8,), "float32")):
        W = T.alloc_global((8,), "float32")
        with T.Kernel(1, threads=8):
            tx = T.get_thread_binding()
            if tx != 3:
                W[tx] = A[tx]
        with T.Kernel(1, threads=8):
            tx = T.get_thread_binding()
            Out[tx] = W[tx] + 1.0

    kernel = tilelang.compile(main, out_idx=[1], target="metal", execution_backend="emulator")
    out = kernel(torch.arange(8.0))
    assert torch.isnan(out[3]) and torch.equal(out[[0, 1, 2, 4, 5, 6, 7]], torch.tensor([1.0, 2, 3, 5, 6, 7, 8]))


# ------------------------------------------------------------------------ flash decoding
DECODE_BATCH, DECODE_HEADS, DECODE_DIM, DECODE_SPLITS = 2, 3, 16, 4
NEG_BIG = -1.0e30  # the running max before any key: exp(NEG_BIG - m) is 0 without inf - inf


@functools.lru_cache(maxsize=None)
def flash_decoding(seq_kv: int, backend: str = "emulator"):
    """One decoding step for one query token per (batch, head), keys split into DECODE_SPLITS ranges.
    Kernel 1: one threadgroup per (split, head, batch), thread d owns output dimension d; every
    thread keeps the split's running max and denominator (online softmax) and writes its dimension
    of the split's normalised partial output, thread 0 the split's log-sum-exp, both into
    T.alloc_global workspaces. Kernel 2 combines the splits, weighting each by exp(lse - max lse)."""
    B, H, D, splits = DECODE_BATCH, DECODE_HEADS, DECODE_DIM, DECODE_SPLITS
    chunk = -(-seq_kv // splits)
    scale = 1.0 / math.sqrt(D)

    @T.prim_func
    def main(
        Q: T.Tensor((B, H, D), "float16"),
        K: T.Tensor((B, seq_kv, H, D), "float16"),
        V: T.Tensor((B, seq_kv, H, D), "float16"),
        Out: T.Tensor((B, H, D), "float16"),
    ):
        partial = T.alloc_global((B, H, splits, D), "float32")
        lse = T.alloc_global((B, H, splits), "float32")
        with T.Kernel(splits, H, B, threads=D) as (sp, h, b):
            d = T.get_thread_binding()
            run_max = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            acc = T.alloc_var("float32")
            score = T.alloc_var("float32")
            new_max = T.alloc_var("float32")
            run_max = NEG_BIG
            denom = 0.0
            acc = 0.0
            for n in T.serial(chunk):
                key = sp * chunk + n
                if key < seq_kv:
                    score = 0.0
                    for e in T.serial(D):
                        score += T.cast(Q[b, h, e], "float32") * T.cast(K[b, key, h, e], "float32")
                    score = score * scale
                    new_max = T.max(run_max, score)
                    denom = denom * T.exp(run_max - new_max) + T.exp(score - new_max)
                    acc = acc * T.exp(run_max - new_max) + T.exp(score - new_max) * T.cast(V[b, key, h, d], "float32")
                    run_max = new_max
            partial[b, h, sp, d] = T.if_then_else(denom > 0, acc / denom, 0.0)
            if d == 0:
                lse[b, h, sp] = T.if_then_else(denom > 0, run_max + T.log(denom), NEG_BIG)
        with T.Kernel(H, B, threads=D) as (h, b):
            d = T.get_thread_binding()
            top = T.alloc_var("float32")
            weight_sum = T.alloc_var("float32")
            mixed = T.alloc_var("float32")
            top = NEG_BIG
            for s in T.serial(splits):
                top = T.max(top, lse[b, h, s])
            weight_sum = 0.0
            mixed = 0.0
            for s in T.serial(splits):
                weight_sum += T.exp(lse[b, h, s] - top)
                mixed += T.exp(lse[b, h, s] - top) * partial[b, h, s, d]
            Out[b, h, d] = T.cast(mixed / weight_sum, "float16")

    return tilelang.compile(main, out_idx=[3], target="metal", execution_backend=backend)


def decode_inputs(seq_kv: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(DECODE_BATCH, DECODE_HEADS, DECODE_DIM, generator=gen).half()
    k = (torch.randn(DECODE_BATCH, seq_kv, DECODE_HEADS, DECODE_DIM, generator=gen) * 2).half()
    v = torch.randn(DECODE_BATCH, seq_kv, DECODE_HEADS, DECODE_DIM, generator=gen).half()
    return q, k, v


def sdpa_reference(q, k, v) -> torch.Tensor:
    """torch's scaled dot-product attention of one query token, in float32."""
    query = q.float().unsqueeze(2)  # (B, H, 1, D)
    keys, values = k.float().transpose(1, 2), v.float().transpose(1, 2)  # (B, H, S, D)
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values).squeeze(2)


# 97 keys: splits of 25, 25, 25, 22; 9 keys: 3, 3, 3 and an empty last split
@pytest.mark.parametrize("seq_kv", [97, 9])
def test_flash_decoding_with_workspace_partials_matches_torch_sdpa(seq_kv):
    q, k, v = decode_inputs(seq_kv, seq_kv)
    out = flash_decoding(seq_kv)(q, k, v)
    torch.testing.assert_close(out.float(), sdpa_reference(q, k, v), rtol=2e-3, atol=2e-3)


def test_flash_decoding_is_race_free():
    q, k, v = decode_inputs(9, 1)
    out = racecheck(flash_decoding(9), q, k, v)
    torch.testing.assert_close(out.float(), sdpa_reference(q, k, v), rtol=2e-3, atol=2e-3)


def test_flash_decoding_keeps_a_dominant_key_and_large_scores_finite():
    # one key with a huge score in the last split, and large scores elsewhere: the combine's
    # exp(lse - max lse) must not overflow and the result is that key's value
    q, k, v = decode_inputs(97, 3)
    q[:] = 1.0
    k[:, 90] = 60.0  # score 60 * 16 / 4 = 240 per head: exp would overflow float32 without the max
    out = flash_decoding(97)(q, k, v)
    torch.testing.assert_close(out.float(), sdpa_reference(q, k, v), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(out.float(), v[:, 90].float(), rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------------------- torch / MPS
def test_mps_adapter_allocates_workspaces_per_call_and_passes_them_to_each_kernel(monkeypatch):
    launches = []

    def fake_compile_shader(source):
        def kernel(name):
            def launch(*buffers, threads, group_size):
                launches.append((name, buffers, threads, group_size))

            return launch

        return types.SimpleNamespace(main_kernel=kernel("main_kernel"), main_kernel_1=kernel("main_kernel_1"))

    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", fake_compile_shader)
    monkeypatch.setattr(mps_adapter, "MPS", Device("cpu", "torch"))  # no MPS device here: CPU tensors stand in
    kernel = tilelang.compile(scale_then_mix(), out_idx=[1], target="metal", execution_backend="torch")
    a = torch.randn(6, 8)
    out = kernel(a)
    kernel(torch.randn(9, 8))
    (n1, b1, t1, g1), (n2, b2, t2, g2), (_, b3, _, _), (_, b4, _, _) = launches
    assert (n1, n2) == ("main_kernel", "main_kernel_1")
    by_name = lambda launch: dict(zip((x.name for x in launch.arguments), range(len(launch.arguments))))  # noqa: E731
    first, second = (by_name(launch) for launch in kernel.adapter.call.launches)
    w1, w2 = b1[first["W"]], b2[second["W"]]
    assert w1 is w2 and w1.shape == (6 * 8,) and w1.dtype == torch.float32  # one workspace, both kernels
    assert b1[first["Count"]] is b2[second["Count"]] and b1[first["Count"]].dtype == torch.int32
    assert b1[first["A"]] is a and b2[second["Out"]] is out
    assert b3[first["W"]].shape == (9 * 8,) and b3[first["W"]] is not w1  # the next call: its own, sized by it
    assert b4[second["W"]] is b3[first["W"]]
    assert g1 == [32, 1, 1] and t1 == [2 * 32, 1, 1]
