"""What compare_mlx.py and its MLX side share: the problems, a measurement, the error check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = {"float16": 2e-2, "bfloat16": 3e-2, "float32": 1e-4}
# chip class -> (the plugin's target, the chip its dispatch is given). "steel" is a base M3; the steel-*
# classes are the other M3 chips, one per size class of MLX's steel GEMM tile rule (base and Pro
# "small", Max "medium", Ultra "large": kernels.matmul.steel_size_class, compare_mlx_side.STEEL_DEVICE)
CLASSES = {"nax": ("metal4", "M5"), "steel": ("metal", "M3"), "steel-pro": ("metal", "M3 Pro"),
           "steel-max": ("metal", "M3 Max"), "steel-ultra": ("metal", "M3 Ultra")}
STEEL_CLASSES = ("steel", "steel-pro", "steel-max", "steel-ultra")


@dataclass(frozen=True)
class Problem:
    name: str
    kind: str  # gemm | attention | decode | softmax | row_sum | qmv | qmm
    classes: tuple[str, ...]
    dims: dict[str, Any] = field(hash=False)

    @property
    def dtype(self) -> str:
        return str(self.dims.get("dtype", "float16"))

    def flops(self) -> float:
        d = self.dims
        if self.kind in ("gemm", "qmv", "qmm"):  # a quantized product: the same multiply-adds as its dense one
            return 2.0 * d["M"] * d["N"] * d["K"] * (d.get("batch") or 1)  # a bias's M * N adds not counted
        if self.kind == "attention":
            full = 4.0 * d["heads"] * d["seq"] * d["seq"] * d["head_dim"]
            return full / 2 if d["causal"] else full
        if self.kind == "decode":
            return 4.0 * d["heads"] * d["kv_len"] * d["head_dim"]
        if self.kind == "softmax":
            return 5.0 * d["rows"] * d["cols"]  # max, subtract, exp, sum, divide
        return 1.0 * d["rows"] * d["cols"]


def _gemm(name: str, M: int, N: int, K: int, layout: str = "nn", dtype: str = "float16", batch: int = 0,
          epilogue: str = "none", classes: tuple[str, ...] = ("nax", "steel")) -> Problem:
    """A GEMM problem; `batch`: that many products, A (batch, M, K), B (batch, K, N); `epilogue`
    "bias": a bias (N,) added (kernels.matmul's epilogue, MLX's addmm)."""
    return Problem(name, "gemm", classes, {"M": M, "N": N, "K": K, "layout": layout, "dtype": dtype, "batch": batch,
                                                     "epilogue": epilogue})


def quantized_problem(kind: str, M: int, N: int, K: int, bits: int, group_size: int = 64) -> Problem:
    """x (M x K) @ dequant(w)^T with w N x K in MLX's affine format (transposed, as nn.Linear stores it)."""
    return Problem(f"{kind}-b{bits}-gs{group_size}-{M}x{N}x{K}", kind, ("steel",),
                   {"M": M, "N": N, "K": K, "bits": bits, "group_size": group_size, "dtype": "float16"})


