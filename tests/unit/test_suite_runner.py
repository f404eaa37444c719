"""The suite's own start-up costs (issue 34 item 6): scripts/test.sh and tests/conftest.py.

scripts/test.sh runs against a stand-in virtualenv whose `python` prints what it was given, so
nothing is installed or collected here."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
suite_conftest = importlib.util.module_from_spec(_spec)  # by path: three conftest.py share one name
_spec.loader.exec_module(suite_conftest)


def _run_test_sh(tmp_path: Path, env_overrides: dict[str, str], *args: str) -> str:
    """stdout of `bash scripts/test.sh ARGS` with a stand-in venv (setup_env.sh sees it installed)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\necho "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"\necho "$@"\n')
    python.chmod(0o755)
    stamp = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints" / "linux-cpu.txt").read_bytes())
    (venv / ".tilelang_metal-installed").write_text(stamp.hexdigest() + "\n")
    env = {**os.environ, "TILELANG_METAL_VENV": str(venv), "TILELANG_METAL_INSTALL_CLANG": "0", **env_overrides}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_test_sh_caches_bytecode_even_when_the_environment_turns_it_off(tmp_path):
    # Without .pyc files every process of a run (controller, workers, the `python -c` some tests
    # start) compiles tilelang_metal again and pytest rewrites every test module's asserts again.
    out = _run_test_sh(tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"}, "--quick")
    assert out.splitlines()[0] == "PYTHONDONTWRITEBYTECODE=unset"
    assert "-m not slow" in out  # the stand-in saw the real command line


class _Config:
    """The parts of pytest.Config that _is_xdist_controller reads."""

    def __init__(self, worker: bool = False, **options):
        if worker:
            self.workerinput = {"workerid": "gw0"}
        self._options = options

    def getoption(self, name, default=None):
        return self._options.get(name, default)


@pytest.mark.parametrize(
    ("config", "controller"),
    [
        (_Config(dist="worksteal", tx=["popen", "popen"], collectonly=False), True),  # scripts/test.sh
        (_Config(worker=True, dist="worksteal", tx=["popen", "popen"], collectonly=False), False),
        (_Config(dist="no", tx=[], collectonly=False), False),  # -n 0 (TILELANG_METAL_TEST_WORKERS=0)
        (_Config(collectonly=False), False),  # -p no:xdist: no such options
        (_Config(dist="load", tx=["popen"], collectonly=True), False),  # xdist collects in-process
    ],
)
def test_only_the_xdist_controller_skips_importing_the_plugin(config, controller):
    assert suite_conftest._is_xdist_controller(config) is controller
