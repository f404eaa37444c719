"""Block swizzle (`T.use_swizzle`) for Metal: physical threadgroup index -> logical tile index.

`order="mlx"` follows MLX's GEMM rasterization: with panel P = 2^s, the launch grid becomes
(tiles_x * P, ceil(tiles_y / P)) and physical (x, y) maps to logical (x >> s, (y << s) + (x & (P-1))).
Consecutive threadgroups walk a P-tall column of tiles, so neighbours share B panels. The grid is
padded when tiles_y is not a multiple of P; padding threadgroups return at once.

`order="row"` / `"column"` keep the grid and renumber tiles in serpentine panels of P rows
(columns) of tiles.

Two passes on the device function:
- `BlockSwizzleLaunch` (end of the lowering pipeline) rewrites the launch extents in the function's
  `thread_extent` attribute (what the launchers read) and replaces tilelang's annotation by
  `SWIZZLE_ATTR`; the body keeps the logical extents, which simplification relies on for the ranges
  of blockIdx (the body only ever sees logical tiles);
- `BlockSwizzleRemap` (codegen stage, after tilelang's last Simplify, which would inline it) binds
  the logical tile indices once at the top of the kernel (plain TIR: `Bind`s and an early `ret` for
  padding threadgroups) and substitutes them for the block indices in the body, so no
  physical-index arithmetic is repeated there.
A new order is one entry in `ORDERS` plus its remapping function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import tir, tvm
from ..errors import MetalLoweringError
from ..core.ir_attrs import POSITION_NAMES_ATTR  # position attribute -> parameter name
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .kernel_prelude import prelude_vars, prepend, rewrite_inside_launch, with_prelude_vars
from ..host import vocab

TILELANG_SWIZZLE_ATTR = "threadblock_swizzle_pattern"
SWIZZLE_ATTR = "tilelang_metal.block_swizzle"  # (order name, panel, logical tiles_x, tiles_y)
MANUAL_TILES_ATTR = "tilelang_metal.block_swizzle_tiles"  # (tile_x, tile_y) of a kernel that maps itself
PHYSICAL_BLOCK_NAME = "__physical_blockIdx"
INT32 = "int32"


def _find_swizzle(body: Any) -> tuple[str, int] | None:
    for node in find_nodes(body, [vocab.TIRX_ATTRSTMT]):
        if str(node.attr_key) == TILELANG_SWIZZLE_ATTR:
            func_name, panel = node.value.args
            return str(func_name.value), int(panel.value)
    return None


def _c(value: int) -> Any:
    return tir.const(value, INT32)


Remap = Callable[[Any, Any, int, int, int], tuple[Any, Any, Any | None]]


def _u(value: int) -> Any:
    return tir.const(value, "uint32")


def _mlx(px: Any, py: Any, panel: int, tiles_x: int, tiles_y: int) -> tuple[Any, Any, Any | None]:
    # unsigned arithmetic on the position attribute itself: `__physical_blockIdx.x >> 2` (spec 2.2)
    shift = panel.bit_length() - 1
    ux, uy = tir.Cast("uint32", px), tir.Cast("uint32", py)
    x = tir.Cast(INT32, tir.shift_right(ux, _u(shift)))
    y = tir.Cast(INT32, tir.shift_left(uy, _u(shift)) + tir.bitwise_and(ux, _u(panel - 1)))
    return x, y, None if tiles_y % panel == 0 else True


def _serpentine(along_x: bool) -> Remap:
    """Panels of `panel` tile rows (along_x) or tile columns; odd panels walk backwards."""

    def remap(px: Any, py: Any, panel: int, tiles_x: int, tiles_y: int) -> tuple[Any, Any, Any | None]:
        major, minor = (tiles_x, tiles_y) if along_x else (tiles_y, tiles_x)
        t = py * tiles_x + px
        index = tir.Div(t, _c(panel * major))
        offset = tir.Mod(t, _c(panel * major))
        height = tir.Min(_c(panel), _c(minor) - index * panel)
        forward = tir.Div(offset, height)
        along = tir.Select(tir.Mod(index, _c(2)) == 1, _c(major - 1) - forward, forward)
        across = index * panel + tir.Mod(offset, height)
        return (along, across, None) if along_x else (across, along, None)

    return remap


ORDERS: dict[str, tuple[str, Remap]] = {
    "rasterization2DMLX": ("mlx", _mlx),
    "rasterization2DRow": ("row", _serpentine(True)),
    "rasterization2DColumn": ("column", _serpentine(False)),
}


def _block_vars(body: Any) -> dict[str, Any]:
    return {
        str(n.node.thread_tag): n.node.var
        for n in find_nodes(body, [vocab.TIRX_ATTRSTMT])
        if str(n.attr_key) == "thread_extent" and str(n.node.thread_tag).startswith("blockIdx")
    }


def _user_mapped_mlx(body: Any, panel: int) -> tuple[Any, list[Any]] | None:
    """(body in terms of the logical tiles, [tile_x, tile_y]) when blockIdx.x is used only as
    `bx // P` and `bx % P` (the kernel computes the MLX mapping itself); None otherwise."""
    blocks = _block_vars(body)
    bx, by = blocks.get("blockIdx.x"), blocks.get("blockIdx.y")
    if bx is None or by is None or panel & (panel - 1):
        return None
    tile_x, tile_y = tir.Var("__tile_x", INT32), tir.Var("__tile_y", INT32)
    seen = 0

    def is_bx(e: Any) -> bool:
        return isinstance(e, tir.Var) and e.same_as(bx)

    def rewrite(node: Any) -> Any:
        nonlocal seen
        if isinstance(node, (tir.FloorDiv, tir.FloorMod)) and is_bx(node.a) and isinstance(node.b, tir.IntImm) and int(node.b.value) == panel:
            seen += 1
            return tile_x if isinstance(node, tir.FloorDiv) else tir.floormod(tile_y, _c(panel))
        return None

    mapped = tvm.tirx.stmt_functor.ir_transform(body, None, rewrite, [vocab.TIRX_FLOORDIV, vocab.TIRX_FLOORMOD])
    uses_bx = False

    def visit(node: Any) -> None:
        nonlocal uses_bx
        if isinstance(node, tir.Var) and node.same_as(bx):
            uses_bx = True

    tir.stmt_functor.post_order_visit(mapped, visit)  # launch IterVars are not visited
    if not seen or uses_bx:
        return None
    mapped = tvm.tirx.stmt_functor.substitute(mapped, {by: tir.floordiv(tile_y, _c(panel))})
    # (t // P) * P * s + (t % P) * s  ->  t * s
    analyzer = tvm.arith.Analyzer()
    mapped = tvm.tirx.stmt_functor.ir_transform(mapped, None, lambda n: analyzer.simplify(n) if isinstance(n, tir.PrimExpr) and not isinstance(n, tir.Var) else None, [vocab.TIRX_ADD])
    return mapped, [tile_x, tile_y]


def launch_function(func: Any) -> Any:
    spec = _find_swizzle(func.body)
    if spec is None:
        return func
    order_name, panel = spec
    if order_name not in ORDERS:
        raise MetalLoweringError(f"unknown block swizzle {order_name}; Metal supports T.use_swizzle(order='mlx' | 'row' | 'column')")
    if panel <= 0:
        raise MetalLoweringError(f"T.use_swizzle panel size must be positive, got {panel}")
    raw = {str(k): v for k, v in func.attrs["thread_extent"].items()}
    dynamic = sorted(k for k, v in raw.items() if not isinstance(v, tir.IntImm))
    if dynamic:
        raise MetalLoweringError(
            f"T.use_swizzle needs a static grid of tiles, but {', '.join(dynamic)} depends on a symbolic size; "
            "drop T.use_swizzle for dynamic shapes or specialize the kernel to a concrete size"
        )
    extents = {k: int(v.value) for k, v in raw.items()}
    if "blockIdx.x" not in extents or "blockIdx.y" not in extents:
        raise MetalLoweringError("T.use_swizzle needs a kernel launched over a 2-D grid of tiles (blockIdx.x and blockIdx.y)")
    tiles_x, tiles_y = extents["blockIdx.x"], extents["blockIdx.y"]
    physical = dict(extents)
    if ORDERS[order_name][0] == "mlx" and panel & (panel - 1):
        raise MetalLoweringError(f"MLX block swizzle needs a power-of-two panel size, got {panel}; use 1, 2, 4, 8, ...")

    manual = _user_mapped_mlx(func.body, panel) if ORDERS[order_name][0] == "mlx" else None
    if manual is not None:
        # The kernel already maps its grid in MLX order itself (bx // P, by * P + bx % P): keep its
        # grid and order, only name the logical tiles (`__tile_x = bx // P`, `__tile_y = by * P +
        # bx % P`, an identity) so its addresses read `__tile_y * stride` instead of repeating the
        # physical arithmetic.
        body, tiles = manual
        func = func.with_body(body).with_attr(MANUAL_TILES_ATTR, tiles)
    elif ORDERS[order_name][0] == "mlx":
        physical["blockIdx.x"] = tiles_x * panel
        physical["blockIdx.y"] = -(-tiles_y // panel)

    def drop_annotation(node: Any) -> Any:
        return node.body if str(node.attr_key) == TILELANG_SWIZZLE_ATTR else None

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, drop_annotation, [vocab.TIRX_ATTRSTMT])
    launch = {k: _c(v) for k, v in physical.items()}
    func = func.with_body(body).with_attr("thread_extent", launch)
    return func.with_attr(SWIZZLE_ATTR, [order_name, panel, tiles_x, tiles_y])


def remap_function(func: Any) -> Any:
    if func.attrs is None or SWIZZLE_ATTR not in func.attrs:
        return func
    order_name, panel, tiles_x, tiles_y = func.attrs[SWIZZLE_ATTR]
    order_name, panel, tiles_x, tiles_y = str(order_name), int(panel), int(tiles_x), int(tiles_y)
    remap = ORDERS[order_name][1]
    manual = func.attrs.get(MANUAL_TILES_ATTR)
    tile_x, tile_y = (manual[0], manual[1]) if manual is not None else (tir.Var("__tile_x", INT32), tir.Var("__tile_y", INT32))
    known = prelude_vars(func)

    def remap_inner(chain: list[Any], inner: Any) -> Any:
        blocks = {str(a.node.thread_tag): a.node.var for a in chain if str(a.attr_key) == "thread_extent"}
        px, py = blocks["blockIdx.x"], blocks["blockIdx.y"]
        x_value, y_value, padding = remap(px, py, panel, tiles_x, tiles_y)
        if manual is not None:
            padding = None  # the kernel's own grid and bounds checks
        inner = tvm.tirx.stmt_functor.substitute(inner, {px: tile_x, py: tile_y})
        prelude = [tir.Bind(tile_x, x_value), tir.Bind(tile_y, y_value)]
        if padding is not None:  # padding threadgroups of the MLX grid: logical row past the last tile
            prelude.append(tir.IfThenElse(tile_y >= tiles_y, tir.Evaluate(tir.ret(_c(0))), None))
        return prepend(inner, known, prelude)

    func = with_prelude_vars(func.with_body(rewrite_inside_launch(func.body, remap_inner)), [tile_x, tile_y])
    return func.with_attr(POSITION_NAMES_ATTR, {"threadgroup_position_in_grid": PHYSICAL_BLOCK_NAME})


BlockSwizzleLaunch = per_function_pass("tilelang_metal.BlockSwizzleLaunch", launch_function, kernels_only=True)
BlockSwizzleRemap = per_function_pass("tilelang_metal.BlockSwizzleRemap", remap_function, kernels_only=True)
