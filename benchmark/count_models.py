"""Emulator counts of a full-size problem from small proxies that keep what a threadgroup's work
depends on (compare_mlx.py). Counts per threadgroup depend on the tile, the real K (or key length)
and where a tile meets the matrix edge, not on how many threadgroups there are; so each model runs a
few proxies, solves for the per-threadgroup terms exactly and evaluates them at the full size.

- GEMM (`gemm_counts`): a dimension of size D in tiles of t has q = D // t whole tiles and a
  remainder r = D % t. Proxies of size a * t + r for a in {1, 2} keep the remainder and the row
  pitch modulo the tile (so an odd pitch stays odd); the total is bilinear in (a, b): interior,
  edge-row, edge-column and corner terms, solved from four proxies and evaluated at (q_M, q_N). A
  dimension shorter than its tile (q = 0) is kept as it is.
- Attention (`attention_counts`): each query block does a fixed amount of work plus a fixed amount
  per key block it visits; the totals of two sequence lengths give both, evaluated over the query
  blocks of the full length (all key blocks, or the causal prefix).
- Linear (`linear_counts`): counts affine in one size (the key length of a decode step); two sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

Counts = Mapping[str, float]


def _combine(terms: Sequence[tuple[float, Counts]]) -> dict[str, float]:
    names = sorted({n for _, c in terms for n in c})
    return {n: sum(w * float(c.get(n, 0)) for w, c in terms) for n in names}


def proxy_sizes(size: int, tile: int) -> list[tuple[int, int]]:
    """(multiplier a, proxy size) pairs for one GEMM dimension: a * tile + size % tile for a in
    {1, 2}, or the size itself when it is shorter than one tile."""
    q, r = divmod(size, tile)
    if q == 0:
        return [(0, size)]
    return [(1, tile + r), (2, 2 * tile + r)]


def gemm_counts(M: int, N: int, block_m: int, block_n: int, measure: Callable[[int, int], Counts]) -> dict[str, float]:
    """Counts of the M x N problem from `measure(M', N')` on the proxies (K is the caller's)."""
    rows, cols = proxy_sizes(M, block_m), proxy_sizes(N, block_n)
    measured = {(a, b): measure(m, n) for a, m in rows for b, n in cols}
    qm, qn = M // block_m, N // block_n
    if len(rows) == 1 and len(cols) == 1:
        return dict(measured[(rows[0][0], cols[0][0])])
    if len(rows) == 1:  # T(b) = b * X + Y: evaluate at qn
        a = rows[0][0]
        t1, t2 = measured[(a, 1)], measured[(a, 2)]
        return _combine([(qn - 1, t2), (2 - qn, t1)])
    if len(cols) == 1:
        b = cols[0][0]
        t1, t2 = measured[(1, b)], measured[(2, b)]
        return _combine([(qm - 1, t2), (2 - qm, t1)])
    # T(a, b) = a b I + b Er + a Ec + C; bilinear interpolation through the four corners, exact
    t11, t12, t21, t22 = measured[(1, 1)], measured[(1, 2)], measured[(2, 1)], measured[(2, 2)]
    return _combine([((2 - qm) * (2 - qn), t11), ((2 - qm) * (qn - 1), t12), ((qm - 1) * (2 - qn), t21), ((qm - 1) * (qn - 1), t22)])


def visited_key_blocks(seq: int, block_q: int, block_k: int, causal: bool) -> list[int]:
    """Key blocks each query block visits (a causal query block stops at its own last row)."""
    nk = math.ceil(seq / block_k)
    return [min(nk, math.ceil(min(seq, (i + 1) * block_q) / block_k)) if causal else nk for i in range(math.ceil(seq / block_q))]


def attention_counts(seq: int, block_q: int, block_k: int, causal: bool, heads: int, measure: Callable[[int], Counts]) -> dict[str, float]:
    """Counts of a `heads`-head prefill of length `seq` from `measure(L)` (one head) at two lengths:
    per query block `base + visits * per_block`."""
    unit = block_q * block_k // math.gcd(block_q, block_k)
    lengths = (unit, 2 * unit)
    totals = [measure(n) for n in lengths]
    # T(L) = n_q(L) * base + visits(L) * per_block: two equations, two unknown count vectors
    nq = [len(visited_key_blocks(n, block_q, block_k, causal)) for n in lengths]
    vs = [sum(visited_key_blocks(n, block_q, block_k, causal)) for n in lengths]
    det = nq[0] * vs[1] - nq[1] * vs[0]
    if det == 0:
        raise ValueError("attention proxy lengths do not separate the per-block terms")
    base = _combine([(vs[1] / det, totals[0]), (-vs[0] / det, totals[1])])
    per_block = _combine([(-nq[1] / det, totals[0]), (nq[0] / det, totals[1])])
    full_nq = len(visited_key_blocks(seq, block_q, block_k, causal))
    full_vs = sum(visited_key_blocks(seq, block_q, block_k, causal))
    return _combine([(heads * full_nq, base), (heads * full_vs, per_block)])


def linear_counts(size: int, sizes: tuple[int, int], scale: float, measure: Callable[[int], Counts]) -> dict[str, float]:
    """Counts affine in one size, from `measure` at two sizes, evaluated at `size`, times `scale`."""
    (s0, s1), (t0, t1) = sizes, (measure(sizes[0]), measure(sizes[1]))
    w1 = (size - s0) / (s1 - s0)
    return _combine([(scale * (1 - w1), t0), (scale * w1, t1)])
