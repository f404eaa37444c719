"""Property test, wider: random configurations of the GEMM idioms beyond one plain GEMM (two
outputs from one epilogue, two GEMMs into one accumulator, annotated shared layouts, views of wider
tensors, accumulation into an initialised C). Each one matches torch in the emulator or is refused
at lower time with a short message of the plugin's; never a silent mismatch, never a crash.

Seeded: TILELANG_METAL_PROPERTY_SEED (default 2026), TILELANG_METAL_PROPERTY_IDIOMS_N (default 40).
The configurations are drawn once and checked in SHARDS tests (every SHARDS-th one each), so
pytest-xdist spreads them over the CPUs; each shard holds the property's bounds for its share.
"""

import os
import random
import re
from dataclasses import asdict, dataclass

import pytest
import tilelang
import torch
from gemm_support import log_uniform, refusal_verdict, stable_seed, tolerance
from property_kernels import (
    accumulate_into_initialised_c,
    annotated_shared,
    strided_views,
    two_gemms_one_accumulator,
    two_outputs,
)

from tilelang_metal import kernels as E
from tilelang_metal.emulator import EmulatorError

SEED = int(os.environ.get("TILELANG_METAL_PROPERTY_SEED", "2026"))
COUNT = int(os.environ.get("TILELANG_METAL_PROPERTY_IDIOMS_N", "40"))
SHARDS = 4
IDIOMS = ("two_outputs", "two_gemms", "annotated", "strided_views", "initialised_c")


@dataclass(frozen=True)
class Config:
    idiom: str
    M: int
    N: int
    K: int
    K2: int
    block_M: int
    block_N: int
    block_K: int
    threads: int
    dtype: str
    out_dtype: str
    metal4: bool
    a_col: int
    c_pad: int


def draw(rng: random.Random) -> Config:
    block_M = rng.choice([16, 32, 64])
    block_N = rng.choice([32, 64])
    dtype = rng.choice(["float16", "bfloat16", "float32"])
    return Config(
        idiom=rng.choice(IDIOMS),
        M=log_uniform(rng, 1, 200),
        N=log_uniform(rng, 1, 200),
        K=log_uniform(rng, 1, 200),
        K2=rng.choice([8, 16, 24, 64]),
        block_M=block_M,
        block_N=block_N,
        block_K=rng.choice([16, 32]),
        threads=rng.choice([t for t in (32, 64, 128) if t // 32 <= (block_M // 8) * (block_N // 8)]),
        dtype=dtype,
        out_dtype=rng.choice([dtype, "float32"]),
        metal4=rng.random() < 0.6,
        a_col=rng.choice([0, 1, 2, 4]),
        c_pad=rng.choice([0, 1, 3]),
    )


def build(c: Config):
    if c.idiom == "two_outputs":
        return two_outputs(c.M, c.N, c.K, c.block_M, c.block_N, c.block_K, c.threads, c.dtype, c.out_dtype), c.K
    if c.idiom == "two_gemms":
        return two_gemms_one_accumulator(c.M, c.N, c.K, c.K2, c.block_M, c.block_N, c.threads, c.dtype, c.out_dtype), c.K + c.K2
    if c.idiom == "annotated":
        return annotated_shared(c.M, c.N, c.K, c.block_M, c.block_N, c.block_K, c.threads, c.dtype, c.out_dtype), c.K
    if c.idiom == "strided_views":
        n = -(-c.N // c.block_N) * c.block_N
        return strided_views(c.M, n, c.K, c.block_M, c.block_N, c.threads, c.dtype, c.out_dtype, c.a_col, c.c_pad), c.K
    return accumulate_into_initialised_c(c.M, c.N, c.K, c.block_M, c.block_N, c.threads, c.dtype, c.out_dtype), c.K


def check(c: Config) -> tuple[str, str]:
    (func, make_inputs, reference, outputs), k_total = build(c)
    target = E.metal4_target() if c.metal4 else E.plain_metal_target()
    try:
        kernel = tilelang.compile(func, target=target, execution_backend="emulator")
    except Exception as err:
        return refusal_verdict(err)
    g = torch.Generator().manual_seed(stable_seed(c))
    inputs = make_inputs(g)
    expected = reference([x.clone() for x in inputs])  # before the launch: outputs may start with values
    try:
        kernel(*inputs)
    except EmulatorError as err:
        return "wrong", f"emulator: {err}"
    limit = tolerance(c.dtype, c.out_dtype, k_total)
    for index, ref in zip(outputs, expected):
        out = inputs[index].float()
        if c.out_dtype != "float32":
            ref = ref.to(inputs[index].dtype).float()
        err = (out - ref).abs()
        if torch.isnan(out).any() or err.max().item() > limit * (2 if c.idiom == "initialised_c" else 1):
            return "wrong", f"output {index}: max error {err.nan_to_num(float('inf')).max().item():.4g} > {limit:.4g}"
    return "ok", ""


def drawn_configs() -> list[Config]:
    rng = random.Random(SEED)
    return [draw(rng) for _ in range(COUNT)]


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_random_gemm_idioms_match_or_are_refused(shard: int):
    configs = drawn_configs()[shard::SHARDS]
    counts = {"ok": 0, "refused": 0, "wrong": 0}
    per_idiom = {idiom: {"ok": 0, "refused": 0, "wrong": 0} for idiom in IDIOMS}
    refusals: dict[str, int] = {}
    wrong = []
    for cfg in configs:
        verdict, detail = check(cfg)
        counts[verdict] += 1
        per_idiom[cfg.idiom][verdict] += 1
        if verdict == "refused":
            key = re.sub(r"\d+", "N", detail)[:110]
            refusals[key] = refusals.get(key, 0) + 1
        elif verdict == "wrong":
            wrong.append((asdict(cfg), detail))
    print(f"\nidiom property test (seed {SEED}, shard {shard} of {SHARDS}: {len(configs)} of {COUNT} configs): ok={counts['ok']} refused={counts['refused']} wrong={counts['wrong']}")
    for idiom, n in per_idiom.items():
        print(f"  {idiom}: {n}")
    for reason, n in sorted(refusals.items(), key=lambda kv: -kv[1]):
        print(f"  refused x{n}: {reason}")
    assert not wrong, "silent mismatches or unclear failures:\n" + "\n".join(f"{c}\n  -> {d}" for c, d in wrong[:10])
    assert counts["ok"] >= 0.7 * len(configs), f"too few configurations ran: {counts}"
