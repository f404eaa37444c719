"""Apple GPU peaks and a roofline estimate of a kernel's time from the emulator's counters.

The chip table is what the benchmarks' "% of peak" column and the autotuner's Linux ranking divide
by. Every entry names its source. Apple states FP32 TFLOPS and memory bandwidth for some chips and
not for others; the rest are estimates, marked `estimated=True` with their derivation in `source`.
On M1-M4 a simdgroup_matrix fp16/bf16 multiply-accumulate runs at the FP32 ALU rate, so the FP32
figure is also the matrix peak; M5 adds a Neural Accelerator per GPU core (Metal 4 `matmul2d`).

`cost_model.roofline_estimate(counts, chip)` is the bound from counted figures
alone: max(matrix FLOPs / peak, device bytes / bandwidth), for kernels whose tiling it does not know.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from ..target.isa import REGISTRY


_APPLE_NEWS = "Apple Newsroom"


@dataclass(frozen=True)
class Chip:
    name: str
    gpu_cores: int  # the configuration the peak below is for
    matrix_tflops: float  # fp16/bf16 matrix multiply-accumulate peak, TFLOP/s
    bandwidth_gbs: float  # unified memory bandwidth, GB/s
    source: str
    estimated: bool = False

    @property
    def generation(self) -> int:
        """5 for "M5 Pro": the family number, which decides Metal 4 tensor hardware (M5 and newer)."""
        return int(self.name.split()[0].removeprefix("M"))

    @property
    def l1_data_cache_bytes(self) -> int | None:
        """Bytes of device-data cache (L1) per GPU core, by GPU generation (`L1_DATA_CACHE`); None where
        the capacity is not published and the model takes a direct-global tile's rows to fit."""
        return L1_DATA_CACHE.get(self.generation)

    @property
    def architecture(self) -> GpuArchitecture:
        """The GPU's `MTLDevice.architecture.name` (what MLX's dispatch reads), with its source."""
        return ARCHITECTURES[self.name]

    @property
    def clock_ghz(self) -> float:
        """GPU clock implied by the table (an estimate): FP32 TFLOPS / (cores x 128 lanes x 2 FLOP); on
        M5 and newer the matrix peak is 4x the ALU rate (the M5 estimate below), so a quarter of it."""
        alu_tflops = self.matrix_tflops / (4 if self.generation >= 5 else 1)
        return alu_tflops * 1e3 / (self.gpu_cores * 128 * 2)

    def scaled_to(self, gpu_cores: int) -> Chip:
        """The same chip with another (binned) GPU core count: compute scales, bandwidth does not."""
        if gpu_cores == self.gpu_cores:
            return self
        return Chip(self.name, gpu_cores, self.matrix_tflops * gpu_cores / self.gpu_cores, self.bandwidth_gbs,
                    self.source + f"; scaled from {self.gpu_cores} to {gpu_cores} GPU cores", self.estimated)


# The device-data cache (L1) of one GPU core, by chip generation. M1 and M2 (Apple GPU families 7 and 8):
# 8 KB with 128-byte lines (Philip Turner, metal-benchmarks, README "On-Chip Memory": "Data Cache 8 KB",
# "Global Cache Line 128 B"). M3 and newer (Apple family 9 on): registers, threadgroup memory and the
# cache share one on-chip memory allocated as kernels run ("Dynamic Caching", Apple Newsroom 2023-10-30);
# no capacity is published, so the model takes what registers and threadgroup memory leave to hold a
# direct-global tile's rows (an estimate; metal-flash-attention measured the same split: its GEMM copies
# operands into threadgroup memory before family 9 and loads them directly from family 9 on,
# GEMMKernelDescriptor.preferAsyncLoad).
L1_DATA_CACHE: dict[int, int] = {1: 8 * 1024, 2: 8 * 1024}
CACHE_LINE_BYTES = 128


def _alu_estimate(cores: int, ghz: float) -> float:
    """cores x 128 FP32 lanes x 2 FLOP (FMA) x clock."""
    return round(cores * 128 * 2 * ghz / 1000, 2)


_M5_PER_CORE = round(4 * _alu_estimate(10, 1.58) / 10, 3)  # TFLOP/s per GPU core, from the M5 estimate below
_M5_FAMILY_GUESS = (f"not stated by Apple, all estimated from {_APPLE_NEWS} figures of M5 (2025-10-15) and M4 Pro / Max "
                    "(2024-10-30): GPU cores as in the M4 family, TFLOPS = cores x the M5 per-core estimate, bandwidth = "
                    "the M4 family's x 153/120 (M5 / M4); replace with Apple's figures")

