"""The package's import graph follows its layers: foundation (errors, version, config, target/limits) 
host < compiler < emulator < execution < kernels < cli / autotune and the wiring (plugin.py,
autoload.py). A module imports only from its own layer or lower ones (imports inside functions
included), so the compiler never reaches for the ready kernels and the emulator never for the
execution adapters. No two modules import each other, directly or around a loop, no module grows
past MAX_MODULE_LINES or shares its name with a module in another folder, and the package root holds
at most MAX_ROOT_MODULES modules (the public surface and the wiring; the rest lives in a subpackage
by role)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"

# module path below tilelang_metal (a subpackage's module, or else its first component) -> layer;
# anything not listed is the compiler layer
LAYERS = {
    "errors": -1, "version": -1, "config": -1, "target.limits": -1,  # foundation: import nothing of the host
    "host": 0,
    "emulator": 2, "execution": 3, "kernels": 4,
    "cli": 5, "tuning.autotune": 5, "__main__": 5, "plugin": 5, "autoload": 5,  # the top: wiring and front ends
}
COMPILER = 1
NAMES = {-1: "foundation", 0: "host", 1: "compiler", 2: "emulator", 3: "execution", 4: "kernels", 5: "cli / autotune / wiring"}


def layer_of(parts: tuple[str, ...]) -> int:
    names = tuple(p.removesuffix(".py") for p in parts)
    return LAYERS.get(".".join(names[:2]), LAYERS.get(names[0] if names else "", COMPILER))


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


def _module_name(parts: tuple[str, ...]) -> str:
    """Dotted name below tilelang_metal of a file's path parts (a package is its `__init__.py`)."""
    parts = tuple(p.removesuffix(".py") for p in parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)  # the package root: ""


MODULES = {_module_name(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*.py")}


def _module_imports(path: Path) -> set[str]:
    """The package's modules `path` imports, inside functions too: `from .a import b` is module a.b
    when that is a module, else a (the package `__init__` a submodule's import runs on the way is not
    counted: it is the package's wiring, not this module's dependency)."""
    here = path.relative_to(PACKAGE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                module = ".".join(here[: len(here) - (node.level - 1)] + (tuple(node.module.split(".")) if node.module else ()))
            elif node.module and node.module.split(".")[0] == "tilelang_metal":
                module = ".".join(node.module.split(".")[1:])
            else:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                found.add(sub if sub in MODULES else module)
        elif isinstance(node, ast.Import):
            found |= {".".join(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == "tilelang_metal"}
    return found & MODULES


# Cycles are looked for over every import, those inside functions included: a deferred import is a
# dependency all the same (it runs on the first call), and deferring is how a cycle hides (before
# the MSL type sizes moved to dtypes.py, emulator/access_marks.py and emulator/signature.py imported
# each other that way). Each allowed edge says why it must point back up.
CYCLE_EXCEPTIONS = {
    ("emulator.instrument", "emulator"): "the instrumented launches call the package's compile_kernel, so a wrapper "
    "installed on tilelang_metal.emulator.compile_kernel (tests/conftest.py records every build) sees their builds too",
}


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of size > 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_import_graph_has_no_cycle():
    graph = {_module_name(p.relative_to(PACKAGE).parts): _module_imports(p) for p in PACKAGE.rglob("*.py")}
    for v, targets in graph.items():
        targets.discard(v)
    stale = [edge for edge in CYCLE_EXCEPTIONS if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"CYCLE_EXCEPTIONS lists imports that no longer exist: {stale}"
    for source, target in CYCLE_EXCEPTIONS:
        graph[source].discard(target)
    cycles = _strongly_connected(graph)
    described = [" <-> ".join(c) + ": " + "; ".join(f"{v} imports {', '.join(sorted(graph[v] & set(c)))}" for v in c) for c in cycles]
    assert not cycles, "modules that import each other (around a loop):\n" + "\n".join(described)


MAX_MODULE_LINES = 700
# A module over the limit, with the reason it is not split yet (the test fails once it is back under).
LONG_MODULES: dict[str, str] = {}


def test_no_module_is_longer_than_the_limit():
    lines = {"/".join(p.relative_to(PACKAGE).parts): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = [f"{name}: {n} lines" for name, n in sorted(lines.items()) if n > MAX_MODULE_LINES and name not in LONG_MODULES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by role):\n" + "\n".join(long)
    back = [name for name in LONG_MODULES if lines.get(name, 0) <= MAX_MODULE_LINES]
    assert not back, f"LONG_MODULES lists modules now within {MAX_MODULE_LINES} lines (or gone): {back}"


# Names that mean the same role in each package that has one.
SHARED_NAMES = {"errors": "a package's own exception classes", "version": "a package's own version"}


def test_no_module_name_is_used_in_two_folders():
    """A module's name says what it is wherever it is read (an import, a traceback, the docs):
    no two folders hold modules of one name, singular or plural (shuffle_width / shuffle_widths)."""
    folders: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        stem = path.stem.removesuffix("s")
        if path.stem != "__init__" and path.stem not in SHARED_NAMES:
            folders.setdefault(stem, set()).add("/".join(path.relative_to(PACKAGE).parts))
    clashes = [" / ".join(sorted(paths)) for paths in folders.values() if len(paths) > 1]
    assert not clashes, "module names used in more than one folder (rename by role):\n" + "\n".join(sorted(clashes))


# The root keeps the public surface (__init__, errors, version, config), the entry points (__main__,
# cli) and the wiring (autoload, plugin, pipeline, selection, lowering_cache); every other module
# goes to the subpackage of its role (target/, core/, performance/, ...: docs/architecture.md).
MAX_ROOT_MODULES = 12


def test_package_root_holds_at_most_the_limit():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, (f"{len(root)} modules at the package root (at most {MAX_ROOT_MODULES}; move the "
                                           f"new one into the subpackage of its role): {', '.join(root)}")
