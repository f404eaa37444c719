"""Adversarial sweep: generated configurations of the kernel library and of user-written programs,
each checked against torch on the CPU in the emulator (issue #32, item 11).

What it covers that the GEMM property tests (test_property_gemm.py, test_property_idioms.py) do not:
the GEMV, split-K, softmax, row-reduction, attention and decoding kernels and matmul's tiled route;
user programs with integer types, thread-dependent branches, while loops and T.loop_break,
reductions, cumulative sums, 16- and 32-bit atomics, loops of runtime trip count (negative, 0, 1,
...), their own barriers, T.copy between views of any pitch and a GEMM with a hand-written
epilogue; NaN / inf placements; strided, transposed and offset views; shapes 0-130 (odd and
prime); pass configs (tl.disable_safe_memory_legalize, tl.disable_thread_storage_sync,
tirx.disable_vectorize); both targets.

Budget: one compile per family (symbolic sizes wherever the builder takes them, so one kernel serves
every shape); each family draws many configurations that vary the shapes, the views and the values.
Measured on the shared 2-CPU machine (2026-12-03): cold caches 65 s of CPU, warm 25 s of CPU
(process start included).
Seeded: TILELANG_METAL_ADVERSARIAL_SEED (default 2026), TILELANG_METAL_ADVERSARIAL_SCALE (default 1:
the counts below; 5 for a deeper hunt at no extra compile); a failure message carries the seed, the
family and the configuration, so `check(family, config)` replays it alone.

Tolerances follow from the dtypes: inputs are rounded to their dtype before the float64 reference
is computed, so what is left is the float32 accumulation (the standard bound n * 2^-24 * sum |terms|
for a sum of n terms) and one rounding to the output dtype (its unit roundoff times |result|),
with a factor 2 of margin. Specials compare exactly: NaN where the reference is NaN, the same
infinity where it is infinite.
"""

from __future__ import annotations

import functools
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import tilelang
import tilelang.language as T
import torch
from adversarial_kernels import BINS, COLS, THREADS, gemm_epilogue, own_barriers, strided_copy, user_module

from tilelang_metal import kernels as E
from tilelang_metal.emulator import EmulatorError

SEED = int(os.environ.get("TILELANG_METAL_ADVERSARIAL_SEED", "2026"))
SCALE = float(os.environ.get("TILELANG_METAL_ADVERSARIAL_SCALE", "1"))  # more configurations per compile for a deeper hunt
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
ACC_EPS = 2.0**-24  # float32 accumulation
# sizes 1-130: powers of two and their neighbours, odd and prime sizes
SIZES = (1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 23, 31, 32, 33, 37, 47, 61, 63, 64, 65, 79, 97, 101, 127, 128, 129, 130)
SPECIALS = (math.nan, math.inf, -math.inf)


# ----------------------------------------------------------------------------- comparison


def mismatch(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor | float) -> str | None:
    """None if `out` matches `ref` (float64) within `bound` (elementwise), NaN for NaN and the same
    infinity for an infinity; else a one-line description of the worst element."""
    out = out.detach().double()
    ref = ref.double()
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if out.numel() == 0:
        return None
    nan_ref, nan_out = torch.isnan(ref), torch.isnan(out)
    if not torch.equal(nan_ref, nan_out):
        where = torch.nonzero(nan_ref != nan_out)[0].tolist()
        return f"NaN pattern differs at {where}: out {out[tuple(where)].item()} ref {ref[tuple(where)].item()}"
    inf_ref = torch.isinf(ref)
    if not torch.equal(out[inf_ref], ref[inf_ref]) or torch.isinf(out[~inf_ref & ~nan_ref]).any():
        bad = (torch.isinf(ref) | torch.isinf(out)) & ~(out == ref) & ~nan_ref
        where = torch.nonzero(bad)[0].tolist()
        return f"infinity differs at {where}: out {out[tuple(where)].item()} ref {ref[tuple(where)].item()}"
    finite = ~nan_ref & ~inf_ref
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(ref)
    excess = torch.where(finite, (out - ref).abs() - bound, torch.zeros_like(ref))
    if (excess > 0).any():
        where = torch.nonzero(excess == excess.max())[0].tolist()
        i = tuple(where)
        return f"error {abs(out[i].item() - ref[i].item()):.4g} > bound {bound[i].item():.4g} at {where} (out {out[i].item():.6g}, ref {ref[i].item():.6g})"
    return None


def finite_abs(x: torch.Tensor) -> torch.Tensor:
    """|x| in float64 with NaN / inf as 0 (their elements are compared by the special-value rule)."""
    x = x.double()
    return torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))


