"""Helpers shared by the GEMM tests: lowering, emulator execution and the torch reference."""

from __future__ import annotations

import re
import zlib

import tilelang
import torch
from tilelang import tvm

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def lower_source(func, target) -> str:
    with tvm.transform.PassContext(), target:
        return tilelang.lower(func, target=target).kernel_source


def compile_emulated(func, target):
    return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")


def operands(M, N, K, dtype, trans_A=False, trans_B=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = TORCH_DTYPES[dtype]
    a = torch.randn((K, M) if trans_A else (M, K), generator=g).to(dt)
    b = torch.randn((N, K) if trans_B else (K, N), generator=g).to(dt)
    ref = (a.float().T if trans_A else a.float()) @ (b.float().T if trans_B else b.float())
    return a, b, ref


def tolerance(in_dtype: str, out_dtype: str, K: int) -> float:
    """Absolute tolerance for |C - ref| with unit-normal inputs (ref entries ~ sqrt(K))."""
    scale = max(1.0, K**0.5)
    if out_dtype == "bfloat16" or in_dtype == "bfloat16":
        return 0.03 * scale
    if out_dtype == "float16" or in_dtype == "float16":
        return 0.01 * scale
    return 1e-4 * scale


def assert_close(out, ref, in_dtype, out_dtype, K, what=""):
    assert out.shape == ref.shape
    err = (out.float() - ref).abs()
    assert not torch.isnan(out.float()).any(), f"{what}: NaN in output (unwritten elements?)"
    limit = tolerance(in_dtype, out_dtype, K)
    assert err.max().item() <= limit, f"{what}: max error {err.max().item():.4g} > {limit:.4g} at {divmod(int(err.argmax()), ref.shape[1])}"


# ---------------------------------------------------------------- property tests


def stable_seed(config: object) -> int:
    """A seed from a configuration's repr: the same in every process (hash() of a str is not)."""
    return zlib.crc32(repr(config).encode()) & 0xFFFF


def log_uniform(rng, lo: int, hi: int) -> int:
    """An integer in [lo, hi], uniform in log scale (as many small shapes as large ones)."""
    import math

    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def refusal_verdict(err: Exception) -> tuple[str, str]:
    """('refused', text) for a short lower-time error of the plugin's, else ('wrong', text)."""
    from tilelang_metal.errors import MetalLoweringError

    text = str(err).strip().splitlines()[-1]
    ours = isinstance(err, MetalLoweringError) or any(key in text for key in ("Metal", "T.gemm", "threads=", "threadgroup memory", "swizzle"))
    return ("refused" if ours and len(text) < 400 else "wrong"), text


# ---------------------------------------------------------------- MSL structure


def _block_end(source: str, start: int) -> int:
    """Index just past the `}` that closes the first `{` at or after `start`."""
    depth = 0
    for i in range(source.index("{", start), len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError("unbalanced braces")


def k_loops(source: str) -> list[str]:
    """The outermost `for` loops of the MSL that run matrix operations (the GEMM's K loops)."""
    loops = []
    for match in re.finditer(r"\bfor \(", source):
        if loops and match.start() < loops[-1][1]:
            continue  # inside a K loop already taken
        end = _block_end(source, match.start())
        text = source[match.start():end]
        if ".run(" in text or "simdgroup_multiply_accumulate(" in text:
            loops.append((match.start(), end))
    return [source[a:b] for a, b in loops]


def scalar_device_loads(source: str, text: str) -> list[str]:
    """The element-wide (scalar) device reads in `text`, a part of the kernel `source`: indexing a
    device pointer, or dereferencing a scalar device pointer cast. Vector reads (`*(const device
    half4*)`) and `simdgroup_load` are not scalar."""
    pointers = set(re.findall(r"device\s+\w+\s*\*\s*(?:__restrict\s+)?(\w+)", source))
    found = re.findall(r"\*\(const device (?:half|bfloat|float|short|ushort|char|uchar|int|uint)\*\)", text)
    for name in pointers:
        found += re.findall(rf"\b{re.escape(name)}\[[^\]]*\]", text)
    return found
