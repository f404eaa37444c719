"""Every `python` block of README.md and docs/*.md runs on Linux as written, page by page, in order,
in one namespace per page (blocks for a Mac, starting with `# on a Mac`, are compiled for syntax
only). docs/first_hour.md has its own test (test_first_hour_doc.py), with its section checks."""

import linecache
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "first_hour.md")]


QUICK_BLOCKS = 8  # pages with more blocks run in the slow tier (the guide: 14 kernels, ~6 s warm)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.filterwarnings("ignore:tilelang_metal. do_bench:RuntimeWarning")
@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if len(python_blocks(p)) > QUICK_BLOCKS else p for p in PAGES if python_blocks(p)],
    ids=lambda p: p.name,
)
def test_every_python_block_runs(page, monkeypatch, tmp_path):
    if not os.environ.get("CI") and "mlx" in page.read_text():
        pytest.importorskip("mlx.core", reason="the page's MLX blocks need MLX (pip install -e '.[mlx]')")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": f"doc_{page.stem}"}
    for i, block in enumerate(python_blocks(page)):
        name = f"<{page.name} block {i}>"  # T.prim_func reads its source: keep it in linecache
        linecache.cache[name] = (len(block), None, block.splitlines(True), name)
        code = compile(block, name, "exec")
        if block.lstrip().startswith("# on a Mac"):
            continue
        exec(code, namespace)  # noqa: S102  (the documentation's own code)
