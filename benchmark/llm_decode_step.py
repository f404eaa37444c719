"""One Llama-style decoder layer for one token, built from the plugin's shipped kernels, against a
float32 torch reference (--dry-run, in the emulator) or timed against the same layer in MLX (on a Mac).

    python benchmark/llm_decode_step.py              # on a Mac: Llama-3-8B dims, context 4096, plugin (MPS) vs MLX
    python benchmark/llm_decode_step.py --dry-run    # anywhere: a reduced layer in the emulator, error and bytes per token

The layer (float16 activations, 4-bit weights in MLX's affine format, group 64):

    h   = x + o_proj(attention(rope(q), cache(rope(k)), cache(v)))   with q, k, v = qkv_proj(rms_norm(x))
    out = h + down_proj(silu(gate) * up)                             with gate, up = gate_up_proj(rms_norm(h))

Launches: rms_norm; one quantized_matmul for q, k and v (their weights concatenated: x is read once);
one rope over q and k together (they are neighbours in the qkv output and share the position);
the new k and v are written into the KV cache by torch-side indexing (no kernel); flash decoding
(split-KV and combine, GQA); quantized_matmul o; a residual add; rms_norm; one quantized_matmul for
gate and up (concatenated); a small TileLang kernel for silu(gate) * up (one pass instead of two);
quantized_matmul down; a residual add.

Exit status: 0 when the layer matched the reference (or was timed), 1 on a mismatch, 2 for a usage
error or a timed run off a Mac.
"""

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

BITS, GROUP_SIZE = 4, 64
DTYPE = "float16"
EPS = 1e-5
ROPE_BASE = 500000.0  # Llama 3's
TOLERANCE = 1e-2  # max |out - ref| / max |ref| of the layer output: the plugin is at 5e-4 in the dry run, MLX on its CPU at 3e-3
ELEMENTWISE_THREADS = 128
NEEDS_A_MAC = "llm_decode_step: the timed run needs a Mac (MPS and MLX on the GPU); use --dry-run here"


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    context: int  # keys attended to, the new token's included: its position is context - 1

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


FULL = Dims(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, context=4096)  # Llama-3-8B
DRY = Dims(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, context=37)


# ---------------------------------------------------------------- weights and reference


class Layer:
    """Random float16 weights quantized with kernels.quantize, their dequantized float32 copies (what
    the reference multiplies by), the norms' weights and a KV cache whose first context - 1 rows hold
    random past keys and values."""

    def __init__(self, d: Dims, device: str, seed: int = 0) -> None:
        import torch

        from tilelang_metal import kernels

        self.dims, self.position = d, d.context - 1
        gen = torch.Generator().manual_seed(seed)

        def linear(n: int, k: int) -> tuple[Any, ...]:
            w = (torch.randn(n, k, generator=gen) / math.sqrt(k)).to(torch.float16)
            w_q, scales, biases = kernels.quantize(w, bits=BITS, group_size=GROUP_SIZE)
            return (w_q.to(device), scales.to(device), biases.to(device)), kernels.dequantize(
                w_q, scales, biases, bits=BITS, group_size=GROUP_SIZE).float()

        self.qkv, self.qkv_ref = linear(d.q_width + 2 * d.kv_width, d.hidden)
        self.o, self.o_ref = linear(d.hidden, d.q_width)
        self.gate_up, self.gate_up_ref = linear(2 * d.intermediate, d.hidden)
        self.down, self.down_ref = linear(d.hidden, d.intermediate)
        self.attn_norm, self.mlp_norm = ((1 + 0.1 * torch.randn(d.hidden, generator=gen)).to(torch.float16).to(device) for _ in range(2))
        self.x = torch.randn(1, d.hidden, generator=gen).to(torch.float16).to(device)
        self.k_cache, self.v_cache = (torch.randn(1, d.context, d.kv_heads, d.head_dim, generator=gen).to(torch.float16).to(device)
                                      for _ in range(2))
        self.k_cache[:, self.position:] = 0  # the new token's row: written by the step
        self.v_cache[:, self.position:] = 0

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for proj in (self.qkv, self.o, self.gate_up, self.down) for t in proj)

    def cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()


def rope_reference(x: Any, position: int) -> Any:
    """mx.fast.rope(traditional=False) in float32 on x (..., head_dim): pairs (i, i + head_dim / 2)."""
    import torch

    half = x.shape[-1] // 2
    freqs = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = (position * freqs).float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)


