"""tilelang_metal.config: one typed accessor per TILELANG_METAL_* setting, validation, docs table."""

import ast
import re
import shutil
from pathlib import Path

import pytest
from gemm_support import lower_source

import tilelang_metal
from tilelang_metal import config
from tilelang_metal import kernels as E
from tilelang_metal.errors import ConfigError

PACKAGE = Path(tilelang_metal.__file__).resolve().parent
DOC = PACKAGE.parent / "docs" / "configuration.md"

ACCESSORS = {
    "AUTOLOAD": config.autoload,
    "FRAGMENT_CT": config.fragment_ct,
    "STAGING_BYPASS": config.staging_bypass,
    "K_PREFETCH": config.k_prefetch,
    "REGISTER_STAGING": config.register_staging,
    "RELAXED_PRECISION": config.relaxed_precision,
    "PRECISE_MATH": config.precise_math,
    "DEBUG": config.debug,
    "LOWERING_CACHE": config.lowering_cache,
    "EMULATOR_CACHE": config.emulator_cache,
    "EMULATOR_CACHE_MB": config.emulator_cache_mb,
    "EMULATOR_CXX": config.emulator_cxx,
    "EMULATOR_FIBERS": config.emulator_fibers,
    "EMULATOR_WORKERS": config.emulator_workers,
    "EMULATOR_STACK_KB": config.emulator_stack_kb,
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_setting_has_an_accessor():
    assert {config.PREFIX + short for short in ACCESSORS} == set(config.SETTINGS)


def test_defaults(clean_env):
    assert config.autoload() is True
    assert config.fragment_ct() is True
    assert config.register_staging() is True
    assert config.debug() is False
    assert config.lowering_cache() is None
    assert config.emulator_cache() == Path.home() / ".cache" / "tilelang_metal" / "emulator"
    assert config.emulator_cxx() == ("clang++-19" if shutil.which("clang++-19") else "g++")
    assert config.emulator_fibers() == "native"
    assert config.emulator_workers() is None
    assert config.emulator_stack_kb() == 0
    assert config.emulator_cache_mb() == 1024


def test_blank_means_default(clean_env):
    clean_env.setenv("TILELANG_METAL_FRAGMENT_CT", "  ")
    clean_env.setenv("TILELANG_METAL_EMULATOR_CXX", "")
    assert config.fragment_ct() is True and config.emulator_cxx() in config.PREFERRED_CXX


@pytest.mark.parametrize("text,value", [("0", False), ("1", True), ("off", False), ("TRUE", True), (" no ", False), ("Yes", True)])
def test_flags_accept_the_usual_spellings(clean_env, text, value):
    clean_env.setenv("TILELANG_METAL_FRAGMENT_CT", text)
    clean_env.setenv("TILELANG_METAL_DEBUG", text)
    assert config.fragment_ct() is value and config.debug() is value


@pytest.mark.parametrize(
    "short,value,allowed",
    [
        ("AUTOLOAD", "maybe", "0 or 1"),
        ("FRAGMENT_CT", "2", "0 or 1"),
        ("DEBUG", "verbose", "0 or 1"),
        ("EMULATOR_FIBERS", "green", "native or portable"),
        ("EMULATOR_WORKERS", "0", "integer >= 1"),
        ("EMULATOR_WORKERS", "four", "integer >= 1"),
        ("EMULATOR_STACK_KB", "-8", "integer >= 0"),
        ("EMULATOR_STACK_KB", "1.5", "integer >= 0"),
        ("EMULATOR_CACHE_MB", "0", "integer >= 1"),
        ("RELAXED_PRECISION", "fp16", "auto, 0 or 1"),
        ("PRECISE_MATH", "fast", "0 or 1"),
    ],
)
def test_bad_values_give_one_line_naming_variable_and_allowed_values(clean_env, short, value, allowed):
    name = config.PREFIX + short
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        ACCESSORS[short]()
    text = str(info.value)
    assert "\n" not in text
    assert name in text and repr(value.strip()) in text and allowed in text


def test_settings_are_read_per_call(clean_env):
    assert config.emulator_workers() is None
    clean_env.setenv("TILELANG_METAL_EMULATOR_WORKERS", "3")
    assert config.emulator_workers() == 3
    clean_env.setenv("TILELANG_METAL_EMULATOR_STACK_KB", "512")
    assert config.emulator_stack_kb() == 512
    clean_env.setenv("TILELANG_METAL_EMULATOR_CACHE", "~/somewhere")
    assert config.emulator_cache() == Path.home() / "somewhere"


def test_no_environment_reads_outside_config():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], "read settings through tilelang_metal.config: " + ", ".join(offenders)


def test_documented_table_matches_the_settings():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`TILELANG_METAL_"):
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(config.SETTINGS)
    for name, setting in config.SETTINGS.items():
        _, default, _, codegen = rows[name]
        assert setting.default in default.replace("`", ""), (name, default)
        assert codegen == ("yes" if setting.changes_codegen else "no"), name


def test_bad_fragment_ct_fails_at_lower_time_with_its_own_type(monkeypatch, metal4):
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "sometimes")
    with pytest.raises(ConfigError, match=re.escape("TILELANG_METAL_FRAGMENT_CT='sometimes' is not valid")):
        lower_source(E.gemm_shared(64, 64, 32), metal4)
