"""The plugin's torch (MPS) adapter, checked on Linux against a recording stand-in for
torch.mps.compile_shader: what it compiles, which buffers it binds in which order, the launch size."""

import types

import tilelang
import torch

from tilelang_metal import examples as E
from tilelang_metal.execution import backends, mps_adapter
from tilelang_metal.execution.binding import Device


def test_mps_adapter_binds_by_name_allocates_outputs_and_launches_the_grid(monkeypatch):
    calls = []

    def fake_compile_shader(source):
        def kernel(*buffers, threads, group_size):
            calls.append((buffers, threads, group_size))
            buffers[-1].fill_(7.0)

        assert source.startswith("// tilelang_metal")
        return types.SimpleNamespace(main_kernel=kernel)

    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", fake_compile_shader)
    monkeypatch.setattr(mps_adapter, "MPS", Device("cpu", "torch"))  # no MPS device here: CPU tensors stand in
    # gemm_shared without an epilogue never reads Bias: the kernel has 3 buffers, the host 4 tensors
    func = E.gemm_shared(128, 192, 64, block_M=64, block_N=64)
    kernel = tilelang.compile(func, out_idx=[-1], target=E.plain_metal_target(), execution_backend="torch")
    a, b, bias = torch.randn(128, 64).half(), torch.randn(64, 192).half(), torch.randn(192)
    out = kernel(a, b, bias)
    (buffers, threads, group_size), = calls
    assert len(buffers) == 3 and buffers[0] is a and buffers[1] is b and buffers[2] is out
    assert out.shape == (128, 192) and torch.all(out == 7.0)
    assert group_size == [128, 1, 1] and threads == [3 * 128, 2, 1]