def reference_step(layer: Layer) -> Any:
    """The layer in float32 on the CPU from the same (float16) inputs and the dequantized weights."""
    import torch
    import torch.nn.functional as F

    d, pos = layer.dims, layer.position
    x = layer.x.float().cpu()

    def rms(v: Any, w: Any) -> Any:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS) * w.float().cpu()

    qkv = rms(x, layer.attn_norm) @ layer.qkv_ref.T
    q = rope_reference(qkv[:, :d.q_width].reshape(d.heads, d.head_dim), pos)
    k = rope_reference(qkv[:, d.q_width:d.q_width + d.kv_width].reshape(d.kv_heads, d.head_dim), pos)
    v = qkv[:, d.q_width + d.kv_width:].reshape(d.kv_heads, d.head_dim)
    keys, values = layer.k_cache[0].float().cpu().clone(), layer.v_cache[0].float().cpu().clone()
    keys[pos], values[pos] = k, v
    group = d.heads // d.kv_heads
    kk, vv = (t.transpose(0, 1).repeat_interleave(group, 0) for t in (keys, values))  # (heads, context, dim)
    attn = F.scaled_dot_product_attention(q[:, None], kk, vv)[:, 0].reshape(1, d.q_width)
    h = x + attn @ layer.o_ref.T
    gate, up = (rms(h, layer.mlp_norm) @ layer.gate_up_ref.T).split(d.intermediate, dim=-1)
    return h + (F.silu(gate) * up) @ layer.down_ref.T


# ---------------------------------------------------------------- the plugin's layer


def elementwise_programs(hidden: int, intermediate: int) -> tuple[Any, Any]:
    """(residual add of two (1, hidden) rows, silu(gate) * up of a (1, 2 * intermediate) gate|up row):
    one element per thread, float32 arithmetic, one rounding at the store."""
    import tilelang.language as T

    acc = "float32"

    @T.prim_func
    def residual_add(A: T.Tensor((1, hidden), DTYPE), B: T.Tensor((1, hidden), DTYPE), Out: T.Tensor((1, hidden), DTYPE)):
        with T.Kernel(T.ceildiv(hidden, ELEMENTWISE_THREADS), threads=ELEMENTWISE_THREADS) as bx:
            for i in T.Parallel(ELEMENTWISE_THREADS):
                j = bx * ELEMENTWISE_THREADS + i
                if j < hidden:
                    Out[0, j] = T.cast(T.cast(A[0, j], acc) + T.cast(B[0, j], acc), DTYPE)

    @T.prim_func
    def silu_mul(GateUp: T.Tensor((1, 2 * intermediate), DTYPE), Out: T.Tensor((1, intermediate), DTYPE)):
        with T.Kernel(T.ceildiv(intermediate, ELEMENTWISE_THREADS), threads=ELEMENTWISE_THREADS) as bx:
            for i in T.Parallel(ELEMENTWISE_THREADS):
                j = bx * ELEMENTWISE_THREADS + i
                if j < intermediate:
                    gate = T.cast(GateUp[0, j], acc)
                    Out[0, j] = T.cast(gate / (T.float32(1) + T.exp(-gate)) * T.cast(GateUp[0, intermediate + j], acc), DTYPE)

    return residual_add, silu_mul