def matmul_bound(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, out_dtype: str) -> torch.Tensor:
    """K float32 roundings of a dot product of length K, then one rounding to out_dtype."""
    k = a.shape[-1]
    return 2 * (k * ACC_EPS * (finite_abs(a) @ finite_abs(b)) + UNIT_ROUNDOFF[out_dtype] * finite_abs(ref))


def place_specials(x: torch.Tensor, rng: random.Random, count: int, choices=SPECIALS) -> list:
    """Writes `count` NaN / +-inf values at random positions of x (in place); returns where."""
    placed = []
    flat = x.view(-1) if x.is_contiguous() else None
    for _ in range(count if x.numel() else 0):
        index = rng.randrange(x.numel())
        value = rng.choice(choices)
        if flat is not None:
            flat[index] = value
        else:
            x[tuple(torch.unravel_index(torch.tensor(index), x.shape))] = value
        placed.append((index, value))
    return placed


def view_of(shape: tuple[int, ...], dtype: torch.dtype, kind: str, g: torch.Generator) -> torch.Tensor:
    """A tensor of `shape` laid out as `kind`: contiguous, transposed (last two axes), a strided
    slice (every other column of a wider tensor) or at a storage offset."""
    if kind == "transposed" and len(shape) >= 2:
        base = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).to(dtype)
        return base.transpose(-1, -2)
    if kind == "strided":
        base = torch.randn(*shape[:-1], 2 * shape[-1] + 1, generator=g).to(dtype)
        return base[..., 1::2][..., : shape[-1]]
    if kind == "offset":
        numel = math.prod(shape)
        base = torch.randn(numel + 3, generator=g).to(dtype)
        return base[3:].view(shape)
    return torch.randn(shape, generator=g).to(dtype)


VIEWS = ("contiguous", "transposed", "strided", "offset")


# ----------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """One compiled kernel (built lazily, once per process) and its configurations."""

    name: str
    build: Callable[[], Any]
    draw: Callable[[random.Random], dict]
    run: Callable[[Any, dict, random.Random, torch.Generator], str | None]
    count: int
    excluded: Callable[[dict], str | None] = field(default=lambda cfg: None)


@functools.lru_cache(maxsize=None)
def compiled(name: str) -> Any:
    return FAMILIES[name].build()


def _compile(func: Any, target: Any, out_idx: Any = None, pass_configs: dict | None = None) -> Any:
    return tilelang.compile(func, out_idx=out_idx, target=target, execution_backend="emulator", pass_configs=pass_configs or {})


# --- GEMV, small M: M = 3, N and K symbolic; float16 in, float32 out; plain metal


def draw_gemv_m(rng: random.Random) -> dict:
    return dict(N=rng.choice((0,) + SIZES), K=rng.choice((0,) + SIZES), a_view=rng.choice(VIEWS), b_view=rng.choice(VIEWS),
                specials=rng.choice((0, 0, 1, 2)))


def run_gemm_like(kernel: Any, a: torch.Tensor, b: torch.Tensor, out_dtype: str, rng: random.Random, specials: int) -> str | None:
    place_specials(a if rng.random() < 0.5 else b, rng, specials)
    out = kernel(a, b)
    ref = a.double() @ b.double()
    if a.shape[1] == 0:
        ref = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    ref = ref.to(TORCH[out_dtype]).double()
    return mismatch(out, ref, matmul_bound(a, b, ref, out_dtype))


