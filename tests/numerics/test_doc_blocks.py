"""The documentation stays true: every `python` block of README.md and docs/*.md runs on Linux as
written, page by page, in order, in one namespace per page (blocks for a Mac, starting with `# on a
Mac`, are compiled for syntax only); docs/first_hour.md has its own test (test_first_hour_doc.py),
with its section checks.

Every other block says what it is, with an HTML comment on the line above its fence:
`<!-- doc-test: run -->` (a shell block whose commands run here and must succeed),
`<!-- doc-test: output -->` (a text block each of whose lines the run block above it prints),
`<!-- doc-test: mac -->` (a shell block for a Mac: checked with `bash -n` only), or
`<!-- doc-test: exempt REASON -->` (not code that runs: a diagram, an excerpt of generated MSL, ...).
An unmarked block that is not run fails `test_every_block_is_run_or_marked`. Every repository
path the pages name (`tilelang_metal/...`, `tests/...`, `benchmark/...`, `scripts/...`) exists."""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "first_hour.md")]
ALL_PAGES = [*PAGES, ROOT / "docs" / "first_hour.md", ROOT / "patches" / "README.md"]
QUICK_BLOCKS = 8  # pages with more blocks run in the slow tier (the guide: 14 kernels, ~6 s warm)
KINDS = ("run", "output", "mac", "exempt")

# Blocks in sections other work is editing now, exempted here rather than with a comment in the page:
# (page, a line the block contains) -> reason.
EXEMPT_HERE: dict[tuple[str, str], str] = {
    ("guide.md", "T.copy(Q[bz, bx * block_m:(bx + 1) * block_m, by, :], Q_frag)       # once, before the key loop"):
        "an excerpt of kernels/attention.py, which tests/numerics/test_attention.py runs",
    ("guide.md", "T.reduce_max(S, row_max, dim=1, clear=False)        # running row maximum"):
        "an excerpt of kernels/attention.py, which tests/numerics/test_attention.py runs",
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str | None  # one of KINDS, from the comment on the line above the fence
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text, found = page.read_text(), []
    for m in re.finditer(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", text, flags=re.S | re.M):  # also fences in list items
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = re.fullmatch(r"<!-- doc-test: (\w+)(?: (.*?))? -->", before.strip())
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(2), textwrap.dedent(m.group(3)),
                           mark.group(1) if mark else None, (mark.group(2) or "") if mark else ""))
    return found


def python_blocks(page: Path) -> list[str]:
    return [b.text for b in blocks(page) if b.lang == "python"]


def test_every_block_is_run_or_marked():
    problems = []
    for page in ALL_PAGES:
        previous: Block | None = None
        for b in blocks(page):
            exempt_here = any((page.name, line) in EXEMPT_HERE for line in b.text.splitlines())
            if b.mark is not None and b.mark not in KINDS:
                problems.append(f"{b.where}: unknown mark {b.mark!r}; use one of {', '.join(KINDS)}")
            elif b.mark == "exempt" and not b.reason:
                problems.append(f"{b.where}: `<!-- doc-test: exempt -->` needs a reason after 'exempt'")
            elif b.mark in ("run", "mac") and b.lang not in ("bash", "sh"):
                problems.append(f"{b.where}: `{b.mark}` marks a shell block; this one is {b.lang or 'untagged'}")
            elif b.mark == "output" and (previous is None or (previous.mark != "run" and previous.lang != "python")):
                problems.append(f"{b.where}: an `output` block must follow a `run` or python block")
            elif b.lang == "python" and b.mark not in (None, "exempt"):
                problems.append(f"{b.where}: python blocks run as they are (a Mac one starts with `# on a Mac`)")
            elif b.lang != "python" and b.mark is None and not exempt_here:
                problems.append(f"{b.where}: {'a ' + b.lang if b.lang else 'an untagged'} block that no test runs; mark it on the line "
                                "above the fence: <!-- doc-test: run | output | mac | exempt REASON -->")
            previous = b
    assert not problems, "\n".join(problems)


