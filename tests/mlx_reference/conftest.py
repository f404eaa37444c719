"""The MLX reference tier: MLX's production Metal kernels (headers of the `mlx-metal` wheel, MIT
licensed), unmodified, run in the emulator against torch. The wheel is downloaded at test time into
pytest's cache directory (`.pytest_cache/d/mlx-metal/`), never committed or vendored. Under CI=1 a
failed download fails the tier; elsewhere the tier is skipped with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

MLX_METAL_VERSION = "0.32.4"
KERNELS = "mlx/include/mlx/backend/metal/kernels/"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.mlx_reference)


def _download(cache: Path) -> Path:
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
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return include / "mlx" / "include"


@pytest.fixture(scope="session")
def mlx_include(request: pytest.FixtureRequest) -> str:
    cache = Path(request.config.cache.mkdir("mlx-metal"))
    try:
        return str(_download(cache))
    except (RuntimeError, OSError, subprocess.SubprocessError, zipfile.BadZipFile) as e:
        if os.environ.get("CI") == "1":
            pytest.fail(f"MLX reference tier: {e}")
        pytest.skip(f"MLX reference tier needs the mlx-metal wheel: {e}")
