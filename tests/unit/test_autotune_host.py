"""autotune_gemm times candidates on a GPU: without one (no torch MPS, e.g. Linux) it refuses at
once, naming the ranking that works here, instead of letting execution_backend="auto" fall back to
the emulator and time the whole space on the CPU (180 candidates at 4096^3)."""

from __future__ import annotations

import time

import pytest

from tilelang_metal.tuning import autotune
from tilelang_metal.execution import backends


def _never(*args, **kwargs):
    raise AssertionError("autotune_gemm built or enumerated candidates on a host without a GPU")


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_no_gpu_refuses_before_compiling_anything(monkeypatch, backend):
    monkeypatch.setattr(backends, "mps_available", lambda: False)
    monkeypatch.setattr(autotune, "config_space", _never)
    monkeypatch.setattr(autotune, "build", _never)
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        autotune.autotune_gemm(4096, 4096, 4096, execution_backend=backend)
    assert time.perf_counter() - start < 1.0
    text = str(info.value)
    assert "\n" not in text, text
    for needle in ("autotune_gemm(4096, 4096, 4096)", "needs a Mac (torch MPS)", "autotune.rank_by_roofline(", "execution_backend='emulator'"):
        assert needle in text, text


def test_a_given_space_is_refused_too(monkeypatch):
    monkeypatch.setattr(backends, "mps_available", lambda: False)
    monkeypatch.setattr(autotune, "build", _never)
    with pytest.raises(RuntimeError, match="needs a Mac"):
        autotune.autotune_gemm(64, 64, 32, space=[autotune.GemmConfig(autotune.DIRECT_GLOBAL, 32, 32, 128)])


def test_with_a_gpu_the_guard_lets_tuning_start(monkeypatch):
    """The neighbouring case: MPS present, so the call goes on to the space (empty here, so it stops
    with the space's own error before compiling)."""
    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(autotune, "config_space", lambda *a, **k: [])
    with pytest.raises(ValueError, match="no configuration of the space fits"):
        autotune.autotune_gemm(4096, 4096, 4096)
