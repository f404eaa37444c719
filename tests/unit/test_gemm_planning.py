"""Each T.gemm is planned in one place (tilelang_metal/planning.py): no other module selects an
instruction itself, so GemmMetal, the analyses before layout inference, the register budget, the
autotuner and the cost model cannot disagree on a tiling."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"


def _calls_of(name: str) -> list[str]:
    """file:line of every call of a function named `name` (plain or as an attribute) in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called == name:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_select_inst_has_one_caller():
    callers = _calls_of("select_inst")
    outside = [c for c in callers if not c.startswith("planning.py:")]
    assert callers and not outside, "select_inst is called outside planning.plan_gemm (ask the plan instead):\n" + "\n".join(outside)
