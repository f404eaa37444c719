"""docs/first_hour.md: every `python` block runs on Linux as written, in order, in one namespace
(blocks for a Mac, starting with `# on a Mac`, are compiled for syntax only)."""

import linecache
import os
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "first_hour.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_the_promised_sections():
    text = DOC.read_text()
    for needle in ("alloc_fragment", "execution_backend", "on Linux", "on a Mac", "Profile", "From MLX", "From PyTorch", "2722"):
        assert needle in text, needle


@pytest.mark.filterwarnings("ignore:tilelang_metal. do_bench:RuntimeWarning")  # the page says it warns
def test_every_linux_snippet_runs():
    if not os.environ.get("CI"):
        pytest.importorskip("mlx.core", reason="the MLX section needs MLX (pip install -e '.[mlx]')")
    blocks = python_blocks()
    assert len(blocks) >= 8
    namespace: dict = {}
    ran = 0
    for i, block in enumerate(blocks):
        name = f"<{DOC.name} block {i}>"  # T.prim_func reads its source: keep it in linecache
        linecache.cache[name] = (len(block), None, block.splitlines(True), name)
        code = compile(block, name, "exec")
        if block.lstrip().startswith("# on a Mac"):
            continue
        exec(code, namespace)  # noqa: S102  (the documentation's own code)
        ran += 1
    assert ran == len(blocks) - 1  # all but the Mac block
