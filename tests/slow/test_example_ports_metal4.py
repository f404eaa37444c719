"""The GEMM-bearing ports of TileLang's examples (`tests/numerics/test_example_ports.py`) on the
cooperative-tensor `metal4` target: same kernels, same inputs and checks (race checker, torch)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "numerics"))
import test_example_ports as ports  # noqa: E402  (a module: its test functions are not collected here)

pytestmark = pytest.mark.slow


def test_dynamic_gemm_on_metal4():
    ports.run_dynamic_gemm("metal4", False, True)


def test_grouped_gemm_on_metal4():
    ports.run_grouped_gemm("metal4")


@pytest.mark.parametrize("window", [None, 16], ids=["causal", "sliding-window"])
def test_attention_sink_on_metal4(window):
    ports.run_attention_sink("metal4", window)


def test_blocksparse_attention_on_metal4():
    ports.run_blocksparse_attention("metal4", True)


def test_mla_decode_on_metal4():
    ports.run_mla_decode("metal4", 77, 3)


def test_chunk_retention_on_metal4():
    ports.run_chunk_retention("metal4")


def test_flash_attention_backward_on_metal4():
    ports.run_flash_attention_backward("metal4", True)
