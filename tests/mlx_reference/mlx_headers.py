"""MLX's Metal kernel headers from the `mlx-metal` wheel (MIT licensed), downloaded into a cache at
test time (never committed or vendored): the MLX reference tier's fixture and benchmark/compare_mlx.py
both take them from here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

MLX_METAL_VERSION = "0.32.4"  # the version constraints/ pin for mlx
KERNELS = "mlx/include/mlx/backend/metal/kernels/"


def kernel_headers(cache: Path) -> Path:
    """The include directory holding `mlx/backend/metal/kernels/`, downloading the wheel into `cache`
    the first time (only the kernel headers are extracted, not the metallib)."""
    include = cache / f"include-{MLX_METAL_VERSION}"
    if (include / KERNELS / "softmax.h").is_file():
        return include / "mlx" / "include"  # what `#include "mlx/backend/metal/kernels/..."` needs
    wheels = cache / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
           "macosx_15_0_arm64", f"mlx-metal=={MLX_METAL_VERSION}", "-d", str(wheels), "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    found = sorted(wheels.glob(f"mlx_metal-{MLX_METAL_VERSION}-*.whl"))
    if r.returncode != 0 or not found:
        raise RuntimeError(f"pip download of mlx-metal=={MLX_METAL_VERSION} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    tmp = cache / f".extract-{os.getpid()}"
    with zipfile.ZipFile(found[0]) as z:  # only the kernel headers, not the 40 MB metallib
        z.extractall(tmp, [n for n in z.namelist() if n.startswith(KERNELS)])
    try:
        tmp.rename(include)
    except OSError:  # another process extracted it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return include / "mlx" / "include"
