"""execution_backend="mlx": kernels called on real `mx.array`s.

Without MLX's Metal back-end (Linux) the adapter's `mx.fast.metal_kernel` calls go to the emulated
metal_kernel, so these tests run the adapter's real binding and launch plan with real arrays. The
Mac path is checked against a recording stand-in of `mx.fast.metal_kernel` that asserts MLX's
contract on every call (and runs the kernel through the emulated one, so results are checked too).

Skipped only when MLX is not installed and not in CI (`CI` set, as `.ci/run` does): CI must run them.
"""


import os
import re

import numpy as np
import pytest
import tilelang
import tilelang.language as T

if not os.environ.get("CI"):
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install -e '.[mlx]')")
import mlx.core as mx  # noqa: E402  (in CI a missing MLX fails here, on purpose)

from property_kernels import accumulate_into_initialised_c  # noqa: E402
from test_calling_convention import bool_mask, split_sum_then_combine, symbolic_rows  # noqa: E402
from test_global_workspaces import decode_inputs, flash_decoding, mix_reference, scale_then_mix, sdpa_reference  # noqa: E402
from tilelang_metal import kernels as E  # noqa: E402
from tilelang_metal.errors import Metal4UnavailableError  # noqa: E402
from tilelang_metal.execution import metal4_launch, mlx_emulated  # noqa: E402
from tilelang_metal.execution.mlx_source import AFTER, DONE, PREFIX  # noqa: E402


def compile_mlx(func, out_idx=None, target=None):
    return tilelang.compile(func, out_idx=out_idx, target=target or E.plain_metal_target(), execution_backend="mlx")


def np32(x) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def axpy_in_place(n: int):
    """B = B + s * A: B is read and written (no out_idx), A only read."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), s: T.float32):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    B[bx * 32 + i] = B[bx * 32 + i] + A[bx * 32 + i] * s

    return main


def partial_writer(n: int = 40, written: int = 17):
    """Writes only the first `written` elements of Out (out_idx) and of W (passed in)."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), W: T.Tensor((n,), "float32"), Out: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(32):
                if i < written:
                    Out[i] = A[i] + 1.0
                    W[i] = A[i] * 2.0

    return main


# ------------------------------------------------------------------------ a recording stand-in
class RecordingMetalKernel:
    """`mx.fast.metal_kernel` stand-in: checks MLX's documented contract at construction and on every
    call, records the call, and runs the kernel through the emulated metal_kernel."""

    calls: list[dict] = []

    def __init__(self, name, input_names, output_names, source, header="", ensure_row_contiguous=True, atomic_outputs=False):
        ident = re.compile(r"[A-Za-z_]\w*\Z")
        assert ident.match(name), name
        names = list(input_names) + list(output_names)
        assert all(ident.match(n) for n in names) and len(set(names)) == len(names), names
        assert output_names, "MLX needs at least one output"
        # `source` is a function BODY: MLX writes the signature. The header holds no kernel.
        assert not re.search(r"\[\[\s*kernel|\bkernel\s+void\b", source), "source must be a body, not a kernel"
        assert not re.search(r"\[\[\s*kernel|\bkernel\s+void\b", header), "the header must not define a kernel"
        assert source.count("{") == source.count("}")
        self.spec = dict(name=name, input_names=list(input_names), output_names=list(output_names), source=source, header=header)
        self.inner = mlx_emulated.EmulatedMetalKernel(name, input_names, output_names, source, header, ensure_row_contiguous, atomic_outputs)

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, **kwargs):
        assert len(inputs) == len(self.spec["input_names"])
        assert all(isinstance(x, mx.array) for x in inputs)
        assert len(output_shapes) == len(output_dtypes) == len(self.spec["output_names"])
        assert all(isinstance(d, mx.Dtype) for d in output_dtypes)
        assert len(grid) == 3 and len(threadgroup) == 3
        assert all(g % t == 0 for g, t in zip(grid, threadgroup)), "grid counts threads: whole threadgroups"
        assert int(np.prod(threadgroup)) <= 1024
        if not self.spec["name"].startswith("tlm_copy"):
            # Arrays of fewer than 8 elements would arrive in the constant address space.
            # (`after` only orders launches: the body never reads it.)
            sized = [x for n, x in zip(self.spec["input_names"], inputs) if n != AFTER]
            assert all(x.ndim == 0 or x.size >= 8 for x in sized), [x.shape for x in sized]
        record = dict(self.spec, inputs=list(inputs), output_shapes=list(output_shapes),
                      output_dtypes=list(output_dtypes), grid=tuple(grid), threadgroup=tuple(threadgroup))
        RecordingMetalKernel.calls.append(record)
        record["outputs_made"] = self.inner(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes, grid=grid,
                                            threadgroup=threadgroup, **kwargs)
        return record["outputs_made"]


