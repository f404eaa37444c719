"""tilelang_metal.config's LoweringOptions: one frozen LoweringOptions per lowering, read from the settings once; its
key is the plugin's part of the kernel identity; --explain reads the lowering's decisions from the IR."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tilelang

import tilelang_metal
from tilelang_metal import config
from tilelang_metal import kernels as E
from tilelang_metal.host import resolve_target
from tilelang_metal.host.passes import pass_context
from tilelang_metal.core.ir_attrs import DECISIONS_ATTR
from tilelang_metal.config import OPTIONS_ATTR, LoweringOptions, current_options, lowering, stamped

PACKAGE = Path(tilelang_metal.__file__).resolve().parent

# The config accessors of settings that change lowering or printing: only LoweringOptions.from_settings calls them.
LOWERING_ACCESSORS = {
    "fragment_ct", "staging_bypass", "k_prefetch_mode", "k_prefetch", "register_staging_mode", "register_staging",
    "relaxed_precision", "precise_math", "debug",
}

@pytest.fixture
def clean_env(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _setting_reads(path: Path) -> list[str]:
    """Where `path` reads a lowering setting: `config.<accessor>` (called or passed on) or an accessor
    imported from config."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in LOWERING_ACCESSORS and isinstance(node.value, ast.Name) and node.value.id == "config":
            found.append(f"{node.lineno}: config.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "config":
            found += [f"{node.lineno}: from config import {a.name}" for a in node.names if a.name in LOWERING_ACCESSORS]
    return found


def test_no_module_reads_a_lowering_setting_outside_options():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name == "config.py":
            continue
        offenders += [f"{path.relative_to(PACKAGE)}:{where}" for where in _setting_reads(path)]
    assert offenders == [], "take lowering settings from the LoweringOptions passed in or current_options(): " + ", ".join(offenders)


def test_the_ast_check_sees_a_setting_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from .. import config\nfrom ..config import LoweringOptions, staging_bypass\n\n"
                   "def f():\n    return config.fragment_ct() and config.split_pass_configs({})\n")
    found = sorted(w.split(": ")[1] for w in _setting_reads(bad))
    assert found == ["config.fragment_ct", "from config import staging_bypass"]


def test_codegen_fields_are_exactly_the_settings_that_change_codegen(clean_env):
    from tilelang_metal.config import CODEGEN_SETTINGS

    changing = {s.name for s in config.SETTINGS.values() if s.changes_codegen}
    assert set(LoweringOptions.from_settings().codegen_items()) == set(CODEGEN_SETTINGS.values()) == changing
    assert LoweringOptions.from_settings() == LoweringOptions()  # the dataclass defaults are the documented ones


def test_options_are_frozen_and_keyed_by_what_changes_code(clean_env):
    default = LoweringOptions.from_settings()
    with pytest.raises(AttributeError):
        default.fragment_ct = False  # type: ignore[misc]
    keys = {default.key()}
    for name, value in [("FRAGMENT_CT", "0"), ("STAGING_BYPASS", "0"), ("K_PREFETCH", "force"), ("REGISTER_STAGING", "0"),
                        ("RELAXED_PRECISION", "1"), ("PRECISE_MATH", "1")]:
        clean_env.setenv(config.PREFIX + name, value)
        keys.add(LoweringOptions.from_settings().key())
        clean_env.delenv(config.PREFIX + name)
    assert len(keys) == 7  # every codegen setting moves the key
    clean_env.setenv(config.PREFIX + "DEBUG", "1")
    assert LoweringOptions.from_settings().debug and LoweringOptions.from_settings().key() == default.key()  # logging only
    assert LoweringOptions.from_json(default.to_json()) == default


def test_pass_configs_win_over_the_settings(clean_env):
    clean_env.setenv(config.PREFIX + "PRECISE_MATH", "1")
    clean_env.setenv(config.PREFIX + "RELAXED_PRECISION", "0")
    chosen = LoweringOptions.from_settings({config.PRECISE_MATH: False, config.RELAXED_PRECISION: True, "tl.disable_tma_lower": True})
    assert (chosen.precise_math, chosen.relaxed_precision) == (False, "on")
    assert chosen.matmul_relaxed("float32", "float32") and not LoweringOptions().matmul_relaxed("float32", "float32")


def test_current_options_outside_a_lowering_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no Metal lowering in progress"):
        current_options()
    chosen = LoweringOptions(precise_math=True)
    with lowering(chosen):
        assert current_options() is chosen


def _artifact(func, target):
    with pass_context(), resolve_target(target) as t:
        return tilelang.lower(func, target=t)


def _functions(artifact):
    return [f for mod in (artifact.host_mod, artifact.device_mod) for f in mod.functions.values()]


