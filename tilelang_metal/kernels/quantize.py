"""Affine group quantization of weights, in torch, bit for bit what `mlx.core.quantize` (mode
"affine") returns: `quantize(w)` -> `(w_q, scales, biases)`, `dequantize(...)` -> `scales * q + biases`.

w (N, K) is quantized along its last axis in groups of `group_size` consecutive elements. Each group
gets a scale and a bias (in w's dtype) chosen as MLX chooses them, all in float32:

- the edge is the end of the group's range with the larger magnitude (the minimum when
  |min| > |max|, else the maximum); the scale is (max - min) / (2^bits - 1), at least 1e-7, and
  negative when the edge is the maximum, so the edge always maps to a level q0 = round(edge / scale);
- when q0 != 0 the scale becomes edge / q0 and the bias is the edge itself, which makes the edge
  exact after dequantization (a group of one sign keeps its largest-magnitude weight); when q0 is 0
  the bias is 0;
- q = clamp(round((w - bias) / scale), 0, 2^bits - 1), with float32's scale, not the rounded one
  that is returned.

Packing: each row of w_q is one little-endian bit stream, element j in bits [j*bits, (j+1)*bits)
of it, read as uint32 words: for 2, 4 and 8 bits a word holds 32 / bits whole elements; 3, 5 and 6
bits run across word boundaries (MLX packs them 8, 8 and 4 elements to 3, 5 and 3 bytes, which is
the same stream). torch has no shifts on uint32 on the CPU: the packing is done in int64 and cast.
"""

from __future__ import annotations

from typing import Any

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
SCALE_FLOOR = 1e-7  # MLX's smallest scale magnitude: a constant group does not divide by zero


def _torch() -> Any:
    import torch

    return torch


def _float_dtypes() -> dict[Any, str]:
    torch = _torch()
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _check_layout(what: str, bits: Any, group_size: Any) -> tuple[int, int]:
    from .sizes import integer_sizes

    bits, group_size = integer_sizes(what, bits=bits, group_size=group_size)
    if bits not in BITS:
        raise ValueError(f"{what} bits={bits} is not supported; use one of {', '.join(map(str, BITS))}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{what} group_size={group_size} is not supported; use one of {', '.join(map(str, GROUP_SIZES))}")
    return bits, group_size


def _check_float_matrix(what: str, name: str, tensor: Any) -> None:
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} {name} must be a torch.Tensor (a {type(tensor).__name__} was given)")
    if tensor.dtype not in _float_dtypes():
        raise ValueError(f"{what} {name} has dtype {tensor.dtype}; use float16, bfloat16 or float32")
    if tensor.dim() != 2:
        raise ValueError(f"{what} {name} must be 2-D (N, K) (got shape {tuple(tensor.shape)}); reshape it to (-1, K)")


def _pack_unit(bits: int) -> tuple[int, int]:
    """(elements, bytes) of the smallest whole-byte run of the bit stream: 8 / 3 for 3 bits, 4 / 3
    for 6, 8 / 5 for 5, 32 / bits elements of one word for 2, 4 and 8 (at most 40 bits: fits int64)."""
    if bits in (2, 4, 8):
        return 32 // bits, 4
    return (4, 3) if bits == 6 else (8, bits)