class PluginLayer:
    """The layer's kernels, compiled once for `dims`; `step(layer, launch)` runs one token through
    them, each launch as `launch(kernel, *args)` (the call, or the call plus its counters)."""

    def __init__(self, d: Dims, target: Any, execution_backend: str) -> None:
        import tilelang

        from tilelang_metal import kernels

        def compile(program: Any, out_idx: Any = (-1,)) -> Any:
            return tilelang.compile(program, out_idx=list(out_idx), target=target, execution_backend=execution_backend)

        def qmv(n: int, k: int) -> Any:
            return compile(kernels.quantized_matmul_program(1, n, k, bits=BITS, group_size=GROUP_SIZE, dtype=DTYPE))

        self.dims = d
        self.norm = compile(kernels.norm_program("rms_norm", 1, d.hidden, dtype=DTYPE, eps=EPS))
        self.qkv = qmv(d.q_width + 2 * d.kv_width, d.hidden)
        self.rope = compile(kernels.rope_program(1, 1, d.heads + d.kv_heads, d.head_dim, base=ROPE_BASE, offset=None, dtype=DTYPE))
        self.attention = compile(kernels.flash_decoding_program(1, d.heads, d.kv_heads, d.context, d.head_dim, dtype=DTYPE,
                                                                target=target), out_idx=(3, 4, 5))
        self.o = qmv(d.hidden, d.q_width)
        self.gate_up = qmv(2 * d.intermediate, d.hidden)
        self.down = qmv(d.hidden, d.intermediate)
        residual_add, silu_mul = elementwise_programs(d.hidden, d.intermediate)
        self.add, self.silu_mul = compile(residual_add), compile(silu_mul)
        self.names = {id(kernel): name for name, kernel in vars(self).items() if name != "dims"}  # for the per-launch lines

    def step(self, layer: Layer, launch: Callable[..., Any]) -> Any:
        d, pos = self.dims, layer.position
        qkv = launch(self.qkv, launch(self.norm, layer.x, layer.attn_norm), *layer.qkv)
        rotary = d.q_width + d.kv_width  # q and k: neighbours in qkv, rotated at one position in one launch
        q_k = launch(self.rope, qkv[:, :rotary].view(1, 1, d.heads + d.kv_heads, d.head_dim), pos)
        layer.k_cache[0, pos] = q_k[0, 0, d.heads:]  # the cache append: torch-side indexing
        layer.v_cache[0, pos] = qkv[0, rotary:].view(d.kv_heads, d.head_dim)
        attn = launch(self.attention, q_k[:, 0, :d.heads], layer.k_cache, layer.v_cache)[-1]
        h = launch(self.add, layer.x, launch(self.o, attn.reshape(1, d.q_width), *layer.o))
        gate_up = launch(self.gate_up, launch(self.norm, h, layer.mlp_norm), *layer.gate_up)
        return launch(self.add, h, launch(self.down, launch(self.silu_mul, gate_up), *layer.down))


def _call(kernel: Any, *args: Any) -> Any:
    return kernel(*args)


def _bytes_of(args: tuple) -> int:
    return sum(a.numel() * a.element_size() for a in args if hasattr(a, "numel"))


