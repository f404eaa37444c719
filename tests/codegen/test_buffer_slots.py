"""Metal binds at most 31 [[ buffer(i) ]] per kernel (limits.BUFFER_ARGUMENT_SLOTS, Apple's Metal
Feature Set Tables): every tensor and every scalar or dynamic size takes one. A kernel past that
printed [[ buffer(32) ]], ran in the emulator and could not compile on a Mac (issue #32); now the
printer refuses it in one line, the emulator refuses MSL that binds index 31 or more, and the MLX
launcher (two more buffers of its own) refuses a kernel that fits the plain signature but not its."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import EmulatorCompileError, compile_msl
from tilelang_metal.errors import CodegenError
from tilelang_metal.target.limits import BUFFER_ARGUMENT_SLOTS

TENSORS = 16


@functools.lru_cache(maxsize=None)
def sixteen_tensors(dynamic_last: bool):
    """16 tensors, each of its own dynamic length (the last one static unless `dynamic_last`):
    32 buffer slots, or 31 (the most Metal binds)."""
    n = [T.dynamic(f"n{i}") for i in range(TENSORS)]
    last = n[15] if dynamic_last else 8

    @T.prim_func
    def main(
        X0: T.Tensor((n[0],), "float32"), X1: T.Tensor((n[1],), "float32"), X2: T.Tensor((n[2],), "float32"),
        X3: T.Tensor((n[3],), "float32"), X4: T.Tensor((n[4],), "float32"), X5: T.Tensor((n[5],), "float32"),
        X6: T.Tensor((n[6],), "float32"), X7: T.Tensor((n[7],), "float32"), X8: T.Tensor((n[8],), "float32"),
        X9: T.Tensor((n[9],), "float32"), X10: T.Tensor((n[10],), "float32"), X11: T.Tensor((n[11],), "float32"),
        X12: T.Tensor((n[12],), "float32"), X13: T.Tensor((n[13],), "float32"), X14: T.Tensor((n[14],), "float32"),
        X15: T.Tensor((last,), "float32"),
    ):
        with T.Kernel(1, threads=32):
            t = T.get_thread_binding(0)
            for i, X in enumerate((X0, X1, X2, X3, X4, X5, X6, X7, X8, X9, X10, X11, X12, X13, X14, X15)):
                if t < X.shape[0]:
                    X[t] = X[t] * 2.0 + float(i)

    return main


def test_thirty_two_slots_are_refused_at_lowering():
    with pytest.raises(CodegenError) as info:
        tilelang.lower(sixteen_tensors(True), target="metal")
    text = str(info.value)
    assert "\n" not in text
    assert "needs 32 [[ buffer(i) ]] slots (16 tensors, 16 scalar slots), Metal allows 31" in text
    assert "make 1 of the 16 scalar / dynamic-size parameters static" in text


def test_thirty_one_slots_run_in_the_emulator():
    kernel = tilelang.compile(sixteen_tensors(False), target="metal", execution_backend="emulator")
    assert f"[[ buffer({BUFFER_ARGUMENT_SLOTS - 1}) ]]" in kernel.get_kernel_source()
    lengths = [3 + i % 5 for i in range(TENSORS - 1)] + [8]
    xs = [torch.randn(n) for n in lengths]
    want = [x * 2.0 + i for i, x in enumerate(xs)]
    kernel(*xs)
    for got, ref in zip(xs, want):
        torch.testing.assert_close(got, ref)


def test_the_emulator_refuses_a_buffer_index_a_mac_cannot_bind():
    params = ",\n".join(f"  device float* b{i} [[buffer({i})]]" for i in range(BUFFER_ARGUMENT_SLOTS + 1))
    msl = f"#include <metal_stdlib>\nusing namespace metal;\n[[kernel]] void wide(\n{params},\n  uint t [[thread_position_in_grid]]) {{\n  b31[t] = b0[t];\n}}\n"
    with pytest.raises(EmulatorCompileError, match=r"kernel wide binds \[\[ buffer\(31\) \]\] \(32 buffer slots\); Metal has 31 per kernel"):
        compile_msl(msl, "wide")


def test_mlx_refuses_a_kernel_its_own_two_buffers_push_past_the_limit():
    pytest.importorskip("mlx.core")
    with pytest.raises(CodegenError, match=r"needs 33 \[\[ buffer\(i\) \]\] slots under execution_backend='mlx' .* pass 2 fewer"):
        tilelang.compile(sixteen_tensors(False), target="metal", execution_backend="mlx")  # 31 slots: fine elsewhere
