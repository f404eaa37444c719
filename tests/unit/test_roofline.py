"""The Apple GPU chip table and the roofline estimate (tilelang_metal.performance.roofline)."""

from __future__ import annotations

import pytest

from tilelang_metal.performance import cost_model, roofline


def test_every_chip_names_its_source_and_marks_estimates():
    assert {"M1", "M2", "M3", "M4", "M5", "M4 Max"} <= set(roofline.CHIPS)
    for chip in roofline.CHIPS.values():
        assert chip.matrix_tflops > 0 and chip.bandwidth_gbs > 0 and chip.gpu_cores > 0
        assert "Apple Newsroom" in chip.source
        assert chip.estimated == ("estimated" in chip.source)


def test_chip_lookup_is_forgiving_and_errors_are_clear():
    assert roofline.chip("apple  m4 pro") is roofline.CHIPS["M4 Pro"]
    with pytest.raises(ValueError, match="unknown Apple chip 'M9'; known: M1"):
        roofline.chip("M9")


def test_binned_chips_scale_compute_not_bandwidth():
    full = roofline.CHIPS["M1 Max"]
    binned = full.scaled_to(24)
    assert binned.matrix_tflops == pytest.approx(full.matrix_tflops * 24 / 32)
    assert binned.bandwidth_gbs == full.bandwidth_gbs and "scaled from 32 to 24" in binned.source


def test_estimate_is_the_larger_of_compute_and_memory_time():
    chip = roofline.Chip("X", 1, 1.0, 100.0, "test")  # 1 TFLOP/s, 100 GB/s
    counts = {"matmul2d_16x32x16": 1000, "simdgroup_multiply_accumulate_8x8x8": 10,
              "device_load_bytes": 3_000_000, "device_store_bytes": 1_000_000}
    est = cost_model.roofline_estimate(counts, chip)
    assert est.matrix_flops == 1000 * 16384 + 10 * 1024
    assert est.device_bytes == 4_000_000
    assert est.memory_seconds == pytest.approx(4e-5) and est.compute_seconds == pytest.approx(est.matrix_flops / 1e12)
    assert est.seconds == est.memory_seconds and est.bound == "memory"
    compute_heavy = cost_model.roofline_estimate({"matmul2d_16x32x16": 10**7}, chip)
    assert compute_heavy.bound == "compute" and "estimate" in compute_heavy.describe()


def test_no_chip_is_detected_off_macos():
    import platform

    if platform.system() != "Darwin":
        assert roofline.detect_chip() is None


def test_chips_are_listed_by_generation_then_tier():
    """The CLI's --chip choices and performance.md's table follow this order (M3 Ultra came out
    after M4 Max but belongs with the M3s)."""
    tiers = ("", "Pro", "Max", "Ultra")
    order = [(c.generation, tiers.index(c.name.partition(" ")[2])) for c in roofline.CHIPS.values()]
    assert order == sorted(order)