@pytest.fixture
def on_a_mac(monkeypatch):
    """MLX reporting a Metal back-end, with `mx.fast.metal_kernel` replaced by the recording stand-in."""
    RecordingMetalKernel.calls = []
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx.fast, "metal_kernel", RecordingMetalKernel)
    monkeypatch.setattr(metal4_launch.platform, "mac_ver", lambda: ("26.1", ("", "", ""), "arm64"))
    return RecordingMetalKernel.calls


# ------------------------------------------------------------------------------------ kernels
@pytest.fixture(scope="module")
def gemm():
    return compile_mlx(E.gemm_direct_global(100, 200, 40), out_idx=[-1], target=E.metal4_target())


@pytest.fixture(scope="module")
def accumulate():
    main = accumulate_into_initialised_c(40, 72, 32, 32, 64, 128, "float16", "float32")[0]
    return compile_mlx(main)


@pytest.fixture(scope="module")
def axpy():
    return compile_mlx(axpy_in_place(37))


def test_gemm_on_mx_arrays_matches_numpy(gemm):
    A = mx.random.normal((100, 40), key=mx.random.key(0)).astype(mx.float16)
    B = mx.random.normal((40, 200), key=mx.random.key(1)).astype(mx.float16)
    C = gemm(A, B)
    assert isinstance(C, mx.array) and C.shape == (100, 200) and C.dtype == mx.float16
    ref = np32(A) @ np32(B)
    np.testing.assert_allclose(np32(C), ref, atol=0.05, rtol=0.02)
    A_t = mx.transpose(mx.transpose(A) * 1)  # a non-contiguous view of the same values
    np.testing.assert_allclose(np32(gemm(A_t, B)), ref, atol=0.05, rtol=0.02)


def test_read_and_written_parameter_comes_back_new_and_the_input_is_untouched(axpy):
    A = mx.arange(37).astype(mx.float32)
    B = mx.full((37,), 0.5)
    new_B = axpy(A, B, 2.0)
    np.testing.assert_array_equal(np.array(new_B), 0.5 + 2.0 * np.arange(37))
    np.testing.assert_array_equal(np.array(B), np.full(37, 0.5))  # MLX arrays are immutable: B stays
    again = axpy(A, new_B, mx.array(1.0))  # the result feeds the next call; a 0-d mx.array scalar
    np.testing.assert_array_equal(np.array(again), 0.5 + 3.0 * np.arange(37))


def test_gemm_accumulating_into_a_passed_c(accumulate):
    A = mx.random.normal((40, 32), key=mx.random.key(2)).astype(mx.float16)
    B = mx.random.normal((32, 72), key=mx.random.key(3)).astype(mx.float16)
    C = mx.random.normal((40, 72), key=mx.random.key(4))
    out = accumulate(A, B, C)
    np.testing.assert_allclose(np.array(out), np.array(C) + np32(A) @ np32(B), atol=1e-2, rtol=1e-3)


def test_partial_writes_keep_the_passed_values_and_poison_the_fresh_output():
    kernel = compile_mlx(partial_writer(), out_idx=[2])
    A = mx.arange(40).astype(mx.float32)
    W = mx.full((40,), 7.0)
    out, new_W = kernel(A, W)  # out_idx outputs first, then the other written parameters
    np.testing.assert_array_equal(np.array(out)[:17], np.arange(17) + 1.0)
    assert np.isnan(np.array(out)[17:]).all()  # never written: poisoned, as in the emulator backend
    np.testing.assert_array_equal(np.array(new_W), np.concatenate([np.arange(17) * 2.0, np.full(23, 7.0)]))