def run_gemv_m(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    a = view_of((3, cfg["K"]), torch.float16, cfg["a_view"], g)
    b = view_of((cfg["K"], cfg["N"]), torch.float16, cfg["b_view"], g)
    return run_gemm_like(kernel, a, b, "float32", rng, cfg["specials"])


# --- GEMV, small N: N = 5, M and K symbolic; bfloat16 in and out; Metal 4; vectorization off


def draw_gemv_n(rng: random.Random) -> dict:
    return dict(M=rng.choice((0,) + SIZES), K=rng.choice((0,) + SIZES), a_view=rng.choice(VIEWS), b_view=rng.choice(VIEWS),
                specials=rng.choice((0, 0, 1, 2)))


def run_gemv_n(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    a = view_of((cfg["M"], cfg["K"]), torch.bfloat16, cfg["a_view"], g)
    b = view_of((cfg["K"], 5), torch.bfloat16, cfg["b_view"], g)
    return run_gemm_like(kernel, a, b, "bfloat16", rng, cfg["specials"])


# --- split-K: 19 x 45 x 131 in 3 slices, float32; Metal 4 (static sizes: the builder checks them)

SPLIT_K_SHAPE = (19, 45, 131)


def draw_split_k(rng: random.Random) -> dict:
    return dict(a_view=rng.choice(VIEWS), b_view=rng.choice(VIEWS), specials=rng.choice((0, 1, 2, 3)), scale=rng.choice((1.0, 1e-3, 1e3)))


def run_split_k(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    M, N, K = SPLIT_K_SHAPE
    a = view_of((M, K), torch.float32, cfg["a_view"], g) * cfg["scale"]
    b = view_of((K, N), torch.float32, cfg["b_view"], g)
    return run_gemm_like(kernel, a, b, "float32", rng, cfg["specials"])


# --- softmax: 3 rows of 4099 columns (two column blocks), float16; Metal 4


SOFTMAX_SHAPE = (3, 4099)
SOFTMAX_PATTERNS = ("plain", "nan", "+inf", "-inf", "-inf block", "-inf row", "-inf first block", "large")


def draw_softmax(rng: random.Random) -> dict:
    return dict(pattern=rng.choice(SOFTMAX_PATTERNS), row=rng.randrange(SOFTMAX_SHAPE[0]), view=rng.choice(VIEWS), scale=rng.choice((1.0, 8.0)))


def run_softmax(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    rows, cols = SOFTMAX_SHAPE
    x = view_of((rows, cols), torch.float16, cfg["view"], g)
    x.mul_(cfg["scale"])
    r, pattern = cfg["row"], cfg["pattern"]
    column = rng.randrange(cols)
    if pattern == "nan":
        x[r, column] = math.nan
    elif pattern == "+inf":
        x[r, column] = math.inf
    elif pattern == "-inf":
        x[r, column] = -math.inf
    elif pattern == "-inf block":  # the second column block (4096 on) all -inf
        x[r, 4096:] = -math.inf
    elif pattern == "-inf first block":  # the first block all -inf, finite values after
        x[r, :4096] = -math.inf
    elif pattern == "-inf row":
        x[r] = -math.inf
    elif pattern == "large":
        x[r, column] = 60000.0
    out = kernel(x)
    ref = torch.softmax(x.double(), dim=-1).to(torch.float16).double()
    # float32 exponentials (a few ulp) and a float32 sum of `cols` terms, one float16 rounding;
    # 2^-24 absolute: half the spacing of float16's subnormals
    bound = 2 * (UNIT_ROUNDOFF["float16"] + (cols + 8) * ACC_EPS) * ref.abs() + 2.0**-24
    return mismatch(out, ref, bound)


# --- row max: 37 rows of 45 columns (the blocked path), bfloat16 in, float32 out; plain metal


REDUCE_SHAPE = (37, 45)


def draw_row_max(rng: random.Random) -> dict:
    return dict(view=rng.choice(VIEWS), specials=rng.choice((0, 1, 3, 8)), neg_inf_row=rng.random() < 0.3)


def run_row_max(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    x = view_of(REDUCE_SHAPE, torch.bfloat16, cfg["view"], g)
    place_specials(x, rng, cfg["specials"])
    if cfg["neg_inf_row"]:
        x[rng.randrange(REDUCE_SHAPE[0])] = -math.inf
    out = kernel(x)
    return mismatch(out, x.double().amax(dim=1), 0.0)  # a maximum is exact; NaN propagates as in torch.amax


# --- flash attention: causal GQA (4 query heads on 1 KV head), head_dim 32, float32, runtime
# sequence length; plain metal


ATTN = dict(heads=4, kv_heads=1, dim=32)


def draw_attention(rng: random.Random) -> dict:
    return dict(seq=rng.choice(SIZES), q_view=rng.choice(("contiguous", "heads major")), nan_rows=rng.choice((0, 0, 1, 2)), sharp=rng.random() < 0.3)


def causal_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked causally) v in float64, (batch, seq, heads, dim). Written out:
    torch's CPU scaled_dot_product_attention drops a NaN of q for sequences of 1 to 3 (0.0 where
    the definition, and torch itself from 5 on, give NaN)."""
    qh, kh, vh = (x.transpose(1, 2).double() for x in (q, k, v))
    group = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
    seq = qh.shape[2]
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(qh.shape[-1])
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    return (torch.softmax(scores.masked_fill(future, -math.inf), dim=-1) @ vh).transpose(1, 2)


def run_attention(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    seq, heads, kv, dim = cfg["seq"], ATTN["heads"], ATTN["kv_heads"], ATTN["dim"]
    if cfg["q_view"] == "heads major":  # a (batch, seq, heads, dim) view of (batch, heads, seq, dim) storage
        q = torch.randn(1, heads, seq, dim, generator=g).transpose(1, 2)
    else:
        q = torch.randn(1, seq, heads, dim, generator=g)
    if cfg["sharp"]:
        q = q * 20
    k, v = (torch.randn(1, seq, kv, dim, generator=g) for _ in range(2))
    for _ in range(cfg["nan_rows"]):  # a NaN in one query row: that row's output is NaN (torch)
        q[0, rng.randrange(seq), rng.randrange(heads), rng.randrange(dim)] = math.nan
    out = kernel(q, k, v)
    ref = causal_attention_reference(q, k, v)
    # float32: scores are dot products of length dim (|q||k| up to ~20 * dim), exp2 in float32 and a
    # float32 sum over at most seq keys; outputs are convex combinations of V (|v| < 6)
    bound = 2 * ((dim * 20 * 36 + seq * 6) * ACC_EPS * 8 + UNIT_ROUNDOFF["float32"] * ref.abs())
    return mismatch(out, ref, bound)


# --- user module (adversarial_kernels.user_module): symbolic rows n (0 included), runtime trip
# count; plain metal with tl.disable_safe_memory_legalize (every access is guarded in the program)


def draw_user(rng: random.Random) -> dict:
    return dict(n=rng.choice((0,) + SIZES), steps=rng.choice((0, 1, 2, -3, rng.randrange(3, 80))), divisor=rng.choice((1, -1, 7, -7, 3, -1000, 2**31 - 1)), v_view=rng.choice(("transposed", "strided", "offset", "contiguous")),
                specials=rng.choice((0, 0, 1, 3)))


def fmax_fold(x: torch.Tensor) -> torch.Tensor:
    """Metal's max over the last axis: NaNs ignored, NaN only where the whole row is NaN (docs/math.md)."""
    all_nan = torch.isnan(x).all(dim=-1)
    folded = torch.where(torch.isnan(x), torch.full_like(x, -math.inf), x).amax(dim=-1)
    return torch.where(all_nan, torch.full_like(folded, math.nan), folded)


def collatz_steps(value: int) -> int:
    count = 0
    while value != 1:
        value = value // 2 if value % 2 == 0 else 3 * value + 1
        count += 1
    return count


def sum_until(term: int, limit: int) -> int:
    total = 0
    for k in range(200):
        if total > limit:
            break
        total += term + k
    return total


def run_user(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    n, steps = cfg["n"], cfg["steps"]
    xi = torch.randint(-1000, 1000, (n,), dtype=torch.int32, generator=g)
    xb = torch.randint(-128, 128, (n,), dtype=torch.int8, generator=g)
    xs = torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, generator=g)
    xu = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    divisor = cfg["divisor"]
    xh = torch.randn(n, generator=g).half() * 4
    x = torch.randn(n, COLS, generator=g)
    v = view_of((n, COLS), torch.float16, cfg["v_view"], g)
    place_specials(xh, rng, cfg["specials"])
    place_specials(x, rng, cfg["specials"])
    nan = math.nan
    outs = {
        "Yi": torch.full((n,), -99, dtype=torch.int32),
        "Yd": torch.full((n,), -99, dtype=torch.int32),
        "Ys": torch.full((n,), -99, dtype=torch.int16),
        "Yu": torch.full((n,), 99, dtype=torch.uint8),
        "Yb": torch.full((n,), -99, dtype=torch.int8),
        "YC": torch.full((n,), -99, dtype=torch.int32),
        "YL": torch.full((n,), -99, dtype=torch.int32),
        "Yh": torch.full((n,), nan, dtype=torch.float16),
        "RS": torch.full((n,), nan),
        "RM": torch.full((n,), nan),
        "RN": torch.full((n,), nan),
        "RA": torch.full((n,), nan),
        "CS": torch.full((n, COLS), nan),
        "RCS": torch.full((n, COLS), nan),
        "H": torch.zeros(BINS, dtype=torch.int32),
        "S": torch.zeros(COLS),
        "AM": torch.full((1,), -(2**31), dtype=torch.int32),
        "FX": torch.full((COLS,), -math.inf),
        "FN": torch.full((COLS,), math.inf),
        "H16": torch.zeros(8, dtype=torch.float16),
        "BM": torch.full((8,), -2000.0, dtype=torch.bfloat16),
        "BC": torch.zeros(8, dtype=torch.bfloat16),
        "P": torch.full((n,), nan),
        "W": torch.full((n, COLS), nan),
    }
    kernel(xi, xb, xh, x, v, xs, xu, steps, divisor, *outs.values())

    thread = torch.arange(n) % 128
    lanes = torch.arange(max(steps, 0))  # a negative trip count runs no iteration
    gathered = x.double()[:, lanes % COLS] * (lanes + 1).double()
    refs = {
        "Yi": (torch.where(thread % 3 == 0, xi * 3 - 7, torch.where(xi < 0, xi >> 1, xi % 7)), 0),
        "Yb": (xb * 3 + 1, 0),  # int8 arithmetic wraps around
        "YC": (torch.tensor([collatz_steps(int(value) % 97 + 1) for value in xi.abs()], dtype=torch.int32), 0),
        "YL": (torch.tensor([sum_until(int(value) % 13, steps * 50) for value in xi.abs()], dtype=torch.int32), 0),
        "Yd": (torch.div(xi, divisor, rounding_mode="floor") ^ torch.remainder(xi, divisor), 0),
        "Ys": (xs * 7 - (xs >> 3), 0),
        "Yu": ((xu >> 2) ^ (xu * 5), 0),
        # float16 sqrt / exp: correctly rounded float32 results rounded once to float16
        "Yh": (torch.where(xh > 0, torch.sqrt(xh.double()), torch.exp(xh.double()) * 0.5).half(), "ulp"),
        "RS": (x.double().sum(1), 2 * COLS * ACC_EPS * finite_abs(x).sum(1)),
        "RM": (fmax_fold(x.double()), 0),
        "RN": (-fmax_fold(-x.double()), 0),
        "RA": (fmax_fold(x.double().abs()), 0),
        "CS": (x.double().cumsum(1), 2 * COLS * ACC_EPS * finite_abs(x).cumsum(1)),
        "RCS": (x.double().flip(1).cumsum(1).flip(1), 2 * COLS * ACC_EPS * finite_abs(x).flip(1).cumsum(1).flip(1)),
        "H": (torch.bincount((xi % BINS).long(), minlength=BINS).int(), 0),
        "S": (x.double().sum(0), 2 * max(n, 1) * ACC_EPS * finite_abs(x).sum(0)),
        "AM": (torch.tensor([xi.max().item() if n else -(2**31)], dtype=torch.int32), 0),
        # float atomic max / min: NaNs ignored (docs/math.md), the initial -inf / +inf where none is left
        "FX": (fmax_fold(torch.cat([x.double().T, torch.full((COLS, 1), -math.inf, dtype=torch.float64)], 1)), 0),
        "FN": (-fmax_fold(torch.cat([-x.double().T, torch.full((COLS, 1), -math.inf, dtype=torch.float64)], 1)), 0),
        # 16-bit atomics: small integers, so every partial sum is exact in float16 / bfloat16
        "H16": (torch.zeros(8, dtype=torch.float64).index_add_(0, (xi % 8).long(), (xi % 5).double()), 0),
        "BM": (torch.full((8,), -2000.0, dtype=torch.float64).scatter_reduce(0, (xi % 8).long(), xi.bfloat16().double(), "amax"), 0),
        "BC": (torch.zeros(8, dtype=torch.float64).index_add_(0, (torch.div(xi, 8, rounding_mode="floor") % 8).long(), torch.ones(n, dtype=torch.float64)), 0),
        "P": (gathered.sum(1), 2 * max(steps, 1) * ACC_EPS * finite_abs(gathered).sum(1)),
        "W": (v.double() * 2 + 1, 0),  # exact in float32
    }
    for name, (ref, bound) in refs.items():
        out = outs[name]
        if bound == "ulp":
            bound = 2 * UNIT_ROUNDOFF["float16"] * finite_abs(ref) + 2.0**-24
        problem = mismatch(out, ref, bound) if out.is_floating_point() else (None if torch.equal(out, ref.to(out.dtype)) else f"values differ at {torch.nonzero(out != ref.to(out.dtype))[:4].tolist()}")
        if problem:
            return f"{name}: {problem}"
    return None


# --- user GEMM with an epilogue (adversarial_kernels.gemm_epilogue): M, N, K symbolic (K = 0:
# zero trips, K <= 16: one), bfloat16 in, float32 out; Metal 4


def draw_user_gemm(rng: random.Random) -> dict:
    return dict(M=rng.choice((0,) + SIZES), N=rng.choice((0,) + SIZES), K=rng.choice((0, 0) + SIZES), a_view=rng.choice(VIEWS), b_view=rng.choice(VIEWS),
                specials=rng.choice((0, 0, 0, 1)))


def run_user_gemm(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    M, N, K = cfg["M"], cfg["N"], cfg["K"]
    a = view_of((M, K), torch.bfloat16, cfg["a_view"], g)
    b = view_of((K, N), torch.bfloat16, cfg["b_view"], g)
    place_specials(a, rng, cfg["specials"])
    bias = torch.randn(N, generator=g)
    r = torch.randn(M, N, generator=g)
    c = torch.full((M, N), math.nan)
    kernel(a, b, bias, r, c)
    acc = a.double() @ b.double() if K else torch.zeros(M, N, dtype=torch.float64)
    ref = torch.clamp_min(acc * 0.5 + bias.double(), 0) + r.double()
    # relu(NaN): Metal's max returns the other operand (docs/math.md), torch propagates: 0 + R
    ref = torch.where(torch.isnan(acc), r.double(), ref)
    bound = 0.5 * matmul_bound(a, b, acc, "float32") + 4 * ACC_EPS * (finite_abs(acc) * 0.5 + bias.double().abs() + r.double().abs())
    return mismatch(c, ref, bound)


# --- matmul's tiled GEMM route on plain metal (gemm_staged: pipelined staging, 16-byte run copies
# for the odd row pitches 77 and 131, A stored transposed): 77 x 131 x 99, bfloat16 in, float32 out

MATMUL_SHAPE = (77, 131, 99)


def build_matmul() -> Any:
    choice = E.matmul_config(*MATMUL_SHAPE, "bfloat16", "float32", target="metal", trans_A=True)
    assert choice.route == "gemm" and choice.run_copies == ("A", "B"), choice  # the route this family is about
    return _compile(E.matmul_program(choice), E.plain_metal_target(), [-1])


def draw_matmul(rng: random.Random) -> dict:
    return dict(a_view=rng.choice(VIEWS), b_view=rng.choice(VIEWS), specials=rng.choice((0, 0, 1, 2)), scale=rng.choice((1.0, 1e-2, 1e2)))


def run_matmul(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    M, N, K = MATMUL_SHAPE
    a_t = (view_of((K, M), torch.float32, cfg["a_view"], g) * cfg["scale"]).to(torch.bfloat16)  # A stored (K, M)
    b = view_of((K, N), torch.bfloat16, cfg["b_view"], g)
    place_specials(a_t if rng.random() < 0.5 else b, rng, cfg["specials"])
    out = kernel(a_t, b)
    ref = a_t.double().T @ b.double()
    return mismatch(out, ref, matmul_bound(a_t.T, b, ref, "float32"))


# --- row sum of rows of at least 32 runs of 16 bytes (one row per simdgroup, vector loads): 29 rows
# of 301 float16 columns (a ragged last run, a row pitch that is not a multiple of 16 bytes), float32 out; Metal 4

ROW_SUM_SHAPE = (29, 301)


def draw_row_sum(rng: random.Random) -> dict:
    return dict(view=rng.choice(VIEWS), specials=rng.choice((0, 0, 1, 2)), scale=rng.choice((1.0, 100.0)))


def run_row_sum(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    x = (view_of(ROW_SUM_SHAPE, torch.float32, cfg["view"], g) * cfg["scale"]).half()
    place_specials(x, rng, cfg["specials"])
    out = kernel(x)
    ref = x.double().sum(1)
    return mismatch(out, ref, 2 * (ROW_SUM_SHAPE[1] * ACC_EPS * finite_abs(x).sum(1) + UNIT_ROUNDOFF["float32"] * finite_abs(ref)))


# --- flash decoding (the vector dataflow): batch 2, 8 query heads on 2 KV heads, 97 keys in 3
# splits, head_dim 64, bfloat16; Metal 4

DECODE = dict(batch=2, heads=8, kv_heads=2, seq=97, dim=64, splits=3)


def draw_decoding(rng: random.Random) -> dict:
    return dict(kv_view=rng.choice(("contiguous", "heads major")), q_nan=rng.random() < 0.3, k_special=rng.choice((None, None, math.inf, -math.inf)),
                v_nan=rng.random() < 0.2, sharp=rng.random() < 0.3)


def run_decoding(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    b, h, kvh, seq, dim = (DECODE[key] for key in ("batch", "heads", "kv_heads", "seq", "dim"))
    q = torch.randn(b, h, dim, generator=g) * (8 if cfg["sharp"] else 1)
    if cfg["kv_view"] == "heads major":  # (batch, seq, kv_heads, dim) views of (batch, kv_heads, seq, dim) storage
        k, v = (torch.randn(b, kvh, seq, dim, generator=g).transpose(1, 2) for _ in range(2))
    else:
        k, v = (torch.randn(b, seq, kvh, dim, generator=g) for _ in range(2))
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    if cfg["q_nan"]:
        q[rng.randrange(b), rng.randrange(h), rng.randrange(dim)] = math.nan
    if cfg["k_special"] is not None:
        k[rng.randrange(b), rng.randrange(seq), rng.randrange(kvh), rng.randrange(dim)] = cfg["k_special"]
    if cfg["v_nan"]:
        v[rng.randrange(b), rng.randrange(seq), rng.randrange(kvh), rng.randrange(dim)] = math.nan
    out = kernel(q, k, v)[-1]
    group = h // kvh
    kh, vh = (x.double().transpose(1, 2).repeat_interleave(group, 1) for x in (k, v))  # (b, h, seq, dim)
    scores = (q.double()[:, :, None] @ kh.transpose(-1, -2)) / math.sqrt(dim)
    ref = (torch.softmax(scores, dim=-1) @ vh)[:, :, 0]
    # scores: float32 dot products of 64 terms (|q||k| up to 8 * 16 each); exp2 and the sums of at
    # most 97 keys in float32; one bfloat16 rounding
    bound = 2 * ((dim * 8 * 16 + seq * 6) * ACC_EPS * 8 + UNIT_ROUNDOFF["bfloat16"] * finite_abs(ref))
    return mismatch(out, ref.to(torch.bfloat16).double(), bound)


# --- own barriers (adversarial_kernels.own_barriers) under tl.disable_thread_storage_sync: M, N
# symbolic, a runtime number of smoothing rounds; plain metal


def draw_barriers(rng: random.Random) -> dict:
    return dict(M=rng.choice(SIZES), N=rng.choice(SIZES + (200, 257)), rounds=rng.choice((-1, 0, 1, 2, 5)), specials=rng.choice((0, 0, 1)))


def run_barriers(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    M, N, rounds = cfg["M"], cfg["N"], cfg["rounds"]
    x = torch.randn(M, N, generator=g)
    place_specials(x, rng, cfg["specials"], (math.inf, -math.inf))
    y, z, q = torch.full((N, M), math.nan), torch.zeros(M), torch.full((M, N), math.nan)
    kernel(x, rounds, y, z, q)
    problem = mismatch(y, x.T, 0.0)
    if problem:
        return f"Y: {problem}"
    problem = mismatch(z, x.double().sum(1), 2 * N * ACC_EPS * finite_abs(x).sum(1))
    if problem:
        return f"Z: {problem}"
    tiles = -(-N // THREADS)
    a = torch.zeros(M, tiles * THREADS)
    a[:, :N] = x
    a = a.view(M, tiles, THREADS)
    for _ in range(rounds):  # the same float32 operations in the same order: bitwise equal
        left = torch.cat([a[..., :1], a[..., :-1]], -1)
        right = torch.cat([a[..., 1:], a[..., -1:]], -1)
        a = (left + right) * 0.5
    problem = mismatch(q, a.reshape(M, -1)[:, :N], 0.0)
    return f"Q: {problem}" if problem else None


# --- T.copy through threadgroup memory between views of any row pitch (adversarial_kernels.strided_copy):
# n symbolic, A at any element offset, O at a 16-byte boundary (a written tensor must be aligned);
# plain metal


def draw_strided_copy(rng: random.Random) -> dict:
    return dict(n=rng.choice((0,) + SIZES), a_pitch=40 + rng.randrange(0, 24), a_offset=rng.randrange(0, 9), o_pitch=40 + rng.randrange(0, 9),
                o_offset=4 * rng.randrange(0, 3))


def run_strided_copy(kernel: Any, cfg: dict, rng: random.Random, g: torch.Generator) -> str | None:
    n = cfg["n"]
    a_base = torch.randn(n * cfg["a_pitch"] + cfg["a_offset"], generator=g).half()
    a = a_base[cfg["a_offset"]:].view(n, cfg["a_pitch"])[:, :40]
    o_base = torch.full((n * cfg["o_pitch"] + cfg["o_offset"] + 8,), 7.0)
    o = o_base[cfg["o_offset"]:cfg["o_offset"] + n * cfg["o_pitch"]].view(n, cfg["o_pitch"])[:, :40]
    kernel(a, o)
    outside = torch.ones_like(o_base, dtype=torch.bool)
    outside[cfg["o_offset"]:cfg["o_offset"] + n * cfg["o_pitch"]].view(n, cfg["o_pitch"])[:, :40] = False
    if not (o_base[outside] == 7.0).all():
        return f"wrote outside the view of O at {torch.nonzero(outside & (o_base != 7.0))[:4].flatten().tolist()}"
    return mismatch(o, a.double() * 2, 0.0)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("gemv_small_m", lambda: _compile(E.gemv_small_m(3, T.dynamic("n"), T.dynamic("k"), dtype="float16", out_dtype="float32"), E.plain_metal_target(), [-1]),
               draw_gemv_m, run_gemv_m, 40),
        Family("gemv_small_n", lambda: _compile(E.gemv_small_n(T.dynamic("m"), 5, T.dynamic("k"), dtype="bfloat16"), E.metal4_target(), [-1], {"tirx.disable_vectorize": True}),
               draw_gemv_n, run_gemv_n, 40),
        Family("split_k", lambda: _compile(E.gemm_split_k(*SPLIT_K_SHAPE, 3, 32, 32, 16, dtype="float32"), E.metal4_target(), [-1]),
               draw_split_k, run_split_k, 20),
        Family("softmax", lambda: _compile(E.softmax(*SOFTMAX_SHAPE, dtype="float16"), E.metal4_target(), [-1]),
               draw_softmax, run_softmax, 25),
        Family("row_max", lambda: _compile(E.row_max(*REDUCE_SHAPE, dtype="bfloat16", out_dtype="float32"), E.plain_metal_target(), [-1]),
               draw_row_max, run_row_max, 25),
        Family("attention", lambda: _compile(E.flash_attention_program(1, ATTN["heads"], None, ATTN["dim"], causal=True, kv_heads=ATTN["kv_heads"], dtype="float32",
                                                                       block_m=32, block_n=32, threads=64, target=E.plain_metal_target()), E.plain_metal_target(), [3]),
               draw_attention, run_attention, 20),
        Family("user_module", lambda: _compile(user_module(), E.plain_metal_target(), None, {"tl.disable_safe_memory_legalize": True}),
               draw_user, run_user, 90),
        Family("matmul_staged", build_matmul, draw_matmul, run_matmul, 20),
        Family("row_sum", lambda: _compile(E.row_sum(*ROW_SUM_SHAPE, dtype="float16", out_dtype="float32"), E.metal4_target(), [-1]),
               draw_row_sum, run_row_sum, 20),
        Family("decoding", lambda: _compile(E.flash_decoding_program(*(DECODE[key] for key in ("batch", "heads", "kv_heads", "seq", "dim")), num_split=DECODE["splits"],
                                                                     dtype="bfloat16", target=E.metal4_target()), E.metal4_target(), [3, 4, 5]),
               draw_decoding, run_decoding, 20),
        Family("own_barriers", lambda: _compile(own_barriers(), E.plain_metal_target(), None, {"tl.disable_thread_storage_sync": True}),
               draw_barriers, run_barriers, 40),
        Family("strided_copy", lambda: _compile(strided_copy(), E.plain_metal_target()), draw_strided_copy, run_strided_copy, 30),
        Family("user_gemm_epilogue", lambda: _compile(gemm_epilogue(), E.metal4_target()),
               draw_user_gemm, run_user_gemm, 50),
    )
}


def configurations(name: str) -> list[dict]:
    rng = random.Random(f"{SEED}:{name}")
    family = FAMILIES[name]
    return [family.draw(rng) for _ in range(round(family.count * SCALE))]


def check(name: str, cfg: dict, index: int = 0) -> str | None:
    """Runs one configuration; None or what went wrong. Replays alone: check(name, cfg, index)."""
    rng = random.Random(f"{SEED}:{name}:{index}")
    g = torch.Generator().manual_seed(SEED * 1000 + index)
    try:
        return FAMILIES[name].run(compiled(name), cfg, rng, g)
    except EmulatorError as err:
        return f"emulator: {str(err).splitlines()[0]}"


def test_at_least_300_configurations():
    assert sum(family.count for family in FAMILIES.values()) >= 300


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_adversarial_configurations_match_torch(name: str):
    family = FAMILIES[name]
    failures = []
    for index, cfg in enumerate(configurations(name)):
        reason = family.excluded(cfg)
        if reason:
            continue
        problem = check(name, cfg, index)
        if problem:
            failures.append(f"  #{index} {cfg}: {problem}")
    assert not failures, f"seed {SEED}, family {name}: {len(failures)} of {round(family.count * SCALE)} configurations wrong:\n" + "\n".join(failures[:12])
