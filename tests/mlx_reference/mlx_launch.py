"""What the MLX reference modules (mlx_gemm, mlx_attention, mlx_reduce, mlx_nax) hand back: a
`Launch` of one or more dispatches, in order, as MLX's host code encodes them (split-K and 2-pass
kernels take two), and the tensor they fill. `run()`, `counters()` and `racecheck()` repeat that very
launch, so a benchmark (benchmark/compare_mlx.py) can measure what the tests checked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tilelang_metal.emulator import ForeignKernel


@dataclass(frozen=True)
class Dispatch:
    """One dispatchThreadgroups: `grid` counts threadgroups, `block` threads per threadgroup."""

    kernel: ForeignKernel
    args: tuple[Any, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass(frozen=True)
class Launch:
    dispatches: tuple[Dispatch, ...]
    output: torch.Tensor  # what the last dispatch fills (a view in the caller's layout)

    @classmethod
    def of(cls, output: torch.Tensor, *dispatches: tuple[ForeignKernel, Sequence[Any], Sequence[int], Sequence[int]]) -> Launch:
        return cls(tuple(Dispatch(k, tuple(a), tuple(g), tuple(b)) for k, a, g, b in dispatches), output)

    def run(self) -> torch.Tensor:
        for d in self.dispatches:
            d.kernel.launch(list(d.args), d.grid, d.block)
        return self.output

    def counters(self) -> dict[str, int]:
        """Totals over the dispatches (each run instrumented on the same arguments)."""
        total: dict[str, int] = {}
        for d in self.dispatches:
            for name, value in d.kernel.counters(list(d.args), d.grid, d.block).items():
                total[name] = total.get(name, 0) + value
        return total

    def racecheck(self, seeds: Sequence[int] = (0, 1)) -> torch.Tensor:
        for d in self.dispatches:  # each dispatch's outputs land in its arguments, which the next reads
            d.kernel.racecheck(list(d.args), d.grid, d.block, seeds=seeds)
        return self.output