def dry_run(plugin: PluginLayer | None = None) -> int:
    """The DRY layer in the emulator against `reference_step`: prints the error and the device bytes
    per token (emulator counters summed over the launches, and per launch); 1 on a mismatch.
    `plugin`: DRY's compiled kernels, when the caller has them already."""
    import tilelang_metal  # noqa: F401
    from tilelang_metal.emulator import counters

    d = DRY
    print(harness.DRY_RUN_NOTE)
    print(f"layer: hidden {d.hidden}, heads {d.heads}, kv_heads {d.kv_heads}, head_dim {d.head_dim}, "
          f"intermediate {d.intermediate}, context {d.context}; {BITS}-bit weights, group {GROUP_SIZE}, {DTYPE}", flush=True)
    plugin = plugin or PluginLayer(d, "metal", "emulator")
    layer = Layer(d, "cpu")
    expected = reference_step(layer)
    per_launch: list[tuple[str, int, int, int]] = []  # (kernel, device_load_bytes, unique_device_load_bytes, argument bytes)

    def counted(kernel: Any, *args: Any) -> Any:
        total = counters(kernel, *args).total
        name = plugin.names[id(kernel)]
        per_launch.append((name, total["device_load_bytes"], total["unique_device_load_bytes"], _bytes_of(args)))
        return kernel(*args)

    out = plugin.step(layer, counted)
    error = harness.relative_error(out, expected)
    loads, unique = (sum(row[i] for row in per_launch) for i in (1, 2))
    floor = layer.weight_bytes() + layer.cache_bytes()
    print(f"max error |out - ref| / max |ref| = {error:.3g} (tolerance {TOLERANCE})")
    print("per launch: kernel, device_load_bytes, unique_device_load_bytes, bytes of its input arguments")
    for name, launch_loads, launch_unique, arguments in per_launch:
        print(f"  {name:10s} {launch_loads:9d} {launch_unique:9d} {arguments:9d}")
    print(f"device bytes per token ({len(per_launch)} launches): device_load_bytes {loads} ({loads / floor:.2f}x the floor), "
          f"unique_device_load_bytes {unique} ({unique / floor:.2f}x); floor {floor} = weights {layer.weight_bytes()} "
          f"(packed + scales + biases) + KV cache read {layer.cache_bytes()}")
    if not error <= TOLERANCE:
        print(f"llm_decode_step: the plugin's layer does not match the float32 reference: error {error:.3g} > {TOLERANCE}",
              file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- the timed run (a Mac)


def mlx_step(layer: Layer, mx: Any) -> Callable[[], Any]:
    """The same layer in MLX (mx.fast.rms_norm, mx.quantized_matmul, mx.fast.rope,
    mx.fast.scaled_dot_product_attention) on the same weights; its cache is (1, kv_heads, context, dim)."""
    import numpy as np

    d, pos = layer.dims, layer.position

    def arr(t: Any) -> Any:
        return mx.array(t.cpu().numpy())

    qkv, o, gate_up, down = ([arr(t) for t in proj] for proj in (layer.qkv, layer.o, layer.gate_up, layer.down))
    attn_norm, mlp_norm, x = arr(layer.attn_norm), arr(layer.mlp_norm), arr(layer.x)
    caches = [mx.array(np.ascontiguousarray(t.cpu().numpy().transpose(0, 2, 1, 3))) for t in (layer.k_cache, layer.v_cache)]
    scale = 1.0 / math.sqrt(d.head_dim)

    def matmul(v: Any, proj: list[Any]) -> Any:
        return mx.quantized_matmul(v, *proj, transpose=True, group_size=GROUP_SIZE, bits=BITS)

    def step() -> Any:
        y = matmul(mx.fast.rms_norm(x, attn_norm, EPS), qkv)
        q = y[:, :d.q_width].reshape(1, d.heads, 1, d.head_dim)
        k = y[:, d.q_width:d.q_width + d.kv_width].reshape(1, d.kv_heads, 1, d.head_dim)
        v = y[:, d.q_width + d.kv_width:].reshape(1, d.kv_heads, 1, d.head_dim)
        q, k = (mx.fast.rope(t, d.head_dim, traditional=False, base=ROPE_BASE, scale=1.0, offset=pos) for t in (q, k))
        caches[0][:, :, pos:pos + 1] = k
        caches[1][:, :, pos:pos + 1] = v
        attn = mx.fast.scaled_dot_product_attention(q, caches[0], caches[1], scale=scale).reshape(1, d.q_width)
        h = x + matmul(attn, o)
        gate, up = mx.split(matmul(mx.fast.rms_norm(h, mlp_norm, EPS), gate_up), 2, axis=-1)
        return h + matmul(gate * mx.sigmoid(gate) * up, down)

    return step


def timed_run(args: argparse.Namespace) -> int:
    import statistics

    import torch

    import tilelang_metal  # noqa: F401

    mx = harness.mlx_core()
    if mx is None:
        print("llm_decode_step: MLX with a GPU is needed for the comparison (pip install mlx)", file=sys.stderr)
        return 2
    d = FULL
    plugin = PluginLayer(d, "metal", "torch")
    layer = Layer(d, "mps")
    expected = reference_step(layer)
    error = harness.relative_error(plugin.step(layer, _call), expected)
    mlx_layer = mlx_step(layer, mx)
    import numpy as np

    mlx_error = harness.relative_error(torch.from_numpy(np.array(mlx_layer().astype(mx.float32))), expected)
    print(f"max error vs float32 reference: plugin {error:.3g}, mlx {mlx_error:.3g} (tolerance {TOLERANCE})")
    runners = [harness.Runner("plugin", lambda: plugin.step(layer, _call), harness.torch_mps_sync),
               harness.mlx_runner("mlx", mx, mlx_layer)]
    launches = harness.calibrate_launches(runners, args.target_ms / 1e3, 1, args.max_launches)
    times = harness.time_interleaved(runners, trials=args.trials, launches=launches)
    median = {name: statistics.median(values) for name, values in times.items()}
    floor = layer.weight_bytes() + layer.cache_bytes()
    for name, seconds in median.items():
        print(f"{name}: {seconds * 1e3:.3f} ms per token ({floor / seconds / 1e9:.0f} GB/s of the {floor / 1e6:.0f} MB floor)")
    print(f"plugin / mlx time per token = {median['plugin'] / median['mlx']:.2f}x (one run, {args.trials} ABBA trials)")
    return 0 if error <= TOLERANCE else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="the reduced layer in the CPU emulator against the float32 reference")
    ap.add_argument("--trials", type=int, default=7, help=f"timed trials, >= {harness.MIN_TRIALS} (default: %(default)s)")
    ap.add_argument("--target-ms", type=float, default=200.0, help="length of one measurement, ms (default: %(default)s)")
    ap.add_argument("--max-launches", type=int, default=200, help="cap on tokens per measurement (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if sys.platform != "darwin" or not harness.mps_available():
        print(NEEDS_A_MAC, file=sys.stderr)
        return 2
    if args.trials < harness.MIN_TRIALS:
        ap.error(f"--trials {args.trials}: need at least {harness.MIN_TRIALS} for a median")
    return timed_run(args)


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.1f} s)")
    raise SystemExit(code)
