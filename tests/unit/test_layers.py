"""The package's import graph follows its layers: foundation (errors, version, config, limits) < host <
compiler < emulator < execution < kernels < cli / autotune and the wiring (plugin.py, autoload.py). A module imports only from its own layer or lower ones (imports inside functions
included), so the compiler never reaches for the ready kernels and the emulator never for the
execution adapters."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"

# first path component below tilelang_metal -> layer; anything not listed is the compiler layer
LAYERS = {
    "errors": -1, "version": -1, "config": -1, "limits": -1,  # foundation: import nothing of the host
    "host": 0,
    "emulator": 2, "execution": 3, "kernels": 4,
    "cli": 5, "autotune": 5, "__main__": 5, "plugin": 5, "autoload": 5,  # the top: wiring and front ends
}
COMPILER = 1
NAMES = {-1: "foundation", 0: "host", 1: "compiler", 2: "emulator", 3: "execution", 4: "kernels", 5: "cli / autotune / wiring"}


def layer_of(parts: tuple[str, ...]) -> int:
    head = parts[0].removesuffix(".py") if parts else ""
    return LAYERS.get(head, COMPILER)


def _imported(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module path below tilelang_metal) of every import of the package's own modules."""
    here = path.relative_to(PACKAGE).parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                mod = tuple(node.module.split(".")) if node.module else ()
                targets = [base + mod] if mod else [base + (a.name,) for a in node.names]
            elif node.module and node.module.split(".")[0] == "tilelang_metal":
                mod = tuple(node.module.split(".")[1:])
                targets = [mod] if mod else [(a.name,) for a in node.names]
            else:
                continue
            found += [(node.lineno, t) for t in targets]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, tuple(a.name.split(".")[1:])) for a in node.names if a.name.split(".")[0] == "tilelang_metal"]
    return found


def test_no_module_imports_from_a_higher_layer():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if rel == ("__init__.py",):
            continue  # the package's front door re-exports from every layer
        mine = layer_of(rel)
        for line, target in _imported(path):
            theirs = layer_of(target)
            if target and theirs > mine:
                wrong.append(f"{'/'.join(rel)}:{line} ({NAMES[mine]}) imports {'.'.join(target)} ({NAMES[theirs]})")
    assert not wrong, "\n".join(wrong)


# The printer spells decisions the passes recorded on the IR; it takes none itself, so it reads no
# pass module (shared attribute keys live in ir_attrs.py, plugin intrinsics in intrinsics.py).
PASS_PACKAGES = ("transform", "gemm", "legalize", "pipeline", "ops")


def test_codegen_imports_no_pass_module():
    wrong = []
    for path in sorted((PACKAGE / "codegen").rglob("*.py")):
        for line, target in _imported(path):
            if target and target[0].removesuffix(".py") in PASS_PACKAGES:
                wrong.append(f"codegen/{path.name}:{line} imports {'.'.join(target)}")
    assert not wrong, "codegen must read records from ir_attrs / intrinsics, not pass modules:\n" + "\n".join(wrong)
