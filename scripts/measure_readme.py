"""Rerun the measurements of README.md's "Measured" table and rewrite its rows.

    python scripts/measure_readme.py                 # every measurement (the whole suite included: tens of minutes)
    python scripts/measure_readme.py --only lower emulator
    python scripts/measure_readme.py --dry-run       # print the table it would write, README.md untouched
    python scripts/measure_readme.py --list          # the measurements and their commands

The table lives between `<!-- measured:start -->` and `<!-- measured:end -->`. Each row is one
`Measurement` below (what, command, how to read the command's output); its result cell ends with the
date it was measured, `(YYYY-MM-DD)`. Rows not rerun keep their cell, so numbers measured on
different days stay marked with their own dates. Commands run from the repository root, with this
Python's directory first on PATH (`python` and `pytest` are this environment's)."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- measured:start -->", "<!-- measured:end -->"
HEADER = "| what | command | result |\n|---|---|---|\n"


@dataclass(frozen=True)
class Run:
    output: str  # stdout and stderr
    seconds: float  # wall clock
    returncode: int


@dataclass(frozen=True)
class Measurement:
    name: str
    what: str
    command: str  # as shown in the table and run through bash
    read: Callable[[Run], str]  # the result cell, without its date


class MeasureError(RuntimeError):
    """A command failed, or its output lacks what the row reports."""


def _find(pattern: str, output: str, what: str) -> re.Match:
    found = re.search(pattern, output, flags=re.M)
    if found is None:
        raise MeasureError(f"{what}: no line matching {pattern!r} in the output")
    return found


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{seconds:.1f} s"


def read_lower(run: Run) -> str:
    plugin = float(_find(r"plugin\s+median\s+([\d.]+) ms", run.output, "bench_lower").group(1))
    in_tree = float(_find(r"in-tree\s+median\s+([\d.]+) ms", run.output, "bench_lower").group(1))
    return f"{plugin:.1f} ms / {in_tree:.1f} ms = **{plugin / in_tree:.2f}x**"


def read_emulator_run(run: Run) -> str:
    best = _find(r"plugin-generated .*: best ([\d.]+) s", run.output, "bench_emulator").group(1)
    return f"**{best} s** (goal <= 5 s)"


def read_emulator_compile(run: Run) -> str:
    cold = float(_find(r"compile cold \(runtime \+ kernel\):\s*([\d.]+) s", run.output, "bench_emulator").group(1))
    cached = float(_find(r"compile cached \(disk\)\s*:\s*([\d.]+) ms", run.output, "bench_emulator").group(1))
    return f"{cold:.1f} s / {cached:.1f} ms"


def read_bench_gemm(run: Run) -> str:
    cases = len(re.findall(r"^\[\d+/\d+\] ", run.output, flags=re.M))
    if cases == 0:
        raise MeasureError("bench_gemm: no problem ran")
    unverified = len(re.findall(r"^plugin result not verified", run.output, flags=re.M))
    return f"{cases - unverified}/{cases} plugin results verified against fp32 in {minutes(run.seconds)} (timings mean nothing)"


def read_property(run: Run) -> str:
    """Sums the per-shard tallies (`ok=.. refused=.. wrong=..`) the property tests print."""
    tallies = re.findall(r"ok=(\d+) refused=(\d+) wrong=(\d+)", run.output)
    if not tallies:
        raise MeasureError("property test: no `ok= refused= wrong=` tally in the output (run it with -rP or -s)")
    ok, refused, wrong = (sum(int(t[i]) for t in tallies) for i in range(3))
    return f"{ok} match torch, {refused} refused, **{wrong} wrong** ({minutes(run.seconds)})"


def read_pytest(run: Run) -> str:
    """pytest's last summary line: `N passed, M skipped, ... in T s` (between `=` rules, or bare
    under `-q`, as scripts/test.sh runs it)."""
    summary = re.findall(r"^(?:=+ )?(\d+ passed.*) in ([\d.]+)s", run.output, flags=re.M)
    if not summary:
        raise MeasureError("pytest: no summary line with a pass count")
    counts, seconds = summary[-1]
    return f"{counts} in {minutes(float(seconds))}"


MEASUREMENTS = (
    Measurement("lower", "lowering the default 4096^3 GEMM, plugin / in-tree (medians, 15 alternated runs, one process)",
                "python benchmark/bench_lower.py", read_lower),
    Measurement("emulator", "emulator, plugin-generated 1024^3 fp16 direct-global GEMM, checked",
                "python benchmark/bench_emulator.py", read_emulator_run),
    Measurement("emulator-compile", "emulator compile: cold (runtime + kernel) / cached",
                "python benchmark/bench_emulator.py", read_emulator_compile),
    Measurement("bench-gemm", "GPU GEMM benchmark harness, dry run: 9 scaled-down cases (every shape class, NN/NT, "
                "fp16/bf16/fp16->fp32) through the emulator, GPU baselines n/a",
                "python benchmark/bench_gemm.py --dry-run --out /tmp/bench", read_bench_gemm),
    Measurement("property-gemm", "property test: 200 seeded random GEMM configurations (8 shards; `-rP` shows each "
                "shard's tally under xdist)",
                "TILELANG_METAL_PROPERTY_N=200 pytest -rP tests/slow/test_property_gemm.py", read_property),
    Measurement("property-idioms", "property test of the idioms beyond one GEMM (two outputs, two GEMMs into one "
                "accumulator, annotated layouts, views of wider tensors, initialised C): 60 configurations",
                "TILELANG_METAL_PROPERTY_IDIOMS_N=60 pytest -s tests/slow/test_property_idioms.py", read_property),
    Measurement("adversarial", "adversarial sweep: 440 generated configurations over 13 compiles (GEMV, split-K, softmax, "
                "row max / sum, attention, decoding, matmul's tiled route, user programs with integer types, atomics, own "
                "barriers, strided views; NaN / inf, shapes 0-130, both targets)",
                "TILELANG_METAL_ADVERSARIAL_SCALE=4 pytest tests/slow/test_adversarial.py", read_pytest),
    Measurement("quick", "quick tier (all but tests/slow), caches as the run finds them",
                "bash scripts/test.sh --quick", read_pytest),
    Measurement("suite", "whole suite, caches as the run finds them (`.ci/run` runs it on a fresh clone: cold)",
                "bash scripts/test.sh", read_pytest),
    Measurement("racecheck", "race-check tier (every emulator launch of tests/numerics under the race checker)",
                "bash scripts/test.sh --racecheck", read_pytest),
)
BY_NAME = {m.name: m for m in MEASUREMENTS}


def run_command(command: str) -> Run:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)
    return Run(done.stdout + done.stderr, time.perf_counter() - start, done.returncode)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def row(m: Measurement, result: str) -> str:
    return f"| {cell(m.what)} | `{m.command}` | {result} |\n"


def current_results(readme_text: str) -> dict[str, str]:
    """The result cell of each row of the marked block, by the row's `what`."""
    if START not in readme_text or END not in readme_text:
        raise MeasureError(f"README.md has no {START} ... {END} block")
    block = readme_text.split(START, 1)[1].split(END, 1)[0]
    results = {}
    for line in block.splitlines():
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        if len(cells) == 3 and not set(cells[0].strip()) <= {"-"} and cells[0].strip() != "what":
            results[cells[0].strip().replace("\\|", "|")] = cells[2].strip()
    return results


