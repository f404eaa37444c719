"""The plugin's torch (MPS) adapter, checked on Linux against a recording stand-in for
torch.mps.compile_shader: what it compiles, which buffers it binds in which order, the launch size."""

import types

import tilelang
import torch

from tilelang_metal import kernels as E
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


# ---------------------------------------------------------------- Metal 4 capability at launch
import functools  # noqa: E402

import pytest  # noqa: E402

from tilelang_metal.errors import Metal4UnavailableError  # noqa: E402
from tilelang_metal.execution import metal4_launch  # noqa: E402

MPP_MISSING = (
    "program_source:2:10: fatal error: 'MetalPerformancePrimitives/MetalPerformancePrimitives.h' file not found\n"
    "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n         ^"
)


@pytest.fixture
def mac(monkeypatch):
    """A stand-in Mac: MPS 'available', CPU tensors, a compile_shader that records what it compiles
    (or raises `state['error']`), and the host facts the test sets (macOS 26.1, torch 2.11.0)."""
    state = {"compiled": 0, "error": None, "launches": 0}

    def compile_shader(source):
        if state["error"] is not None:
            raise state["error"]
        state["compiled"] += 1

        def kernel(*buffers, threads, group_size):
            state["launches"] += 1
            buffers[-1].fill_(1.0)

        return types.SimpleNamespace(main_kernel=kernel)

    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", compile_shader, raising=False)
    monkeypatch.setattr(mps_adapter, "MPS", Device("cpu", "torch"))
    monkeypatch.setattr(metal4_launch.platform, "mac_ver", lambda: ("26.1", ("", "", ""), "arm64"))
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    return state


@functools.lru_cache(maxsize=None)
def _gemm():
    return E.gemm_direct_global(64, 64, 32)


def _compile(metal4: bool):
    target = E.metal4_target() if metal4 else E.plain_metal_target()
    return tilelang.compile(_gemm(), out_idx=[-1], target=target, execution_backend="torch")


@functools.lru_cache(maxsize=None)
def _never_launched_metal4():
    """One metal4 kernel (a ~1 s lowering) shared by the tests whose launches all fail before or in
    compile_shader: the adapter keeps a library only after a compile that succeeds, so each of those
    tests sees a kernel that has not reached Metal, as a fresh one would be. A test whose launch
    succeeds compiles its own kernel (`_compile`)."""
    return _compile(True)


def _operands():
    return torch.randn(64, 32).half(), torch.randn(32, 64).half()


def test_metal4_kernel_runs_on_macos_26_with_a_torch_that_requests_msl_4(mac):
    kernel = _compile(True)
    assert "MetalPerformancePrimitives" in kernel.get_kernel_source()
    out = kernel(*_operands())
    assert mac["compiled"] == 1 and mac["launches"] == 1 and torch.all(out == 1.0)


@pytest.mark.parametrize(
    "macos,torch_version,missing",
    [
        ("15.5", "2.11.0", ["macOS 15.5 has no MSL 4.0 (update to macOS 26 or later)"]),
        ("26.1", "2.10.0", ["torch 2.10.0's torch.mps.compile_shader does not request MSL 4.0 (pip install 'torch>=2.11')"]),
        ("14.7.1", "2.9.1+cpu", ["macOS 14.7.1 has no MSL 4.0", "torch 2.9.1+cpu's torch.mps.compile_shader does not request MSL 4.0"]),
    ],
)
def test_metal4_kernel_is_refused_at_first_launch_naming_what_is_missing(mac, monkeypatch, macos, torch_version, missing):
    monkeypatch.setattr(metal4_launch.platform, "mac_ver", lambda: (macos, ("", "", ""), "arm64"))
    monkeypatch.setattr(torch, "__version__", torch_version)
    kernel = _never_launched_metal4()  # compiling is fine: the check is at launch (a cached kernel may come from elsewhere)
    with pytest.raises(Metal4UnavailableError) as info:
        kernel(*_operands())
    text = str(info.value)
    assert "\n" not in text and text.startswith("kernel main_kernel uses Metal 4 tensor operations (target key metal4)")
    assert all(m in text for m in missing) and ("macOS" in text) == any("macOS" in m for m in missing)
    assert "target={'kind': 'metal', 'keys': ['metal', 'gpu']}" in text
    assert mac["compiled"] == 0 and mac["launches"] == 0  # nothing reached Metal


def test_plain_metal_kernels_are_not_checked(mac, monkeypatch):
    monkeypatch.setattr(metal4_launch.platform, "mac_ver", lambda: ("14.7.1", ("", "", ""), "arm64"))
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    out = _compile(False)(*_operands())
    assert mac["launches"] == 1 and torch.all(out == 1.0)


def test_a_compiler_without_msl_4_is_explained_in_one_line(mac):
    mac["error"] = SyntaxError(MPP_MISSING)
    with pytest.raises(Metal4UnavailableError, match=r"^kernel main_kernel: the runtime's Metal compiler rejected its Metal 4 tensor operations \(program_source:2:10: fatal error: 'MetalPerformancePrimitives/") as info:
        _never_launched_metal4()(*_operands())
    assert "\n" not in str(info.value) and isinstance(info.value.__cause__, SyntaxError)


def test_other_compile_errors_pass_through_unchanged(mac):
    mac["error"] = SyntaxError("program_source:9:3: error: use of undeclared identifier 'oops'")
    with pytest.raises(SyntaxError, match="oops"):
        _never_launched_metal4()(*_operands())
