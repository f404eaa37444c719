"""benchmark/count_models.py: full-size counts from proxies are exact where the per-threadgroup
model holds (checked against synthetic kernels whose per-tile counts are known), and one real GEMM
in the emulator agrees with its full-size count."""

from __future__ import annotations

import math

import pytest
from bench_support import load_benchmark

models = load_benchmark("count_models")


def _tile_count(rows: int, cols: int) -> dict[str, float]:
    # a made-up per-tile cost: depends on the tile's own extent, like an edge tile's guarded accesses
    return {"loads": 3 * rows * cols + 7, "edges": (rows != 64) + 2 * (cols != 128)}


def _synthetic(M: int, N: int, bm: int = 64, bn: int = 128) -> dict[str, float]:
    total = {"loads": 0.0, "edges": 0.0}
    for i in range(math.ceil(M / bm)):
        for j in range(math.ceil(N / bn)):
            c = _tile_count(min(bm, M - i * bm), min(bn, N - j * bn))
            for k in total:
                total[k] += c[k]
    return total


@pytest.mark.parametrize("M,N", [(4096, 4096), (4000, 4000), (4095, 4097), (1, 4096), (16, 4000), (64, 128), (200, 70)])
def test_gemm_model_is_exact_for_per_tile_counts(M, N):
    assert models.gemm_counts(M, N, 64, 128, _synthetic) == pytest.approx(_synthetic(M, N))


def test_gemm_proxies_keep_the_remainder_and_the_pitch_parity():
    assert models.proxy_sizes(4097, 128) == [(1, 129), (2, 257)]
    assert models.proxy_sizes(4096, 128) == [(1, 128), (2, 256)]
    assert models.proxy_sizes(16, 64) == [(0, 16)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bk", [(64, 64), (64, 32), (32, 16)])
def test_attention_model_is_exact_for_per_block_counts(causal, bq, bk):
    def kernel(seq: int) -> dict[str, float]:
        visits = models.visited_key_blocks(seq, bq, bk, causal)
        return {"ops": sum(11 + 5 * v for v in visits), "blocks": float(len(visits))}

    heads = 3
    want = {k: heads * v for k, v in kernel(4096).items()}
    assert models.attention_counts(4096, bq, bk, causal, heads, kernel) == pytest.approx(want)


def test_causal_query_blocks_visit_their_prefix():
    assert models.visited_key_blocks(128, 64, 32, True) == [2, 4]
    assert models.visited_key_blocks(128, 64, 32, False) == [4, 4]


def test_linear_model_interpolates_and_scales():
    got = models.linear_counts(4096, (512, 1024), 8, lambda n: {"x": 10 + 2 * n})
    assert got == {"x": 8 * (10 + 2 * 4096)}