PROBLEMS: tuple[Problem, ...] = (
    *(_gemm(f"gemm-{lay}-{'bf16' if dt == 'bfloat16' else 'fp16'}-4096", 4096, 4096, 4096, lay, dt)
      for lay in ("nn", "nt", "tn") for dt in ("float16", "bfloat16")),
    # fp32 on plain metal (MLX's steel GEMM takes float32; its NAX kernels 16-bit only)
    _gemm("gemm-nn-fp32-4096", 4096, 4096, 4096, dtype="float32", classes=("steel",)),
    _gemm("gemm-nn-fp16-ragged-4000", 4000, 4000, 4000),
    _gemm("gemm-nn-fp16-odd-pitch-4095x4097x4096", 4095, 4097, 4096),
    *(_gemm(f"gemm-nn-fp16-skinny-m{m}", m, 4096, 4096) for m in (1, 2, 4, 16, 32, 64)),
    *(Problem(f"attention-d{d}{'-causal' if c else ''}-4k", "attention", ("nax", "steel"),
              {"heads": 32, "seq": 4096, "head_dim": d, "causal": c, "dtype": "float16"}) for d in (64, 128) for c in (False, True)),
    # issue 35 item 5: a (seq, seq) mask shared by the heads, bool (True keeps) or additive in q's dtype
    # (MLX's steel attention with has_mask; its NAX launch here takes no mask, so steel only)
    *(Problem(f"attention-d64-mask-{m}-4k", "attention", ("steel",),
              {"heads": 32, "seq": 4096, "head_dim": 64, "causal": False, "mask": m, "dtype": "float16"}) for m in ("bool", "additive")),
    Problem("decode-d128-4k", "decode", ("steel",), {"heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128, "dtype": "float16"}),
    Problem("softmax-4096", "softmax", ("steel",), {"rows": 4096, "cols": 4096, "dtype": "float32"}),
    Problem("row-sum-4096", "row_sum", ("steel",), {"rows": 4096, "cols": 4096, "dtype": "float32"}),
    # decoding's matrix-vector products (MLX: qmv_fast at these shapes) and a prefill's (MLX: affine_qmm_t)
    *(quantized_problem("qmv", 1, n, 4096, bits) for bits in (4, 8) for n in (4096, 14336)),
    quantized_problem("qmm", 512, 4096, 4096, 4),
    # issue 35 item 5: a batch of products (MLX: its GEMM with the batch on the grid's z axis) and a
    # bias (MLX's addmm: the same GEMM reading the bias as its output source)
    _gemm("gemm-nn-fp16-batch8-1024", 1024, 1024, 1024, batch=8),
    _gemm("gemm-nn-fp16-bias-4096", 4096, 4096, 4096, epilogue="bias"),
    # issue 35 item 5: MLX's steel tile per size class; the smallest fp16 NN problem where all three
    # differ (2^20 outputs and K >= 2 max(M, N): base / Pro 64x64 on 1x2 simdgroups, Max 64x64 on 2x2,
    # Ultra 32x64 on 1x2)
    _gemm("gemm-nn-fp16-1024x1024x2048", 1024, 1024, 2048, classes=STEEL_CLASSES),
)
PROXY_BATCH = 2  # products a batched proxy launches; its counts scale by batch / PROXY_BATCH (each z does the same work)


@dataclass
class Measured:
    """One implementation on one problem: what ran, whether it matched torch, counts at full size."""

    config: str
    max_rel_err: float
    counts: dict[str, float]
    # (registers per thread, threadgroups per core) of its heaviest kernel: estimates (docs/performance.md,
    # "Registers and occupancy"); the plugin's from the kernels' records, MLX's from benchmark/mlx_registers.py
    occupancy: tuple[int, int] | None = None

    def verified(self, dtype: str) -> bool:
        return math.isfinite(self.max_rel_err) and self.max_rel_err <= TOLERANCE[dtype]


class ErrorTracker:
    """The largest relative error over every proxy an implementation ran for one problem."""

    def __init__(self) -> None:
        self.worst = 0.0

    def check(self, out: Any, ref: Any) -> None:
        o, r = out.float().cpu(), ref.float().cpu()
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} != reference {tuple(r.shape)}")
        scale = r.abs().max().item() or 1.0
        err = (o - r).abs().max().item()
        self.worst = max(self.worst, float("inf") if math.isnan(err) else err / scale)


def torch_dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def gemm_operands(M: int, N: int, K: int, layout: str, dtype: str, seed: int = 0) -> tuple[Any, Any, Any]:
    """A and B in storage order for `layout` ("nn", "nt": B stored N x K, "tn": A stored K x M), and
    the fp32 reference of A @ B."""
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g) / math.sqrt(K)
    b = torch.randn(K, N, generator=g)
    ref = a @ b
    dt = torch_dtype(dtype)
    a_s = a.t().contiguous() if layout == "tn" else a
    b_s = b.t().contiguous() if layout == "nt" else b
    return a_s.to(dt), b_s.to(dt), ref


def gemm_case(M: int, N: int, K: int, layout: str, dtype: str, batch: int = 0, bias: bool = False,
              seed: int = 0) -> tuple[tuple[Any, ...], Any]:
    """The operands of one GEMM problem's proxy as `gemm_operands` stores them, stacked over `batch`
    products (A (batch, M, K), B (batch, K, N)) when batch, then a bias (N,) when asked; and the fp32
    reference (the bias added)."""
    import torch

    if batch:
        cases = [gemm_operands(M, N, K, layout, dtype, seed + i) for i in range(batch)]
        a, b, ref = (torch.stack([c[i] for c in cases]) for i in range(3))
    else:
        a, b, ref = gemm_operands(M, N, K, layout, dtype, seed)
    if not bias:
        return (a, b), ref
    vector = torch.randn(N, generator=torch.Generator().manual_seed(seed + 7919)).to(torch_dtype(dtype))
    return (a, b, vector), ref + vector.float()


def attention_mask(kind: str, seq: int, dtype: str, seed: int = 0) -> Any:
    """A (seq, seq) mask for an attention problem's proxy: "bool", True keeps (3 keys in 4 and the
    diagonal, so no row is fully masked: MLX and torch disagree there); "additive", normal values in
    `dtype` with 1 key in 10 at -inf (removed)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if kind == "bool":
        return (torch.rand(seq, seq, generator=g) < 0.75) | torch.eye(seq, dtype=torch.bool)
    values = torch.randn(seq, seq, generator=g)
    removed = (torch.rand(seq, seq, generator=g) < 0.1) & ~torch.eye(seq, dtype=torch.bool)
    return values.masked_fill(removed, float("-inf")).to(torch_dtype(dtype))


def quantized_operands(M: int, N: int, K: int, bits: int, group_size: int, dtype: str, seed: int = 0) -> tuple[Any, ...]:
    """(x, w_q, scales, biases, fp32 reference x @ dequant(w)^T): w (N x K) quantized by kernels.quantize,
    which writes MLX's affine format (mx.quantize's)."""
    import torch

    from tilelang_metal import kernels

    g = torch.Generator().manual_seed(seed)
    dt = torch_dtype(dtype)
    w_q, scales, biases = kernels.quantize(torch.randn(N, K, generator=g).to(dt), bits=bits, group_size=group_size)
    x = (torch.randn(M, K, generator=g) / math.sqrt(K)).to(dt)
    w = kernels.dequantize(w_q, scales, biases, bits=bits, group_size=group_size).float()
    return x, w_q, scales, biases, x.float() @ w.T
