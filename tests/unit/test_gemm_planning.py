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


def _package_imports() -> dict[str, set[str]]:
    """Folder below tilelang_metal -> the other folders its modules import (inside functions too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if len(rel) < 2:
            continue  # root modules are not a folder
        here = rel[:-1]
        targets = graph.setdefault(rel[0], set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                module = base + (tuple(node.module.split(".")) if node.module else ())
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilelang_metal."):
                module = tuple(node.module.split(".")[1:])
            else:
                continue
            if module and module[0] != rel[0] and (PACKAGE / module[0]).is_dir():
                targets.add(module[0])
    return graph


def test_folders_import_each_other_in_one_direction():
    """The transforms read GemmMetal's records (its guard marks, the edge split's branch); GemmMetal
    reads nothing of the transforms: the decisions that need the whole kernel reach it through the
    plan. No folder reaches back to one that imports it, around any loop."""
    graph = _package_imports()
    assert "gemm" in graph.get("transform", set()), "the check lost its subject: transform no longer imports gemm"

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            folder = todo.pop()
            if folder == goal:
                return True
            if folder not in seen:
                seen.add(folder)
                todo.extend(graph.get(folder, ()))
        return False

    back = [f"{a} imports {b}, and {b} reaches {a}" for a, targets in sorted(graph.items()) for b in sorted(targets) if reaches(b, a)]
    assert not back, "folders that import each other (move what both need to the lower one):\n" + "\n".join(back)


# Context held beside the IR, by module, with why it may stay: nothing of the plugin's passes
# passes decisions to another pass this way (they go on the IR: the plans on the T.gemm calls,
# the decisions and options on the function).
CONTEXT_ALLOWED = {
    "config.py": "current_options(): the lowering's options for tilelang's C++ callbacks (GEMM hooks) and the "
    "codegen hook's printer, set around the pipeline and the codegen only",
    "autoload.py": "the import hook's re-entrancy guard (no lowering)",
}


def test_no_thread_local_or_context_variable_between_passes():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
                if name == "ContextVar" or (name == "local" and owner == "threading"):
                    found.append(("/".join(path.relative_to(PACKAGE).parts), node.lineno))
    outside = [f"{file}:{line}" for file, line in found if file not in CONTEXT_ALLOWED]
    assert not outside, "thread-local / context variables outside the allowed boundary (record on the IR instead):\n" + "\n".join(outside)
    stale = sorted(set(CONTEXT_ALLOWED) - {file for file, _ in found})
    assert not stale, f"CONTEXT_ALLOWED lists modules that hold no such variable any more: {stale}"