def _pack(levels: Any, bits: int) -> Any:
    """Levels (N, K) int64 in [0, 2^bits) -> uint32 words (N, K * bits / 32) of the row bit streams."""
    torch = _torch()
    rows, cols = levels.shape
    elements, nbytes = _pack_unit(bits)
    shifts = torch.arange(elements, dtype=torch.int64) * bits
    runs = (levels.reshape(rows, cols // elements, elements) << shifts).sum(-1)  # disjoint bit fields: sum == or
    if nbytes == 4:
        return runs.to(torch.uint32)  # 2, 4, 8 bits: a run is a word
    byte_shifts = torch.arange(nbytes, dtype=torch.int64) * 8
    stream = ((runs.unsqueeze(-1) >> byte_shifts) & 0xFF).reshape(rows, -1, 4)  # bytes, 4 per word
    words = (stream << (torch.arange(4, dtype=torch.int64) * 8)).sum(-1)
    return words.to(torch.uint32)


def _unpack(w_q: Any, bits: int, cols: int) -> Any:
    """uint32 words (N, cols * bits / 32) -> levels (N, cols) int64."""
    torch = _torch()
    rows = w_q.shape[0]
    elements, nbytes = _pack_unit(bits)
    words = w_q.to(torch.int64)
    if nbytes == 4:
        runs = words
    else:
        stream = ((words.unsqueeze(-1) >> (torch.arange(4, dtype=torch.int64) * 8)) & 0xFF).reshape(rows, -1, nbytes)
        runs = (stream << (torch.arange(nbytes, dtype=torch.int64) * 8)).sum(-1)
    levels = (runs.unsqueeze(-1) >> (torch.arange(elements, dtype=torch.int64) * bits)) & ((1 << bits) - 1)
    return levels.reshape(rows, cols)


def quantize(w: Any, *, bits: int = 4, group_size: int = 64) -> tuple[Any, Any, Any]:
    """`(w_q, scales, biases)` of w (N, K) as `mx.quantize(w, group_size, bits)` returns them: w_q
    uint32 (N, K * bits / 32), scales and biases (N, K / group_size) in w's dtype (module doc). `bits` and
    `group_size` are keywords: `mx.quantize` takes them positionally in the other order."""
    torch = _torch()
    bits, group_size = _check_layout("quantize", bits, group_size)
    _check_float_matrix("quantize", "w", w)
    rows, cols = w.shape
    if cols == 0 or cols % group_size:
        raise ValueError(f"quantize needs K (w.shape[-1] = {cols}) to be a positive multiple of group_size={group_size}; "
                         "pad w's rows or pick a group_size dividing K")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize w has NaN or infinite elements; a group's scale would be undefined (replace them first)")
    levels_max = float((1 << bits) - 1)
    groups = w.detach().cpu().to(torch.float32).reshape(rows, cols // group_size, group_size)
    w_min = groups.amin(-1)
    w_max = groups.amax(-1)
    edge_is_min = w_min.abs() > w_max.abs()
    scale = torch.clamp((w_max - w_min) / levels_max, min=SCALE_FLOOR)
    scale = torch.where(edge_is_min, scale, -scale)
    edge = torch.where(edge_is_min, w_min, w_max)
    q0 = torch.round(edge / scale)  # round half to even, as std::rint
    edge_on_level = q0 != 0
    scale = torch.where(edge_on_level, edge / q0, scale)
    bias = torch.where(edge_on_level, edge, torch.zeros_like(edge))
    levels = torch.round((groups - bias.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp(0, levels_max)
    w_q = _pack(levels.to(torch.int64).reshape(rows, cols), bits)
    return w_q.to(w.device), scale.to(w.dtype).to(w.device), bias.to(w.dtype).to(w.device)


def dequantize(w_q: Any, scales: Any, biases: Any, *, bits: int = 4, group_size: int = 64) -> Any:
    """w (N, K) in the dtype of scales: `scales * q + biases` per group, the inverse layout of `quantize`."""
    torch = _torch()
    bits, group_size = _check_layout("dequantize", bits, group_size)
    if not isinstance(w_q, torch.Tensor) or w_q.dtype != torch.uint32:
        found = w_q.dtype if isinstance(w_q, torch.Tensor) else type(w_q).__name__
        raise ValueError(f"dequantize w_q must be a torch.uint32 tensor (got {found}); pass quantize()'s w_q")
    if w_q.dim() != 2:
        raise ValueError(f"dequantize w_q must be 2-D (N, K * bits / 32) (got shape {tuple(w_q.shape)})")
    _check_float_matrix("dequantize", "scales", scales)
    _check_float_matrix("dequantize", "biases", biases)
    rows, words = w_q.shape
    cols = words * 32 // bits
    if words * 32 % bits or cols % group_size:
        raise ValueError(f"dequantize w_q has {words} words per row, not a whole number of {group_size}-element groups at "
                         f"bits={bits}; pass the bits and group_size it was quantized with")
    expected = (rows, cols // group_size)
    for name, tensor in (("scales", scales), ("biases", biases)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"dequantize {name} has shape {tuple(tensor.shape)}, w_q needs {expected} at bits={bits}, "
                             f"group_size={group_size}; pass the bits and group_size it was quantized with")
    if biases.dtype != scales.dtype:
        raise ValueError(f"dequantize biases has dtype {biases.dtype}, scales {scales.dtype}; pass quantize()'s pair")
    levels = _unpack(w_q.cpu(), bits, cols).reshape(rows, cols // group_size, group_size)
    dtype = scales.dtype
    # in the weights' dtype, product rounded then sum rounded, as MLX's dequantize computes it
    w = scales.cpu().unsqueeze(-1) * levels.to(dtype) + biases.cpu().unsqueeze(-1)
    return w.reshape(rows, cols).to(w_q.device)
