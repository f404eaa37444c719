"""tilelang_metal.target.capabilities: a target's capabilities are derived in one place, from its keys, once.

Every other module reads a `TargetCapabilities`; none reads a Target's keys or re-derives Metal 4
support itself (an AST scan of the package), and the names of the concepts are not doubled."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tilelang_metal  # noqa: F401
from tilelang_metal.target import isa, limits
from tilelang_metal.target.capabilities import TargetCapabilities, capabilities_of, capabilities_with, resolve_capabilities
from tilelang_metal.target.normalize import metal4_target, plain_metal_target

PACKAGE = Path(__file__).resolve().parents[2] / "tilelang_metal"
THE_MODULE = PACKAGE / "target" / "capabilities.py"
# Functions that re-derived capabilities before capabilities_of; none may come back under another module.
RETIRED = {"has_metal4", "_has_metal4", "target_features", "_features", "features_of"}


def _capability_reads(path: Path) -> list[str]:
    """`x.keys` read as an attribute (a Target's keys: `dict.keys()` is a call) and calls or definitions
    of the retired derivations, as "file:line what"."""
    tree = ast.parse(path.read_text())
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    rel = path.relative_to(PACKAGE)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "keys" and id(node) not in called:
            found.append(f"{rel}:{node.lineno} reads .keys")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in RETIRED:
            found.append(f"{rel}:{node.lineno} calls a retired derivation")
        elif isinstance(node, ast.FunctionDef) and node.name in RETIRED:
            found.append(f"{rel}:{node.lineno} defines {node.name}")
    return found


def test_only_the_capabilities_module_reads_a_targets_keys():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != THE_MODULE for hit in _capability_reads(path)]
    assert not found, "derive a target's capabilities with capabilities.capabilities_of / resolve_capabilities:\n" + "\n".join(found)


def test_one_name_per_concept():
    """One constant for the Metal 4 key, the simd width and the thread limit, and no constant named
    plain SIMDGROUP / COOPERATIVE whose meaning (an instruction kind or a storage kind) the name does
    not say."""
    assigned: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(str(path.relative_to(PACKAGE)))
    assert "METAL4_KEY" not in assigned and assigned["METAL4_FEATURE"] == ["target/isa.py"]
    assert assigned["SIMD_WIDTH"] == ["target/isa.py"], "import isa.SIMD_WIDTH instead of writing 32 again"
    assert "MAX_THREADS" not in assigned, "import limits.MAX_THREADS_PER_THREADGROUP instead of writing 1024 again"
    for vague in ("SIMDGROUP", "COOPERATIVE", "COOPERATIVE_TENSOR"):
        assert vague not in assigned, f"{vague} assigned in {assigned.get(vague)}: name it by what it is"


def test_capabilities_of_metal_and_metal4_targets():
    metal4, plain = capabilities_of(metal4_target()), capabilities_of(plain_metal_target())
    assert metal4.metal4 and not plain.metal4
    assert isa.METAL4_FEATURE in metal4.features and isa.METAL4_FEATURE not in plain.features
    assert (metal4.msl_version, plain.msl_version) == ("4.0", "3.2")
    assert (metal4.chip_class, plain.chip_class) == ("M5+", "M1-M4")
    assert (metal4.name, plain.name) == ("metal4", "metal")
    for caps in (metal4, plain):
        assert caps.simd_width == isa.SIMD_WIDTH
        assert caps.max_threads_per_threadgroup == limits.MAX_THREADS_PER_THREADGROUP
        assert caps.threadgroup_memory_bytes == limits.THREADGROUP_MEMORY_BYTES
        assert caps.buffer_argument_slots == limits.BUFFER_ARGUMENT_SLOTS
    # derived once per key set: another Target object with the same keys gets the same object
    assert capabilities_of(metal4_target()) is metal4
    assert capabilities_with({"metal", "gpu", "metal4"}) is metal4
    with pytest.raises(AttributeError):
        metal4.features = frozenset()  # frozen


def test_resolve_capabilities_normalizes_public_targets_once():
    metal4 = capabilities_of(metal4_target())
    assert resolve_capabilities(metal4) is metal4
    assert resolve_capabilities(metal4_target()) is metal4
    assert resolve_capabilities({"kind": "metal", "keys": ["metal", "gpu", "metal4"]}) is metal4
    assert resolve_capabilities(None) is resolve_capabilities("metal")  # this host's Metal
    assert isinstance(resolve_capabilities("metal"), TargetCapabilities)
    with pytest.raises(TypeError, match="instead of a bool"):
        resolve_capabilities(True)