CHIPS: dict[str, Chip] = {c.name: c for c in (
    Chip("M1", 8, 2.6, 68.25, f"{_APPLE_NEWS} 2020-11-10 (2.6 TFLOPS); bandwidth estimated: LPDDR4X-4266 x 128 bit", True),
    Chip("M1 Pro", 16, 5.2, 200, f"{_APPLE_NEWS} 2021-10-18 (5.2 TFLOPS, 200 GB/s)"),
    Chip("M1 Max", 32, 10.4, 400, f"{_APPLE_NEWS} 2021-10-18 (10.4 TFLOPS, 400 GB/s)"),
    Chip("M1 Ultra", 64, 21.0, 800, f"{_APPLE_NEWS} 2022-03-08 (21 TFLOPS, 800 GB/s)"),
    Chip("M2", 10, 3.6, 100, f"{_APPLE_NEWS} 2022-06-06 (3.6 TFLOPS, 100 GB/s)"),
    Chip("M2 Pro", 19, 6.8, 200, f"{_APPLE_NEWS} 2023-01-17 (6.8 TFLOPS, 200 GB/s)"),
    Chip("M2 Max", 38, 13.6, 400, f"{_APPLE_NEWS} 2023-01-17 (13.6 TFLOPS, 400 GB/s)"),
    Chip("M2 Ultra", 76, 27.2, 800, f"{_APPLE_NEWS} 2023-06-05 (27.2 TFLOPS, 800 GB/s)"),
    Chip("M3", 10, _alu_estimate(10, 1.38), 100, f"{_APPLE_NEWS} 2023-10-30 (100 GB/s); TFLOPS estimated: 10 cores x 256 FLOP/clk x 1.38 GHz", True),
    Chip("M3 Pro", 18, _alu_estimate(18, 1.38), 150, f"{_APPLE_NEWS} 2023-10-30 (150 GB/s); TFLOPS estimated: 18 cores x 256 FLOP/clk x 1.38 GHz", True),
    Chip("M3 Max", 40, _alu_estimate(40, 1.38), 400, f"{_APPLE_NEWS} 2023-10-30 (400 GB/s); TFLOPS estimated: 40 cores x 256 FLOP/clk x 1.38 GHz", True),
    Chip("M3 Ultra", 80, _alu_estimate(80, 1.38), 819, f"{_APPLE_NEWS} 2025-03-05 (80-core GPU, 819 GB/s); TFLOPS estimated: 80 cores x 256 FLOP/clk x 1.38 GHz", True),
    Chip("M4", 10, _alu_estimate(10, 1.58), 120, f"{_APPLE_NEWS} 2024-05-07 (120 GB/s); TFLOPS estimated: 10 cores x 256 FLOP/clk x 1.58 GHz", True),
    Chip("M4 Pro", 20, _alu_estimate(20, 1.58), 273, f"{_APPLE_NEWS} 2024-10-30 (273 GB/s); TFLOPS estimated: 20 cores x 256 FLOP/clk x 1.58 GHz", True),
    Chip("M4 Max", 40, _alu_estimate(40, 1.58), 546, f"{_APPLE_NEWS} 2024-10-30 (546 GB/s); TFLOPS estimated: 40 cores x 256 FLOP/clk x 1.58 GHz", True),
    Chip("M5", 10, _M5_PER_CORE * 10, 153,
         f"{_APPLE_NEWS} 2025-10-15 (153 GB/s; 'over 4x the peak GPU compute for AI of M4'); TFLOPS estimated: 4 x the M4 estimate", True),
    # Not from Apple: core counts assumed equal to the M4 generation's (Pro 20, Max 40, Ultra = 2 Max),
    # compute per core as the M5 estimate, bandwidth as M4 Pro / Max scaled by M5 / M4 (153 / 120 GB/s).
    Chip("M5 Pro", 20, _M5_PER_CORE * 20, round(273 * 153 / 120), _M5_FAMILY_GUESS, True),
    Chip("M5 Max", 40, _M5_PER_CORE * 40, round(546 * 153 / 120), _M5_FAMILY_GUESS, True),
    Chip("M5 Ultra", 80, _M5_PER_CORE * 80, 2 * round(546 * 153 / 120), _M5_FAMILY_GUESS + "; Ultra = two Max dies", True),
)}


@dataclass(frozen=True)
class GpuArchitecture:
    """`MTLDevice.architecture.name` of a chip ("applegpu_g16s"): the two digits are the GPU
    generation, the last letter the size class MLX's kernels are tuned by (mlx/backend/metal/matmul.cpp
    GEMM_TPARAM_MACRO: 'g' and 'p' small, 'd' large, any other letter medium). Apple publishes no
    table, so each string names the report it comes from; `estimated` marks strings read off a
    sibling chip rather than reported for the chip itself."""

    name: str
    source: str
    estimated: bool = False

    @property
    def size_letter(self) -> str:
        return self.name[-1]