def test_tiny_arrays_are_padded_past_the_constant_address_space(on_a_mac):
    kernel = compile_mlx(axpy_in_place(5))
    A, B = mx.array([1.0, 2, 3, 4, 5]), mx.zeros((5,))
    np.testing.assert_array_equal(np.array(kernel(A, B, 3.0)), [3.0, 6, 9, 12, 15])


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((np.zeros(37, np.float32), "B", 1.0), TypeError, "A: expected an mx.array of shape (37,), got ndarray"),
        (("A", mx.zeros((36,)), 1.0), ValueError, "B: expected shape (37,), got (36,)"),
        (("A", mx.zeros((37,), dtype=mx.float16), 1.0), TypeError, "B: expected dtype float32, got float16"),
        (("A", "B", mx.zeros((3,))), TypeError, "s: expected a float32 scalar, got an array of shape (3,)"),
        (("A", "B"), TypeError, "kernel main takes 3 arguments (A, B, s), got 2"),
    ],
)
def test_bad_arguments_are_refused_with_the_parameter_named(axpy, args, error, message):
    real = {"A": mx.zeros((37,)), "B": mx.zeros((37,))}
    with pytest.raises(error) as info:
        axpy(*[real.get(a, a) if isinstance(a, str) else a for a in args])
    assert message in str(info.value)


# -------------------------------------------------------------------- the Mac path, recorded
def test_mac_launch_follows_the_metal_kernel_contract(on_a_mac):
    kernel = compile_mlx(E.gemm_direct_global(128, 256, 32), out_idx=[-1], target=E.metal4_target())
    A = mx.random.normal((128, 32), key=mx.random.key(5)).astype(mx.float16)
    B = mx.random.normal((32, 256), key=mx.random.key(6)).astype(mx.float16)
    C = kernel(A, B)
    np.testing.assert_allclose(np32(C), np32(A) @ np32(B), atol=0.05, rtol=0.02)
    (call,) = on_a_mac  # read-only inputs and a fresh output: no copy kernel at all
    assert call["input_names"] == [PREFIX + "A", PREFIX + "B", AFTER]
    assert call["output_names"] == [PREFIX + "C", DONE]
    # 256 x 128 in 128 x 64 tiles: 2 x 2 threadgroups of 128 threads; MLX's grid counts threads.
    assert call["threadgroup"] == (128, 1, 1)
    assert call["grid"] == (256, 2, 1)
    assert call["output_shapes"][0] == (128 * 256,) and call["output_dtypes"][0] == mx.float16
    np.testing.assert_array_equal(np.array(call["inputs"][0]), np.array(A).reshape(-1))  # A itself, flat
    assert "MetalPerformancePrimitives" in call["header"]  # cooperative tensors: MSL 4 (macOS 26)
    assert "threadgroup_position_in_grid" in call["source"] or "simdgroup_index_in_threadgroup" in call["source"]


def test_mac_in_place_parameter_costs_a_copy_in_and_a_copy_out(on_a_mac, axpy):
    A, B = mx.arange(37).astype(mx.float32), mx.ones((37,))
    np.testing.assert_array_equal(np.array(axpy(A, B, 1.0)), 1.0 + np.arange(37))
    names = [c["name"] for c in on_a_mac]
    assert names[0].startswith("tlm_copy") and names[-1].startswith("tlm_copy") and len(names) == 3
    kernel_call = on_a_mac[1]
    assert kernel_call["output_names"] == [DONE]  # B is written through the private copy
    assert f"(device float*)({PREFIX}B)" in kernel_call["source"]
    # the copy-out waits for the kernel: it takes the kernel's `done` as an input
    assert on_a_mac[2]["inputs"][-1] is not None and on_a_mac[2]["input_names"][-1] == AFTER
    # A (read only) reached the kernel uncopied; only B went through the copy kernel
    assert on_a_mac[0]["inputs"][0].size == 37 and np.array_equal(np.array(on_a_mac[0]["inputs"][0]), np.ones(37))


