"""Issue 21, item 5: the Linux ranking's first choice (`autotune.rank_by_model` over `config_space`)
checked against the tile MLX's own dispatch picks (mlx_gemm.gemm_tile / mlx_nax.gemm_tiles, ported
from MLX's matmul.cpp), per chip of `roofline.CHIPS`, fp16 A @ B at 4096^3 and 2048^3. The ranking
never reads MLX's table; this module compares the two and keeps the table in docs/performance.md
true (regenerate it with `python tests/mlx_reference/test_ranking_vs_mlx_tiles.py`).

Two classes are compared: the threadgroup tile (bm x bn) and the simdgroup share (elements of C per
simdgroup: it sets the accumulator registers and the fragment loads per matrix operation). The last
columns place MLX's own tile in the ranking: its model time over the first choice's, and its rank."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

if __name__ == "__main__":  # run as a script: the same imports as under pytest (tests/ and this folder)
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import mlx_gemm as mg
import mlx_nax

from tilelang_metal.tuning import autotune
from tilelang_metal.performance import roofline

SHAPES = ((4096, 4096, 4096), (2048, 2048, 2048))
DOC = Path(__file__).parents[2] / "docs" / "performance.md"
START, END = "<!-- ranking-vs-mlx:start -->", "<!-- ranking-vs-mlx:end -->"


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    simdgroups: int

    @property
    def share(self) -> int:
        return self.bm * self.bn // self.simdgroups

    def describe(self) -> str:
        return f"{self.bm}x{self.bn}/{self.simdgroups}"


def size_class(chip: roofline.Chip) -> str:
    """The last letter of the chip's architecture name (roofline.ARCHITECTURES), which MLX reads."""
    return chip.architecture.size_letter


def mlx_tile(chip: roofline.Chip, M: int, N: int, K: int) -> Tile:
    if chip.generation >= 5:
        bm, bn, _, wm, wn = mlx_nax.gemm_tiles(M, N, K, size_class(chip))
    else:
        device = mg.Device(chip.architecture.name)
        assert mg.route(M, N, K, torch.float16, False, False, device) == "gemm"
        bm, bn, _, wm, wn = mg.gemm_tile(M, N, K, torch.float16, False, False, device)
    return Tile(bm, bn, wm * wn)


def ranking(chip: roofline.Chip, M: int, N: int, K: int) -> list[autotune.ModelRanked]:
    target = autotune.target_for(chip)
    return autotune.rank_by_model(autotune.config_space(M, N, K, target=target), M, N, K, chip=chip, target=target)


def tile_of(ranked: autotune.ModelRanked) -> Tile:
    return Tile(ranked.config.block_m, ranked.config.block_n, ranked.config.threads // 32)


def mlx_place(ranked: list[autotune.ModelRanked], theirs: Tile) -> str:
    """Where MLX's tile (its best variant: path, K step, stages, swizzle) lands in the ranking: its
    model time over the first choice's, and its rank."""
    place = next(i for i, r in enumerate(ranked) if tile_of(r) == theirs)
    return f"{ranked[place].estimate.seconds / ranked[0].estimate.seconds:.3f} (#{place + 1})"


def _cell(ours: Tile, theirs: Tile) -> str:
    same_tile, same_share = (ours.bm, ours.bn) == (theirs.bm, theirs.bn), ours.share == theirs.share
    verdict = {(True, True): "same tile and share", (True, False): "same tile, other share",
               (False, True): "same share", (False, False): "differs"}[same_tile, same_share]
    return f"{ours.describe()} ({ours.share}): {verdict}"


def table() -> str:
    head = ["chip", "MLX class"] + [f"MLX {M}x{N}x{K} (share)" for M, N, K in SHAPES] + [
        f"ranking {M}x{N}x{K}" for M, N, K in SHAPES] + [f"MLX's tile in the ranking, {M}^3" for M, _, _ in SHAPES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for chip in roofline.CHIPS.values():
        theirs = [mlx_tile(chip, *s) for s in SHAPES]
        ranked = [ranking(chip, *s) for s in SHAPES]
        nax = ", NAX" if chip.generation >= 5 else ""
        cells = [chip.name, f"'{size_class(chip)}'{nax}"] + [f"{t.describe()} ({t.share})" for t in theirs] + [
            _cell(tile_of(r[0]), t) for r, t in zip(ranked, theirs)] + [mlx_place(r, t) for r, t in zip(ranked, theirs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _documented() -> str:
    text = DOC.read_text()
    found = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert found, f"{DOC} lacks the {START} ... {END} table"
    return found.group(1)


def test_docs_table_is_what_the_ranking_and_mlx_s_dispatch_give():
    assert _documented() == table(), f"regenerate: python {Path(__file__).relative_to(DOC.parents[1])}"


def test_mlx_classes_as_ported():
    """Spot checks of the port (matmul.cpp): 'g' 64x64 on 2 simdgroups, 's' 64x64 on 4, NAX base
    128x128 on 16, NAX Max 64x128 on 8."""
    c = roofline.chip
    assert mlx_tile(c("M4"), 4096, 4096, 4096) == Tile(64, 64, 2)
    assert mlx_tile(c("M3 Max"), 4096, 4096, 4096) == Tile(64, 64, 4)
    assert mlx_tile(c("M5"), 4096, 4096, 4096) == Tile(128, 128, 16)
    assert mlx_tile(c("M5 Max"), 4096, 4096, 4096) == Tile(64, 128, 8)


if __name__ == "__main__":
    print(table())
