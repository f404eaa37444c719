"""Block swizzle (`T.use_swizzle`) for Metal: physical threadgroup index -> logical tile index.

`order="mlx"` follows MLX's GEMM rasterization: with panel P = 2^s, the launch grid becomes
(tiles_x * P, ceil(tiles_y / P)) and physical (x, y) maps to logical (x >> s, (y << s) + (x & (P-1))).
Consecutive threadgroups walk a P-tall column of tiles, so neighbours share B panels. The grid is
padded when tiles_y is not a multiple of P; padding threadgroups return at once.

`order="row"` / `"column"` keep the grid and renumber tiles in serpentine panels of P rows
(columns) of tiles.

This pass runs on the device function after the host/device split: it rewrites the launch extents
in the function's `thread_extent` attribute (what the torch and emulator launchers read) but keeps
the logical extents on the body's launch attributes, which later simplification relies on for the
ranges of `blockIdx` (the body only ever sees logical tiles). It also replaces tilelang's
swizzle annotation by the plugin's `SWIZZLE_ATTR` = (order, panel, tiles_x, tiles_y), which the MSL
printer turns into one remapping at the top of the kernel: no physical-index arithmetic is repeated
in the body.
"""

from __future__ import annotations

from typing import Any

from .._host import tir, tvm
from ..errors import MetalLoweringError
from .function_pass import per_function_pass
from .ir_query import find_nodes

TILELANG_SWIZZLE_ATTR = "threadblock_swizzle_pattern"
SWIZZLE_ATTR = "tilelang_metal.block_swizzle"
ORDERS = {"rasterization2DMLX": 0, "rasterization2DRow": 1, "rasterization2DColumn": 2}
ORDER_NAMES = {0: "mlx", 1: "row", 2: "column"}


def _find_swizzle(body: Any) -> tuple[str, int] | None:
    for node in find_nodes(body, ["tirx.AttrStmt"]):
        if str(node.attr_key) == TILELANG_SWIZZLE_ATTR:
            func_name, panel = node.value.args
            return str(func_name.value), int(panel.value)
    return None


def swizzle_function(func: Any) -> Any:
    spec = _find_swizzle(func.body)
    if spec is None:
        return func
    order_name, panel = spec
    if order_name not in ORDERS:
        raise MetalLoweringError(f"unknown block swizzle {order_name}; Metal supports T.use_swizzle(order='mlx' | 'row' | 'column')")
    order = ORDERS[order_name]
    extents = {str(k): int(v) for k, v in func.attrs["thread_extent"].items()}
    tiles_x, tiles_y = extents.get("blockIdx.x", 1), extents.get("blockIdx.y", 1)
    if panel <= 0:
        raise MetalLoweringError(f"T.use_swizzle panel size must be positive, got {panel}")
    physical = dict(extents)
    if order == 0:
        if panel & (panel - 1):
            raise MetalLoweringError(f"MLX block swizzle needs a power-of-two panel size, got {panel}; use 1, 2, 4, 8, ...")
        physical["blockIdx.x"] = tiles_x * panel
        physical["blockIdx.y"] = -(-tiles_y // panel)

    def rewrite(node: Any) -> Any:
        if isinstance(node, tir.AttrStmt):
            key = str(node.attr_key)
            if key == TILELANG_SWIZZLE_ATTR:
                value = tir.call_intrin("handle", "tirx.tvm_tuple", order, panel, tiles_x, tiles_y)
                return tir.AttrStmt(node.node, SWIZZLE_ATTR, value, node.body)
        return None

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, rewrite, ["tirx.AttrStmt"])
    func = func.with_body(body)
    launch = {k: tir.const(v, "int32") if not isinstance(v, tir.IntImm) else v for k, v in physical.items()}
    return func.with_attr("thread_extent", launch)


BlockSwizzle = per_function_pass("tilelang_metal.BlockSwizzle", swizzle_function, kernels_only=True)
