"""The MLX reference tier: MLX's production Metal kernels (headers of the `mlx-metal` wheel, MIT
licensed), unmodified, run in the emulator against torch. The wheel is downloaded at test time into
pytest's cache directory (`.pytest_cache/d/mlx-metal/`), never committed or vendored. Under CI=1 a
failed download fails the tier; elsewhere the tier is skipped with the reason."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

import mlx_headers


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.mlx_reference)


@pytest.fixture(scope="session")
def mlx_include(request: pytest.FixtureRequest) -> str:
    cache = Path(request.config.cache.mkdir("mlx-metal"))
    try:
        return str(mlx_headers.kernel_headers(cache))
    except (RuntimeError, OSError, subprocess.SubprocessError, zipfile.BadZipFile) as e:
        if os.environ.get("CI") == "1":
            pytest.fail(f"MLX reference tier: {e}")
        pytest.skip(f"MLX reference tier needs the mlx-metal wheel: {e}")