def measure(names: list[str], runner: Callable[[str], Run] = run_command,
            today: datetime.date | None = None) -> dict[str, str]:
    """Result cells (dated) of the named measurements; one run per distinct command."""
    date = (today or datetime.date.today()).isoformat()
    runs: dict[str, Run] = {}
    results = {}
    for name in names:
        m = BY_NAME[name]
        if m.command not in runs:
            print(f"[{name}] {m.command}", file=sys.stderr, flush=True)
            runs[m.command] = runner(m.command)
        run = runs[m.command]
        if run.returncode != 0:
            raise MeasureError(f"{m.command} exited with status {run.returncode}:\n{run.output[-2000:]}")
        results[name] = f"{m.read(run)} ({date})"
    return results


def rewrite(readme_text: str, new_results: dict[str, str]) -> str:
    """The README with the marked block rebuilt: one row per measurement, the new result where
    measured, else the cell the row had (a measurement with neither gets `not measured yet`)."""
    old = current_results(readme_text)
    rows = [row(m, new_results.get(m.name) or old.get(m.what, "not measured yet")) for m in MEASUREMENTS]
    head, rest = readme_text.split(START, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{START}\n{HEADER}{''.join(rows)}{END}{tail}"


def main(argv: list[str] | None = None, runner: Callable[[str], Run] = run_command) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="NAME", help=f"some of: {', '.join(BY_NAME)}")
    ap.add_argument("--dry-run", action="store_true", help="print the table it would write; README.md untouched")
    ap.add_argument("--list", action="store_true", help="the measurements and their commands")
    ap.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for m in MEASUREMENTS:
            print(f"{m.name:17} {m.command}")
        return 0
    text = args.readme.read_text()
    try:
        current_results(text)  # the block exists, before any long run
        new_text = rewrite(text, measure(args.only or list(BY_NAME), runner))
    except MeasureError as err:
        print(f"measure_readme: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(new_text.split(START, 1)[1].split(END, 1)[0].strip())
    else:
        args.readme.write_text(new_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
