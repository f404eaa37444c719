"""Issue 33, item 3: the kernel `kernels.matmul_config` picks is predicted within 5% of the best the cost
model (tilelang_metal/performance/cost_model.py) finds over every route and configuration the plugin can lower
(`autotune.route_candidates`: tiled GEMM over `autotune.config_space` on both paths, split-K, GEMV), fp16
squares at 1024^3, 2048^3 and 4096^3. Pure arithmetic: no kernel is built.

Metal 4 chips (M5 family): asserted; the dispatch asks the model to rank the kernels it ships.
M1-M4 (plain metal): the staged tile and the split count come from rules (the steel-gemm work changes
the tile); their ratios, over every route and over the staged routes the plain dispatch ships, are the
table in docs/performance.md ("Dispatch agreement"), kept equal to what the code gives by the slow test
below and printed by `python tests/unit/test_dispatch_agrees_with_model.py`."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

from tilelang_metal.target.capabilities import capabilities_with
from tilelang_metal.target.isa import METAL4_FEATURE
from tilelang_metal.tuning import autotune
from tilelang_metal.performance import cost_model, roofline
from tilelang_metal import kernels

SIZES = (1024, 2048, 4096)
TOLERANCE = 0.05
METAL4_CHIPS = [name for name, chip in roofline.CHIPS.items() if chip.generation >= 5]
DOC = Path(__file__).parents[2] / "docs" / "performance.md"
START, END = "<!-- dispatch-agreement:start -->", "<!-- dispatch-agreement:end -->"


def _capabilities(metal4: bool):
    return capabilities_with({METAL4_FEATURE} if metal4 else ())


@functools.lru_cache(maxsize=None)
def space(size: int, metal4: bool) -> tuple[autotune.GemmConfig, ...]:
    """The autotuner's space (the same for every chip of a target)."""
    return tuple(autotune.config_space(size, size, size, target=_capabilities(metal4)))


def agreement(name: str, size: int) -> tuple[float, float, str, str]:
    """(pick / the model's best over every route, pick / the best over the threadgroup-staged routes
    only, the pick, the best) in predicted seconds."""
    chip = roofline.CHIPS[name]
    choice = kernels.matmul_config(size, size, size, chip=chip)
    metal4 = chip.generation >= 5
    found = autotune.route_candidates(size, size, size, chip=chip, target=_capabilities(metal4), space=space(size, metal4))
    best = min(found, key=lambda c: c.seconds)
    staged = min((c for c in found if c.kernel is not None and c.kernel.path == cost_model.SHARED), key=lambda c: c.seconds)
    pick = cost_model.predict_choice(choice, chip=chip)
    return pick / best.seconds, pick / staged.seconds, choice.summary(), best.describe()


@pytest.mark.parametrize("name", METAL4_CHIPS)
def test_metal4_dispatch_is_within_5_percent_of_the_model_s_best(name):
    for size in SIZES:
        ratio, _, pick, best = agreement(name, size)
        print(f"{name} {size}^3: {ratio:.3f} ({pick}; the model's best: {best})")
        assert ratio <= 1 + TOLERANCE, f"{name} {size}^3: {pick} is {ratio:.3f}x the model's best ({best})"


def table() -> str:
    head = ["chip", "target"] + [f"{s}^3" for s in SIZES] + [f"{s}^3, staged routes only" for s in SIZES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, chip in roofline.CHIPS.items():
        found = [agreement(name, size) for size in SIZES]
        cells = [f"{r[0]:.3f}" + (" (over 5%)" if r[0] > 1 + TOLERANCE else "") for r in found]
        staged = [f"{r[1]:.3f}" if chip.generation < 5 else "n/a (direct-global)" for r in found]
        lines.append("| " + " | ".join([name, "metal4" if chip.generation >= 5 else "metal", *cells, *staged]) + " |")
    return "\n".join(lines)


@pytest.mark.slow
def test_docs_table_is_what_the_dispatch_and_the_model_give():
    found = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), DOC.read_text(), re.S)
    assert found, f"{DOC} lacks the {START} ... {END} table"
    assert found.group(1) == table(), f"regenerate: python {Path(__file__).relative_to(DOC.parents[1])}"


if __name__ == "__main__":
    sys.exit(print(table()))