_MLX_DEVICE = "MLX's device.cpp (https://github.com/ml-explore/mlx/blob/main/mlx/backend/metal/device.cpp)"
_INDEX = "found by code search in public repositories; the index does not name them"
_SLICES = "macOS binary archives hold one g, s and d slice per generation (metal-lipo listings, " + _INDEX + ")"
# Base chips are 'g' and Ultra chips 'd' in MLX's own reading of the letter (device.cpp's switch). The
# Pro strings are what Macs report, which is not MLX's comment ("g: base, pro"): the M2 and M4 Pro
# report the Max's 's' (MLX's medium class), the M3 Pro 'p' (small). `estimated` marks every string
# no linked page states for that chip.
ARCHITECTURES: dict[str, GpuArchitecture] = {
    "M1": GpuArchitecture("applegpu_g13g", f"{_MLX_DEVICE}: 'g' base"),
    "M1 Pro": GpuArchitecture("applegpu_g13s", "estimate: no M1 Pro report found; the M1 Max's string, since "
                              f"{_SLICES} and the M1 Pro is neither the base nor the Ultra", True),
    "M1 Max": GpuArchitecture("applegpu_g13s", "M1 Max MLX benchmark reports 'Apple M1 Max (applegpu_g13s)' (" + _INDEX + "); "
                              "Apple's MTLArchitecture.name page shows `xcrun metal-arch` printing applegpu_g13s "
                              "(https://apple-docs.everest.mt/docs/metal/mtlarchitecture/name/, machine not named)", True),
    "M1 Ultra": GpuArchitecture("applegpu_g13d", f"{_MLX_DEVICE}: 'd' Ultra"),
    "M2": GpuArchitecture("applegpu_g14g", f"{_MLX_DEVICE}: 'g' base"),
    "M2 Pro": GpuArchitecture("applegpu_g14s", f"an MLX report run on 'an Apple M2 Pro (16 GB, applegpu_g14s)' ({_INDEX})", True),
    "M2 Max": GpuArchitecture("applegpu_g14s", f"MLX tests list 'applegpu_g14s  # M2 Max' ({_INDEX})", True),
    "M2 Ultra": GpuArchitecture("applegpu_g14d", f"{_MLX_DEVICE}: 'd' Ultra"),
    "M3": GpuArchitecture("applegpu_g15g", f"{_MLX_DEVICE}: 'g' base"),
    "M3 Pro": GpuArchitecture("applegpu_g15p", f"a Metal project's docs print 'Apple M3 Pro (applegpu_g15p)' ({_INDEX}); "
                              "contested: one M3 Pro report infers g15s from its AGXG15S kernel extension", True),
    "M3 Max": GpuArchitecture("applegpu_g15s", f"{_MLX_DEVICE}: 's' Max"),
    "M3 Ultra": GpuArchitecture("applegpu_g15d", f"{_MLX_DEVICE}: 'd' Ultra"),
    "M4": GpuArchitecture("applegpu_g16g", f"{_MLX_DEVICE}: 'g' base"),
    "M4 Pro": GpuArchitecture("applegpu_g16s", "`metal-arch` on M4 Pro hosts in several MLX research logs ('an M4 Pro is "
                              f"applegpu_g16s, not applegpu_g16p'; {_INDEX})", True),
    "M4 Max": GpuArchitecture("applegpu_g16s", f"MLX tests list 'applegpu_g16s  # M4 Max' ({_INDEX})", True),
    "M5": GpuArchitecture("applegpu_g17g", f"{_MLX_DEVICE}: 'g' base; gen 17 is MLX's NAX threshold"),
    "M5 Pro": GpuArchitecture("applegpu_g17s", "estimate: a 48 GB MLX host reports applegpu_g17s and the M2 / M4 Pro report "
                              f"their Max's letter; one MLX test lists g17g for 'M5, M5 Pro' ({_INDEX})", True),
    "M5 Max": GpuArchitecture("applegpu_g17s", f"MLX benchmark reports 'Apple M5 Max (applegpu_g17s)' ({_INDEX})", True),
    "M5 Ultra": GpuArchitecture("applegpu_g17d", f"estimate: not released; {_MLX_DEVICE}: 'd' Ultra", True),
}


def chip(name: str) -> Chip:
    """The table entry for `name` ("M4 Pro", case and spacing insensitive); a clear error otherwise."""
    wanted = " ".join(name.split()).lower().removeprefix("apple ")
    for entry in CHIPS.values():
        if entry.name.lower() == wanted:
            return entry
    raise ValueError(f"unknown Apple chip {name!r}; known: {', '.join(CHIPS)}")


def detect_chip() -> Chip | None:
    """The chip of this Mac (scaled to its GPU core count), or None off macOS / for an unknown chip."""
    if platform.system() != "Darwin":
        return None
    try:
        brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=10).stdout
        found = chip(brand.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    cores = _gpu_cores()
    return found.scaled_to(cores) if cores else found


def _gpu_cores() -> int | None:
    try:
        text = subprocess.run(["system_profiler", "SPDisplaysDataType"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"Total Number of Cores:\s*(\d+)", text)
    return int(match.group(1)) if match else None


def matrix_flops() -> dict[str, int]:
    """FLOPs of one execution of each matrix counter, from the instruction registry (its counter
    names are the emulator's: emulator/instrument.py COUNTER_NAMES)."""
    return {inst.counter: inst.flops for inst in REGISTRY}


MATRIX_FLOPS: dict[str, int] = matrix_flops()  # the registry as shipped


def describe_table() -> list[dict[str, Any]]:
    """The chip table as rows (docs, CLI)."""
    return [{"chip": c.name, "gpu_cores": c.gpu_cores, "matrix_tflops": c.matrix_tflops, "bandwidth_gbs": c.bandwidth_gbs,
             "estimated": c.estimated, "source": c.source} for c in CHIPS.values()]