def test_metal4_kernels_need_macos_26(on_a_mac, monkeypatch):
    monkeypatch.setattr(metal4_launch.platform, "mac_ver", lambda: ("15.5", ("", "", ""), "arm64"))
    with pytest.raises(Metal4UnavailableError, match=r"need MSL 4\.0: macOS 15\.5 has no MSL 4\.0 \(update to macOS 26 or later\); or compile it for target="):
        compile_mlx(E.gemm_direct_global(64, 64, 32), out_idx=[-1], target=E.metal4_target())


def test_metal4_kernels_need_an_mlx_that_requests_msl_4(on_a_mac, monkeypatch):
    monkeypatch.setattr(mx, "__version__", "0.29.3")
    with pytest.raises(Metal4UnavailableError, match=r"mlx 0\.29\.3's mx\.fast\.metal_kernel does not request MSL 4\.0 \(pip install 'mlx>=0\.30'\)") as info:
        compile_mlx(E.gemm_direct_global(64, 64, 32), out_idx=[-1], target=E.metal4_target())
    assert "macOS" not in str(info.value) and "\n" not in str(info.value)
    compile_mlx(E.gemm_direct_global(64, 64, 32), out_idx=[-1], target=E.plain_metal_target())  # simdgroup build: fine


@pytest.mark.filterwarnings("ignore:tilelang_metal. do_bench:RuntimeWarning")  # emulated here: CPU wall time
def test_profiler_on_mx_arrays(gemm):
    profiler = gemm.get_profiler()
    profiler.assert_allclose(lambda A, B: (A.astype(mx.float32) @ B.astype(mx.float32)).astype(mx.float16), atol=0.05, rtol=0.02)
    with pytest.raises(AssertionError):
        profiler.assert_allclose(lambda A, B: (A.astype(mx.float32) @ B.astype(mx.float32)).astype(mx.float16) + 1.0, atol=0.05, rtol=0.02)
    assert profiler.do_bench(warmup=1, rep=2) > 0


def test_profiler_on_mx_arrays_takes_a_torch_reference(gemm):
    """TileLang's references are torch code: they get the inputs as CPU torch tensors."""
    profiler = gemm.get_profiler()
    profiler.assert_allclose(lambda A, B: (A.float() @ B.float()).half(), atol=0.05, rtol=0.02)
    with pytest.raises(AssertionError):
        profiler.assert_allclose(lambda A, B: (A.float() @ B.float()).half() + 1.0, atol=0.05, rtol=0.02)


def test_two_kernel_module_runs_in_order_and_returns_both_written_arrays(on_a_mac):
    """Kernel 1 writes Partial (passed in: a private copy), kernel 2 reads it and writes Out."""
    kernel = compile_mlx(split_sum_then_combine(), out_idx=[2])
    X = mx.random.normal((45, 32), key=mx.random.key(7))
    Partial = mx.zeros((4, 45))
    out, partial = kernel(0.5, X, Partial)
    x = np.array(X)
    np.testing.assert_allclose(np.array(out), 0.5 * x.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(partial), x.reshape(45, 4, 8).sum(axis=2).T, rtol=1e-5, atol=1e-5)
    assert not np.array(Partial).any()  # the array passed in is untouched
    first, second = (c for c in on_a_mac if not c["name"].startswith("tlm_copy"))
    done_of_first = first["output_names"].index(DONE)
    assert second["input_names"][-1] == AFTER  # kernel 2 waits for kernel 1 through its `done`
    assert np.array_equal(np.array(second["inputs"][-1]), np.array(first["outputs_made"][done_of_first]))


def test_bool_parameters_and_a_symbolic_size():
    kernel = compile_mlx(bool_mask(), out_idx=[2])
    A = mx.array(np.linspace(-1, 1, 40, dtype=np.float32))
    flip = mx.array(np.arange(40) % 3 == 0)
    out = kernel(A, flip)
    assert out.dtype == mx.bool_ and out.shape == (40,)
    np.testing.assert_array_equal(np.array(out), (np.array(A) > 0) != np.array(flip))
    rows = compile_mlx(symbolic_rows(), out_idx=[2])
    for m in (5, 13):
        a, b = mx.ones((m, 16)), mx.full((m, 16), 3.0)
        np.testing.assert_array_equal(np.array(rows(a, b)), np.full((m, 16), 7.0))


