"""One host boundary: outside `tilelang_metal/host/`, no module names a tilelang / TVM op or IR node
(`"tl.*"`, `"tirx.*"`, `"tir.*"`, `"s_tir.*"` literals), looks up a host op or FFI global
(`Op.get`, `get_global_func`, `register_global_func`), or imports TVM, its FFI or tilelang's internals
(`import tilelang` and `import tilelang.language` are tilelang's public API and stay allowed). A
tilelang upgrade then touches `host/` only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"
HOST = PACKAGE / "host"
HOST_NAME = re.compile(r"^(tl|tirx|tir|s_tir)\.[A-Za-z_]")
HOST_LOOKUPS = {"get_global_func", "register_global_func", "register_func"}
PUBLIC_TILELANG = {"tilelang", "tilelang.language"}


def _outside_host() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if HOST not in p.parents]


def _root(node: ast.AST) -> str:
    """The name an attribute chain starts from (`tvm` for `tvm.ir.Op.get`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    in_fstring = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for sub in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring and HOST_NAME.match(node.value):
            found.append(f"{where}: host name literal {node.value!r} (declare it in host/vocab.py)")
        elif isinstance(node, ast.Attribute) and ((node.attr in HOST_LOOKUPS and _root(node) in ("tvm", "tvm_ffi"))
                                                  or (node.attr == "get" and isinstance(node.value, ast.Attribute) and node.value.attr == "Op")):
            found.append(f"{where}: host lookup .{node.attr} (go through host/)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in ("tvm", "tvm_ffi") or (root == "tilelang" and alias.name not in PUBLIC_TILELANG):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if root in ("tvm", "tvm_ffi") or (root == "tilelang" and node.module not in PUBLIC_TILELANG):
                found.append(f"{where}: from {node.module} import ...")
            elif node.module == "tilelang" and any(a.name == "tvm" for a in node.names):
                found.append(f"{where}: from tilelang import tvm")
    return found


def test_no_host_internals_outside_the_host_package():
    found = [v for path in _outside_host() for v in _violations(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_of_violation(tmp_path):
    bad = tmp_path / "tilelang_metal" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "import tvm\nfrom tilelang.backend.module import BackendModule\nfrom tilelang import tvm as t\n"
        "X = 'tirx.For'\nY = 'tl.tileop.gemm'\nf = t.ir.Op.get('x')\ng = tvm_ffi.get_global_func\nok = 'tilelang_metal.codegen.build'\n"
        "h = host.get_global_func('tilelang_metal.codegen.build')\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "tilelang_metal"
    try:
        found = _violations(bad)
    finally:
        PACKAGE = saved
    kinds = sorted(line.split(": ", 1)[1] for line in found)  # ast.walk is breadth first: compare as sets
    assert kinds == sorted([
        "import tvm",
        "from tilelang.backend.module import ...",
        "from tilelang import tvm",
        "host name literal 'tirx.For' (declare it in host/vocab.py)",
        "host name literal 'tl.tileop.gemm' (declare it in host/vocab.py)",
        "host lookup .get (go through host/)",
        "host lookup .get_global_func (go through host/)",
    ])


def test_the_host_package_is_where_the_names_are():
    vocab = (HOST / "vocab.py").read_text()
    assert '"tirx.tvm_storage_sync"' in vocab and '"tl.tileop.gemm"' in vocab
