"""The cost model's analytic counts (tilelang_metal.performance.cost_model.counts, no kernel built) against the
emulator's counters for the kernel the GEMM dispatch ships, at 256x256x256 fp16 on both targets."""

from __future__ import annotations

import pytest
import torch

import importlib

from tilelang_metal.performance import cost_model, roofline
from tilelang_metal import kernels
from tilelang_metal.emulator import counters
from tilelang_metal.performance.roofline import MATRIX_FLOPS

SIZE = 256


@pytest.mark.parametrize("chip_name", ["M4", "M5"])
def test_predicted_counts_match_the_emulator(chip_name):
    chip = roofline.chip(chip_name)
    choice = kernels.matmul_config(SIZE, SIZE, SIZE, chip=chip)
    kernel = importlib.import_module("tilelang_metal.kernels.matmul").compile_choice(choice, "emulator")
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(SIZE, SIZE, generator=gen).half() for _ in range(2))
    total = counters(kernel, a, b).total
    predicted = cost_model.counts(cost_model.from_choice(choice), SIZE, SIZE, SIZE, chip=chip)
    counted_flops = sum(int(total.get(name, 0)) * flops for name, flops in MATRIX_FLOPS.items())
    assert (predicted.matrix_flops, predicted.core_load_bytes, predicted.device_store_bytes) == (
        counted_flops, total["device_load_bytes"], total["device_store_bytes"])
    assert predicted.matrix_ops == sum(int(total.get(name, 0)) for name in MATRIX_FLOPS)
    assert torch.allclose(kernel(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1)