def test_every_code_block_parses():
    """Blocks that only a Mac can run are still valid Python / shell."""
    bash = shutil.which("bash")
    for page in ALL_PAGES:
        for b in blocks(page):
            if b.lang == "python":
                ast.parse(b.text, filename=b.where)
            elif b.lang in ("bash", "sh") and bash:
                checked = subprocess.run([bash, "-n"], input=b.text, text=True, capture_output=True)
                assert checked.returncode == 0, f"{b.where}: {checked.stderr.strip()}"


REPO_PATH = re.compile(r"(?<![\w./-])((?:tilelang_metal|tests|benchmark|scripts|docs|patches|constraints|"
                       r"codegen|core|emulator|execution|gemm|host|kernels|legalize|ops|performance|target|transform)/[\w./-]*\w)")
NOT_IN_REPO = {"patches/001-short-description.patch"}  # the naming rule's example, not a file


def test_every_repository_path_named_exists():
    """`tilelang_metal/...`, `tests/...`, ... and a package's own `gemm/tiling.py` (under
    tilelang_metal/); a dotted suffix names a function in a module (`codegen/kernel_text.split_kernels`)."""
    missing = []
    for page in ALL_PAGES:
        text = page.read_text()
        for m in REPO_PATH.finditer(text):
            path = m.group(1)
            module = path.split(".", 1)[0] + ".py"
            if path in NOT_IN_REPO or any((base / p).exists() for base in (ROOT, ROOT / "tilelang_metal") for p in (path, module)):
                continue
            missing.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {path}")
        for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # relative Markdown links
            if "://" not in m.group(1) and not (page.parent / m.group(1)).exists():
                missing.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: link {m.group(1)}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def run_command(line: str, cwd: Path) -> str:
    """One command of a `run` block: `python -m tilelang_metal ...` in this process (no second tilelang
    import), anything else through bash from the repository root. Returns what it printed."""
    words = shlex.split(line, comments=True)
    if words[:3] == ["python", "-m", "tilelang_metal"]:
        from tilelang_metal.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(words[3:])
        assert code == 0, f"{line}\n{out.getvalue()}"
        return out.getvalue()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


RUN_PAGES = [p for p in ALL_PAGES if any(b.mark == "run" for b in blocks(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.name)
def test_run_blocks_succeed_and_print_their_output(page):
    printed = ""
    for previous, b in zip([None, *blocks(page)], blocks(page)):
        if b.mark == "run":
            printed = "".join(run_command(line, ROOT) for line in b.text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
        elif b.mark == "output" and previous.mark == "run":
            assert_printed(b, None if platform.system() == "Darwin" else printed)  # a Mac tunes for its own chip


@pytest.mark.filterwarnings("ignore:tilelang_metal. do_bench:RuntimeWarning")
@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if len(python_blocks(p)) > QUICK_BLOCKS else p for p in PAGES if python_blocks(p)],
    ids=lambda p: p.name,
)
def test_every_python_block_runs(page, monkeypatch, tmp_path, capfd):
    if not os.environ.get("CI") and "mlx" in page.read_text():
        pytest.importorskip("mlx.core", reason="the page's MLX blocks need MLX (pip install -e '.[mlx]')")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": f"doc_{page.stem}"}
    printed: str | None = None  # by the last python block run
    for i, (previous, b) in enumerate(zip([None, *blocks(page)], blocks(page))):
        if b.mark == "output" and previous.lang == "python":
            assert_printed(b, printed)
        if b.lang != "python":
            continue
        name = f"<{page.name} block {i}>"  # T.prim_func reads its source: keep it in linecache
        linecache.cache[name] = (len(b.text), None, b.text.splitlines(True), name)
        code = compile(b.text, name, "exec", dont_inherit=True)  # not this module's `from __future__ import annotations`
        printed = None
        if b.text.lstrip().startswith("# on a Mac"):
            continue
        capfd.readouterr()
        exec(code, namespace)  # noqa: S102  (the documentation's own code)
        printed = "".join(capfd.readouterr())


def assert_printed(output: Block, printed: str | None) -> None:
    """Each line of an `output` block (but `...`) is a line of what the block above printed."""
    if printed is None:  # after a Mac block
        return
    for line in output.text.splitlines():
        assert line.strip() == "..." or line in printed, f"{output.where}: not printed: {line}\n--- printed:\n{printed}"