def test_workspace_modules_on_mx_arrays():
    """T.alloc_global workspaces: the call's own arrays, never returned; flash decoding's partial
    outputs and log-sum-exp go through them from the split kernel to the combine kernel."""
    import torch

    mix = compile_mlx(scale_then_mix(), out_idx=[1])
    a = np.random.default_rng(0).standard_normal((11, 8)).astype(np.float32)
    out = mix(mx.array(a))  # Out alone comes back
    np.testing.assert_allclose(np.array(out), mix_reference(torch.from_numpy(a)).numpy(), rtol=1e-6, atol=1e-6)
    q, k, v = decode_inputs(9, 2)
    decoded = flash_decoding(9, "mlx")(*(mx.array(t.float().numpy()).astype(mx.float16) for t in (q, k, v)))
    np.testing.assert_allclose(np32(decoded), sdpa_reference(q, k, v).numpy(), rtol=2e-3, atol=2e-3)


def test_mac_workspace_is_the_first_writers_output_and_the_readers_input(on_a_mac):
    kernel = compile_mlx(scale_then_mix(), out_idx=[1])
    a = mx.random.normal((9, 8), key=mx.random.key(8))
    out = kernel(a)
    assert out.shape == (9, 8)
    first, second = on_a_mac  # no copy kernels: W and Count start unwritten, written once, then read
    assert sorted(first["output_names"]) == sorted([PREFIX + "Count", PREFIX + "W", DONE])
    w_out = first["output_names"].index(PREFIX + "W")
    assert first["output_shapes"][w_out] == (9 * 8,)
    w_in = second["input_names"].index(PREFIX + "W")  # read only here: an input, the first kernel's output
    np.testing.assert_array_equal(np.array(second["inputs"][w_in]), np.array(first["outputs_made"][w_out]))
    np.testing.assert_array_equal(np.array(first["outputs_made"][w_out]), 2 * np.array(a).reshape(-1))
    assert sorted(second["output_names"]) == sorted([PREFIX + "Out", DONE])


def test_mac_tiny_workspace_written_in_place_by_a_later_kernel(on_a_mac):
    """A 3-element workspace: written fresh by kernel 1, updated in place by kernel 2 (a private
    padded copy: MLX would pass fewer than 8 elements as `constant`), read by kernel 3."""

    @T.prim_func
    def main(A: T.Tensor((3,), "float32"), Out: T.Tensor((3,), "float32")):
        W = T.alloc_global((3,), "float32")
        with T.Kernel(1, threads=3):
            tx = T.get_thread_binding()
            W[tx] = A[tx] * 3.0
        with T.Kernel(1, threads=3):
            tx = T.get_thread_binding()
            W[tx] = W[tx] + 1.0
        with T.Kernel(1, threads=3):
            tx = T.get_thread_binding()
            Out[tx] = W[(tx + 1) % 3]

    out = compile_mlx(main, out_idx=[1])(mx.array(np.array([1.0, 2.0, 3.0], dtype=np.float32)))
    np.testing.assert_array_equal(np.array(out), [7.0, 10.0, 4.0])  # W = 3 * A + 1, rotated
    kernels = [c for c in on_a_mac if not c["name"].startswith("tlm_copy")]
    assert len(kernels) == 3 and PREFIX + "W" in kernels[0]["output_names"]
    assert kernels[1]["output_names"] == [DONE]  # W updated through its private copy


@pytest.mark.parametrize("tool", ["racecheck", "counters"])
def test_emulator_tools_refuse_an_mlx_kernel_naming_its_backend(tool):
    """They failed inside torch ("Expected one of cpu, cuda, ... device string: mlx")."""
    from tilelang_metal import emulator

    kernel = compile_mlx(axpy_in_place(40))
    a, b = mx.ones((40,)), mx.zeros((40,))
    with pytest.raises(TypeError, match=rf"emulator\.{tool} runs kernels compiled with execution_backend='emulator' and this kernel "
                                        r"was compiled with execution_backend='mlx': compile the same program with tilelang\.compile\(\.\.\., "
                                        r"execution_backend='emulator'\)"):
        getattr(emulator, tool)(kernel, a, b, 2.0)