def _kernel():  # a fragment accumulator and a float32 math epilogue: FRAGMENT_CT and PRECISE_MATH both show in the MSL
    return E.gemm_shared(64, 64, 32, epilogue="silu", out_dtype="float32")


def test_two_lowerings_under_different_settings_carry_different_options(clean_env):
    on = _artifact(_kernel(), E.metal4_target())
    clean_env.setenv(config.PREFIX + "FRAGMENT_CT", "0")
    off = _artifact(_kernel(), E.metal4_target())
    on_options, off_options = stamped(_functions(on)), stamped(_functions(off))
    assert on_options == LoweringOptions() and off_options == LoweringOptions(fragment_ct=False)
    assert on_options.key() != off_options.key()
    assert "matmul2d" in on.kernel_source and "matmul2d" not in off.kernel_source
    assert all(OPTIONS_ATTR in f.attrs for f in off.device_mod.functions.values())


def test_a_setting_changed_during_the_lowering_changes_nothing(clean_env):
    """The settings are read once, before the passes: a variable set from inside the GEMM hook that
    LayoutInference calls (before LowerTileOp, the printer) does not reach the result."""
    from tilelang_metal import gemm

    baseline = _artifact(_kernel(), E.metal4_target())
    original = gemm.infer_layout
    calls = []

    def infer_layout_then_change_settings(*args):
        calls.append(1)
        for name, value in [("FRAGMENT_CT", "0"), ("PRECISE_MATH", "1"), ("RELAXED_PRECISION", "0"), ("K_PREFETCH", "force"), ("REGISTER_STAGING", "0")]:
            clean_env.setenv(config.PREFIX + name, value)
        return original(*args)

    clean_env.setattr(gemm, "infer_layout", infer_layout_then_change_settings)
    changed = _artifact(_kernel(), E.metal4_target())
    assert calls, "the hook did not run"
    assert changed.kernel_source == baseline.kernel_source
    assert stamped(_functions(changed)) == LoweringOptions()
    # the next lowering reads the new settings
    clean_env.setattr(gemm, "infer_layout", original)
    after = _artifact(_kernel(), E.metal4_target())
    assert after.kernel_source != baseline.kernel_source and "metal::precise::" in after.kernel_source


def test_explain_prints_the_decisions_recorded_on_the_ir(capsys):
    """`lower --explain` prints the decisions attribute of the lowered module, nothing kept aside."""
    from tilelang_metal import cli

    artifact = _artifact(E.gemm_shared(64, 64, 32), E.metal4_target())
    on_ir = [str(t) for f in _functions(artifact) if f.attrs is not None and DECISIONS_ATTR in f.attrs for t in f.attrs[DECISIONS_ATTR]]
    assert any(t.startswith("shared staging bypass: T.gemm(A_s, B_s, C_acc)") for t in on_ir), on_ir
    assert any(t.startswith("T.gemm 64x64x32 ") and "direct_global" in t for t in on_ir), on_ir
    assert not any("tilelang_metal.decision" in str(f) for f in artifact.device_mod.functions.values())  # the marks are gone

    assert cli.main(["lower", "--explain", "--path", "shared", "--target", "metal4", "--m", "64", "--n", "64", "--k", "32"]) in (0, None)
    printed = [line[3:] for line in capsys.readouterr().out.splitlines() if line.startswith("// ") and not line.startswith("// tilelang_metal")]
    assert printed == list(dict.fromkeys(on_ir))


def test_one_compile_builds_its_options_once(clean_env, tmp_path):
    """tilelang.compile with tilelang's kernel cache on: the cache key, the lowering and the printer
    share one LoweringOptions, so a variable changed in between cannot split them."""
    from tilelang import env

    built = []
    from_settings = LoweringOptions.from_settings.__func__

    def counting(cls, pass_configs=None):
        built.append(pass_configs)
        return from_settings(cls, pass_configs)

    clean_env.setattr(config.LoweringOptions, "from_settings", classmethod(counting))
    clean_env.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    clean_env.setenv("TILELANG_DISABLE_CACHE", "0")
    was_enabled = env.is_cache_enabled()
    env.enable_cache()
    try:
        kernel = tilelang.compile(E.gemm_shared(64, 64, 32), out_idx=[-1], target=E.metal4_target(), execution_backend="emulator",
                                  pass_configs={config.PRECISE_MATH: True})
    finally:
        (env.enable_cache if was_enabled else env.disable_cache)()
    assert len(built) == 1 and dict(built[0]) == {config.PRECISE_MATH: True}
    assert stamped(kernel.artifact.device_mod.functions.values()) == LoweringOptions(precise_math=True)
