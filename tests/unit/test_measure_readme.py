"""scripts/measure_readme.py: README.md's "Measured" rows come from the script. The commands are
not run here (the suite among them): a fake runner hands the readers output in the formats the
benchmarks and pytest print, and the real README's block is checked against the script's rows."""

from __future__ import annotations

import datetime
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("measure_readme", ROOT / "scripts" / "measure_readme.py")
mr = sys.modules.setdefault("measure_readme", importlib.util.module_from_spec(_spec))  # dataclasses look it up
_spec.loader.exec_module(mr)

DAY = datetime.date(2026, 12, 3)
OUTPUTS = {  # one output per command, in the formats the scripts print (their print() calls)
    "python benchmark/bench_lower.py": "lowering 4096x4096x4096 fp16 direct-global GEMM, 15 alternated repeats\n"
                                       "  plugin   median    108.5 ms\n  in-tree  median     83.5 ms\n  ratio plugin / in-tree = 1.30x\n",
    "python benchmark/bench_emulator.py": "compile cold (runtime + kernel):    1.712 s\ncompile cached (disk)          :     1.21 ms\n"
                                          "plugin-generated 1024^3 fp16 direct-global GEMM (lower 0.31 s): best 0.390 s, median 0.401 s, max |err| 0.0156 (fp16 output)\n",
    "python benchmark/bench_gemm.py --dry-run --out /tmp/bench": "[1/3] a\n[2/3] b\n[3/3] c\nplugin result not verified: c: error x\n",
    "TILELANG_METAL_PROPERTY_N=200 pytest -rP tests/slow/test_property_gemm.py":
        "property test (seed 0, shard 0 of 2: 100 of 200 configs): ok=98 refused=2 wrong=0\n"
        "property test (seed 0, shard 1 of 2: 100 of 200 configs): ok=99 refused=1 wrong=0\n",
    "TILELANG_METAL_PROPERTY_IDIOMS_N=60 pytest -s tests/slow/test_property_idioms.py":
        "idiom property test (seed 0, shard 0 of 1: 60 of 60 configs): ok=59 refused=0 wrong=1\n",
    "TILELANG_METAL_ADVERSARIAL_SCALE=4 pytest tests/slow/test_adversarial.py": "===== 13 passed in 301.20s (0:05:01) =====\n",
    "bash scripts/test.sh --quick": "....  [100%]\n1515 passed, 3 skipped in 78.40s (0:01:18)\n",  # -q: no rules
    "bash scripts/test.sh": "===== 1756 passed in 548.10s (0:09:08) =====\n",
    "bash scripts/test.sh --racecheck": "===== 946 passed, 13 skipped in 136.00s (0:02:16) =====\n",
}


def fake_runner(calls: list[str]):
    def run(command: str):
        calls.append(command)
        return mr.Run(OUTPUTS[command], 125.0, 0)
    return run


def test_every_command_is_read_into_a_dated_result():
    calls: list[str] = []
    results = mr.measure(list(mr.BY_NAME), fake_runner(calls), today=DAY)
    assert sorted(calls) == sorted(set(calls)) == sorted(OUTPUTS)  # bench_emulator runs once for its two rows
    assert results == {
        "lower": f"108.5 ms / 83.5 ms = **{108.5 / 83.5:.2f}x** (2026-12-03)",
        "emulator": "**0.390 s** (goal <= 5 s) (2026-12-03)",
        "emulator-compile": "1.7 s / 1.2 ms (2026-12-03)",
        "bench-gemm": "2/3 plugin results verified against fp32 in 2 min 5 s (timings mean nothing) (2026-12-03)",
        "property-gemm": f"{98 + 99} match torch, {2 + 1} refused, **0 wrong** (2 min 5 s) (2026-12-03)",
        "property-idioms": "59 match torch, 0 refused, **1 wrong** (2 min 5 s) (2026-12-03)",
        "adversarial": "13 passed in 5 min 1 s (2026-12-03)",
        "quick": "1515 passed, 3 skipped in 1 min 18 s (2026-12-03)",
        "suite": "1756 passed in 9 min 8 s (2026-12-03)",
        "racecheck": "946 passed, 13 skipped in 2 min 16 s (2026-12-03)",
    }


def test_rewrite_replaces_the_rows_measured_and_keeps_the_others(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    before = mr.current_results(readme.read_text())
    assert mr.main(["--readme", str(readme), "--only", "lower", "quick"], runner=fake_runner([])) == 0
    after = mr.current_results(readme.read_text())
    assert after.keys() == before.keys()
    changed = {what for what in after if after[what] != before[what]}
    assert changed == {mr.BY_NAME["lower"].what, mr.BY_NAME["quick"].what}
    assert after[mr.BY_NAME["quick"].what].startswith("1515 passed, 3 skipped in 1 min 18 s (")
    outside = lambda text: text.split(mr.START)[0] + text.split(mr.END)[1]  # noqa: E731
    assert outside(readme.read_text()) == outside((ROOT / "README.md").read_text())


def test_dry_run_prints_and_a_failed_command_stops_it(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    assert mr.main(["--readme", str(readme), "--dry-run", "--only", "suite"], runner=fake_runner([])) == 0
    assert "| 1756 passed in 9 min 8 s (" in capsys.readouterr().out
    assert readme.read_text() == (ROOT / "README.md").read_text()
    failing = lambda command: mr.Run("E   boom\n", 1.0, 1)  # noqa: E731
    assert mr.main(["--readme", str(readme), "--only", "suite"], runner=failing) == 1
    assert "bash scripts/test.sh exited with status 1" in capsys.readouterr().err
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_output_without_the_reported_line_is_an_error():
    with pytest.raises(mr.MeasureError, match="bench_lower: no line matching"):
        mr.read_lower(mr.Run("lowering ... \n", 1.0, 0))


def test_readme_block_has_one_dated_row_per_measurement():
    results = mr.current_results((ROOT / "README.md").read_text())
    assert list(results) == [m.what for m in mr.MEASUREMENTS]
    for what, result in results.items():
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", result), f"{what}: the result says when it was measured"
