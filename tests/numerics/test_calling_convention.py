"""The calling convention of compiled Metal kernels, run in the emulator: per-call argument checks,
scalar parameters, symbolic sizes, dtypes, views, unused parameters and multi-kernel modules.
The torch (MPS) adapter's launches are checked against a recording stand-in of compile_shader."""


import types

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import split_kernels
from tilelang_metal.execution import backends, mps_adapter
from tilelang_metal.execution.binding import Device


def compile_emulated(func, out_idx=None):
    return tilelang.compile(func, out_idx=out_idx, target=E.plain_metal_target(), execution_backend="emulator")


def kernel_builds(monkeypatch) -> list[str]:
    """Record every emulator compile the adapters ask for (one per distinct kernel source)."""
    from tilelang_metal import emulator

    built: list[str] = []
    original = emulator.compile_kernel

    def counting(source, **kwargs):
        # pytest --racecheck builds the racecheck flavour at every launch: count its distinct sources
        if kwargs.get("instrument") is None or source not in built:
            built.append(source)
        return original(source, **kwargs)

    monkeypatch.setattr(emulator, "compile_kernel", counting)
    return built


# ------------------------------------------------------------------------------------- kernels


def scale_shift(n: int = 48):
    """B = A * alpha + shift, the scalars in the middle of the parameter list."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), alpha: T.float32, shift: T.int32, B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    B[bx * 32 + i] = A[bx * 32 + i] * alpha + T.cast(shift, "float32")

    return main


def symbolic_rows(cols: int = 16, block_rows: int = 4):
    """C[m, :] = A[m, :] + B[m, :] * 2 for a symbolic number of rows M (grid ceil(M / block_rows))."""
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, cols), "float32"), B: T.Tensor((M, cols), "float32"), C: T.Tensor((M, cols), "float32")):
        with T.Kernel(T.ceildiv(M, block_rows), threads=32) as bx:
            for i, j in T.Parallel(block_rows, cols):
                if bx * block_rows + i < M:
                    C[bx * block_rows + i, j] = A[bx * block_rows + i, j] + B[bx * block_rows + i, j] * 2.0

    return main


def symbolic_gemv(K: int = 24, rows_per_block: int = 32):
    """y[m] = sum_k A[m, k] * x[k], M symbolic: one thread per row."""
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, K), "float32"), x: T.Tensor((K,), "float32"), y: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, rows_per_block), threads=rows_per_block) as bx:
            tx = T.get_thread_binding()
            acc = T.alloc_local((1,), "float32")
            row = bx * rows_per_block + tx
            if row < M:
                acc[0] = 0.0
                for k in T.serial(K):
                    acc[0] += A[row, k] * x[k]
                y[row] = acc[0]

    return main


def increment(dtype: str, n: int = 40):
    @T.prim_func
    def main(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    B[bx * 32 + i] = A[bx * 32 + i] + T.cast(1, dtype)

    return main


def bool_mask(n: int = 40):
    """Bools in and out: Out = (A > 0) != Flip."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), Flip: T.Tensor((n,), "bool"), Out: T.Tensor((n,), "bool")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    Out[bx * 32 + i] = (A[bx * 32 + i] > 0.0) != Flip[bx * 32 + i]

    return main


def reshaped_view():
    """Y = transpose of X seen through an 8x8 view of the flat parameter X."""

    @T.prim_func
    def main(X: T.Tensor((64,), "float32"), Y: T.Tensor((8, 8), "float32")):
        with T.Kernel(1, threads=64) as bx:
            Xv = T.reshape(X, (8, 8))
            for i, j in T.Parallel(8, 8):
                Y[i, j] = Xv[j, i] * 2.0

    return main


def bit_view():
    """Y = bits of X as int32, plus one: a same-size dtype view of a parameter."""

    @T.prim_func
    def main(X: T.Tensor((16,), "float32"), Y: T.Tensor((16,), "int32")):
        with T.Kernel(1, threads=16) as bx:
            Xi = T.view(X, dtype="int32")
            for i in T.Parallel(16):
                Y[i] = Xi[i] + 1

    return main


def shifted_by(dtype: str, n: int = 8):
    """B = A + float(s) for a scalar s of `dtype`."""
    scalar_type = getattr(T, dtype)

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), s: scalar_type, B: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=n) as bx:
            for i in T.Parallel(n):
                B[i] = A[i] + T.cast(s, "float32")

    return main


def unused_middle(n: int = 40):
    """`Unused` is never read: the device kernel drops it, so B is the kernel's second buffer."""

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), Unused: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    B[bx * 32 + i] = A[bx * 32 + i] * 3.0

    return main


def split_sum_then_combine(cols: int = 32, splits: int = 4):
    """Two kernels in sequence, like split-KV attention + combine. Kernel 1 writes per-split partial
    row sums of X into Partial; kernel 2 reads Partial (never X) and writes Out = scale * sum.
    Parameter order != either kernel's buffer order, so binding by declared order gives garbage,
    and running kernel 2 first reads the poisoned Partial."""
    M = T.dynamic("M")
    chunk = cols // splits

    @T.prim_func
    def main(
        scale: T.float32,
        X: T.Tensor((M, cols), "float32"),
        Out: T.Tensor((M,), "float32"),
        Partial: T.Tensor((splits, M), "float32"),
    ):
        with T.Kernel(splits, T.ceildiv(M, 32), threads=32) as (s, by):
            tx = T.get_thread_binding()
            acc = T.alloc_local((1,), "float32")
            row = by * 32 + tx
            if row < M:
                acc[0] = 0.0
                for c in T.serial(chunk):
                    acc[0] += X[row, s * chunk + c]
                Partial[s, row] = acc[0]
        with T.Kernel(T.ceildiv(M, 16), threads=16) as bx:
            tx = T.get_thread_binding()
            total = T.alloc_local((1,), "float32")
            row = bx * 16 + tx
            if row < M:
                total[0] = 0.0
                for s in T.serial(splits):
                    total[0] += Partial[s, row]
                Out[row] = total[0] * scale

    return main


@pytest.fixture(scope="module")
def scale_shift_kernel():
    return compile_emulated(scale_shift(), out_idx=[-1])


@pytest.fixture(scope="module")
def rows_kernel():
    return compile_emulated(symbolic_rows(), out_idx=[-1])


# ------------------------------------------------------------------------ scalar parameters


def test_float_and_int_scalars_reach_the_kernel(scale_shift_kernel):
    a = torch.randn(48)
    for alpha, shift in ((1.5, 3), (-0.25, -7), (0.0, 2**31 - 1)):
        out = scale_shift_kernel(a, alpha, shift)
        torch.testing.assert_close(out, a * alpha + float(shift), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.zeros(48), 1.0), TypeError, "kernel main takes 3 arguments (A, alpha, shift), got 2; outputs B are allocated"),
        ((torch.zeros(48), 1.0, 2, torch.zeros(48)), TypeError, "takes 3 arguments (A, alpha, shift), got 4"),
        ((torch.zeros(48), 1.0, 2.5), TypeError, "shift: expected an integer for int32, got float 2.5"),
        ((torch.zeros(48), 1.0, 2**31), ValueError, "shift: 2147483648 does not fit in int32"),
        ((torch.zeros(48), "x", 2), TypeError, "alpha: expected a number for float32, got str"),
        ((torch.zeros(49), 1.0, 2), ValueError, "A: expected shape (48,), got (49,)"),
        ((torch.zeros(6, 8), 1.0, 2), ValueError, "A: expected 1 dims (48,), got shape (6, 8)"),
        ((torch.zeros(48, dtype=torch.float16), 1.0, 2), TypeError, "A: expected dtype float32, got float16"),
        (([0.0] * 48, 1.0, 2), TypeError, "A: expected a torch.Tensor of shape (48,), got list"),
    ],
)
def test_bad_arguments_are_refused_with_the_parameter_named(scale_shift_kernel, args, error, message):
    with pytest.raises(error) as err:
        scale_shift_kernel(*args)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_static_shape_mismatch_names_expected_and_actual():
    kernel = compile_emulated(_static_2d(), out_idx=[-1])
    with pytest.raises(ValueError, match=r"^A: expected shape \(64, 32\), got \(64, 33\)$"):
        kernel(torch.zeros(64, 33), torch.zeros(64, 32))


def _static_2d():
    @T.prim_func
    def main(A: T.Tensor((64, 32), "float32"), B: T.Tensor((64, 32), "float32"), C: T.Tensor((64, 32), "float32")):
        with T.Kernel(16, threads=32) as bx:
            for i, j in T.Parallel(4, 32):
                C[bx * 4 + i, j] = A[bx * 4 + i, j] - B[bx * 4 + i, j]

    return main


# ------------------------------------------------------------------------- symbolic sizes


def test_symbolic_rows_run_for_several_sizes_with_one_compile(monkeypatch):
    built = kernel_builds(monkeypatch)
    kernel = compile_emulated(symbolic_rows(), out_idx=[-1])
    for m in (5, 37, 1, 64):  # ragged last block, one row, exact blocks
        a, b = torch.randn(m, 16), torch.randn(m, 16)
        torch.testing.assert_close(kernel(a, b), a + b * 2.0, rtol=0, atol=0)
    assert len(built) == 1


def test_symbolic_gemv_two_sizes(monkeypatch):
    built = kernel_builds(monkeypatch)
    kernel = compile_emulated(symbolic_gemv(), out_idx=[-1])
    x = torch.randn(24)
    for m in (7, 70):
        a = torch.randn(m, 24)
        torch.testing.assert_close(kernel(a, x), a @ x, rtol=1e-5, atol=1e-5)
    assert len(built) == 1


def test_two_symbolic_sizes_on_a_2d_grid():
    """B = A^T with M and N both symbolic (T.symbolic, the deprecated alias, for N); 2-D grid."""
    M, N = T.dynamic("M"), T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((N, M), "float32")):
        with T.Kernel(T.ceildiv(N, 8), T.ceildiv(M, 8), threads=64) as (bx, by):
            for i, j in T.Parallel(8, 8):
                if by * 8 + i < M and bx * 8 + j < N:
                    B[bx * 8 + j, by * 8 + i] = A[by * 8 + i, bx * 8 + j]

    kernel = compile_emulated(main, out_idx=[-1])
    for m, n in ((5, 7), (17, 3), (8, 16)):
        a = torch.randn(m, n)
        assert torch.equal(kernel(a), a.t())


def test_zero_rows_launch_nothing_and_return_an_empty_output(rows_kernel, monkeypatch):
    launched = []
    monkeypatch.setattr(type(rows_kernel.adapter), "compiled", lambda self, name: launched.append(name))
    out = rows_kernel(torch.zeros(0, 16), torch.zeros(0, 16))
    assert out.shape == (0, 16) and launched == []


def test_symbolic_size_inconsistent_across_tensors(rows_kernel):
    with pytest.raises(ValueError, match=r"^M: A has 64 but B has 65; both are M and must be equal$"):
        rows_kernel(torch.zeros(64, 16), torch.zeros(65, 16))


def test_symbolic_shape_message_shows_the_binding(rows_kernel):
    with pytest.raises(ValueError, match=r"^B: expected shape \(8, 16\) \(\(M, 16\) with M=8\), got \(8, 15\)$"):
        rows_kernel(torch.zeros(8, 16), torch.zeros(8, 15))


# ---------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64"])
def test_integer_dtype_round_trip_with_wraparound(dtype):
    kernel = compile_emulated(increment(dtype), out_idx=[-1])
    tdtype = getattr(torch, dtype)
    info = torch.iinfo(tdtype)
    a = torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), (40,), dtype=torch.int64).to(tdtype)
    a[0], a[1] = info.max, info.min
    out = kernel(a)
    assert out.dtype == tdtype
    # expected in int64, wrapped back to the dtype's width (torch's int64 -> narrow cast wraps)
    expected = a + 1 if dtype == "int64" else (a.to(torch.int64) + 1).to(tdtype)
    assert torch.equal(out.to(torch.int64), expected.to(torch.int64))
    assert out[0].item() == info.min  # max + 1 wrapped


def test_bool_tensors_in_and_out():
    kernel = compile_emulated(bool_mask(), out_idx=[-1])
    a = torch.randn(40)
    flip = torch.rand(40) > 0.5
    out = kernel(a, flip)
    assert out.dtype == torch.bool
    assert torch.equal(out, (a > 0) != flip)


# --------------------------------------------------------------------------- views, unused


def test_view_of_a_parameter_binds_to_that_parameter():
    kernel = compile_emulated(reshaped_view(), out_idx=[-1])
    assert "Xv" in kernel.get_kernel_source()  # the kernel names the buffer after the view, not X
    x = torch.randn(64)
    torch.testing.assert_close(kernel(x), x.view(8, 8).t() * 2.0, rtol=0, atol=0)


def test_dtype_view_of_a_parameter_reinterprets_its_bits():
    kernel = compile_emulated(bit_view(), out_idx=[-1])
    x = torch.randn(16)
    assert torch.equal(kernel(x), x.view(torch.int32) + 1)


def test_dtype_view_that_changes_the_element_size_is_refused_at_lowering():
    @T.prim_func
    def main(X: T.Tensor((16,), "float32"), Y: T.Tensor((32,), "float16")):
        with T.Kernel(1, threads=32) as bx:
            Xh = T.view(X, (32,), dtype="float16")
            for i in T.Parallel(32):
                Y[i] = Xh[i]

    with pytest.raises(Exception, match="a float16 view of a float32 parameter changes the element size"):
        compile_emulated(main, out_idx=[-1])


@pytest.mark.parametrize("dtype, value", [("float16", 0.5), ("int64", 2**40 + 3), ("uint32", 2**32 - 1), ("bool", True), ("int8", -100), ("uint8", 200)])
def test_scalar_parameter_dtypes(dtype, value):
    kernel = compile_emulated(shifted_by(dtype), out_idx=[-1])
    a = torch.randn(8)
    torch.testing.assert_close(kernel(a, value), a + torch.tensor(float(value), dtype=torch.float32), rtol=0, atol=0)


@pytest.mark.parametrize("dtype, message", [
    ("bfloat16", r"kernel main: scalar parameter 's' is bfloat16, .*declare it T.float32 and convert inside the kernel with T.cast\(s, 'bfloat16'\)"),
    ("float8_e4m3fn", r"kernel main: scalar parameter 's' is float8_e4m3fn, which Metal does not have"),
])
def test_scalar_parameters_the_host_cannot_pass_are_refused_by_name(dtype, message):
    """tilelang's MakePackedAPI stopped on a bfloat16 scalar with TVM's `Check failed: (dtype.is_float())`."""
    from tilelang_metal.errors import MetalLoweringError

    with pytest.raises(MetalLoweringError, match=message):
        compile_emulated(shifted_by(dtype), out_idx=[-1])


def test_unused_middle_parameter_is_dropped_and_the_rest_stay_bound():
    kernel = compile_emulated(unused_middle())
    assert "Unused" not in kernel.get_kernel_source()
    a, unused, b = torch.randn(40), torch.full((40,), 100.0), torch.full((40,), float("nan"))
    kernel(a, unused, b)
    torch.testing.assert_close(b, a * 3.0, rtol=0, atol=0)
    assert torch.all(unused == 100.0)
    with pytest.raises(ValueError, match=r"^Unused: expected shape \(40,\), got \(39,\)$"):
        kernel(a, torch.zeros(39), b)  # checked although no kernel reads it


# --------------------------------------------------------------------- multi-kernel modules


@pytest.fixture(scope="module")
def split_sum():
    return compile_emulated(split_sum_then_combine(), out_idx=[2, 3])


def test_two_kernels_run_in_host_order_each_with_its_own_buffers(split_sum):
    source = split_sum.get_kernel_source()
    assert source.count("[[kernel") == 2
    for m, scale in ((33, 0.5), (5, -2.0)):
        x = torch.randn(m, 32)
        out, partial = split_sum(scale, x)
        torch.testing.assert_close(partial, x.view(m, 4, 8).sum(-1).t(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, x.sum(-1) * scale, rtol=1e-5, atol=1e-5)


def test_each_launch_takes_its_buffers_from_its_call_site(split_sum):
    from tilelang_metal.emulator.signature import rewrite

    first, second = split_sum.adapter.call.launches
    positions = {p.name: p.position for p in split_sum.adapter.call.signature.params}
    sources = split_kernels(split_sum.get_kernel_source())
    for launch, buffers in ((first, {"X", "Partial"}), (second, {"Partial", "Out"})):
        bound = [a for a in launch.arguments if a.is_buffer]
        assert {a.name for a in bound} == buffers
        assert all(a.position == positions[a.name] for a in bound)
        # the MSL's [[ buffer(i) ]] order is the call site's argument order
        msl_params = rewrite(sources[launch.kernel_name], checked=True).signature.bound
        assert [p.name for p in msl_params] == [a.name for a in launch.arguments]


@pytest.mark.slow  # a metal4 GEMM beside an elementwise kernel (~3.6 s warm); test_multi_kernel_modules covers modules quickly
def test_elementwise_kernel_then_cooperative_tensor_gemm():
    """The second kernel (a metal4 GEMM) reads what the first wrote; M symbolic, grid per call."""
    Msym = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((Msym, 32), "float16"), As: T.Tensor((Msym, 32), "float16"), B: T.Tensor((32, 64), "float16"), C: T.Tensor((Msym, 64), "float16")):
        with T.Kernel(Msym, threads=32) as bx:
            for j in T.Parallel(32):
                As[bx, j] = A[bx, j] * T.float16(2.0)
        with T.Kernel(1, T.ceildiv(Msym, 64), threads=128) as (bx, by):
            T.gemm(As[by * 64 : (by + 1) * 64, 0:32], B[0:32, 0:64], C[by * 64 : (by + 1) * 64, 0:64], clear_accum=True)

    kernel = tilelang.compile(main, out_idx=[1, 3], target=E.metal4_target(), execution_backend="emulator")
    for m in (64, 100):
        a, b = torch.randn(m, 32).half(), torch.randn(32, 64).half()
        scaled, c = kernel(a, b)
        assert torch.equal(scaled, a * 2)
        torch.testing.assert_close(c.float(), scaled.float() @ b.float(), rtol=2e-2, atol=2e-2)


def test_split_source_holds_one_kernel_each(split_sum):
    sources = split_kernels(split_sum.get_kernel_source())
    assert len(sources) == 2
    for name, text in sources.items():
        assert text.count("[[kernel") == 1 and f"void {name}(" in text and "#include <metal_stdlib>" in text


# ------------------------------------------------------------ torch (MPS) adapter stand-in


class RecordingLibrary:
    """Stands in for torch.mps.compile_shader's library: records each launch and runs a torch
    reference of the kernel so that results can be checked."""

    def __init__(self, source: str, references: dict):
        assert source.startswith("// tilelang_metal")
        self.launches: list[tuple[str, tuple, list, list]] = []
        self.references = references

    def __getattr__(self, name: str):
        if name not in self.references:
            raise AttributeError(name)

        def kernel(*args, threads, group_size):
            self.launches.append((name, args, threads, group_size))
            self.references[name](*args)

        return kernel


@pytest.fixture
def mps_stand_in(monkeypatch):
    libraries: list[RecordingLibrary] = []
    references: dict = {}

    def compile_shader(source):
        libraries.append(RecordingLibrary(source, references))
        return libraries[-1]

    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(torch.mps, "compile_shader", compile_shader, raising=False)
    monkeypatch.setattr(mps_adapter, "MPS", Device("cpu", "torch"))  # CPU tensors stand in for MPS ones
    return types.SimpleNamespace(libraries=libraries, references=references)


def named(launch, args) -> dict:
    return dict(zip((a.name for a in launch.arguments), args))


def test_mps_adapter_passes_scalars_as_exact_dtype_buffers(mps_stand_in):
    kernel = tilelang.compile(scale_shift(), out_idx=[-1], target=E.plain_metal_target(), execution_backend="torch")
    (launch,) = kernel.adapter.call.launches

    def reference(*args):
        v = named(launch, args)
        v["B"].copy_(v["A"] * v["alpha"] + v["shift"].float())

    mps_stand_in.references[launch.kernel_name] = reference
    a = torch.randn(48)
    out = kernel(a, 0.5, -3)
    ((launched, args, threads, group_size),) = mps_stand_in.libraries[0].launches
    v = named(launch, args)
    assert launched == launch.kernel_name and v["A"] is a and v["B"] is out
    assert v["alpha"].dtype == torch.float32 and v["alpha"].tolist() == [0.5]
    assert v["shift"].dtype == torch.int32 and v["shift"].tolist() == [-3]
    assert threads == [2 * 32, 1, 1] and group_size == [32, 1, 1]
    torch.testing.assert_close(out, a * 0.5 - 3)
    mps_adapter.MPS = Device("mps", "torch")  # restored by monkeypatch
    with pytest.raises(ValueError, match=r"^A: expected a tensor on mps \(execution_backend='torch'\), got device cpu$"):
        kernel(a, 0.5, -3)


def test_mps_adapter_launches_every_kernel_in_order_with_per_call_grids(mps_stand_in):
    kernel = tilelang.compile(split_sum_then_combine(), out_idx=[2, 3], target=E.plain_metal_target(), execution_backend="torch")
    first, second = kernel.adapter.call.launches
    order: list[str] = []

    def partial_sums(*args):
        order.append(first.kernel_name)
        v = named(first, args)
        v["Partial"].copy_(v["X"].view(v["X"].shape[0], 4, 8).sum(-1).t())

    def combine(*args):
        order.append(second.kernel_name)
        v = named(second, args)
        v["Out"].copy_(v["Partial"].sum(0) * v["scale"])

    mps_stand_in.references.update({first.kernel_name: partial_sums, second.kernel_name: combine})
    x = torch.randn(40, 32)
    out, partial = kernel(2.0, x)
    launches = mps_stand_in.libraries[0].launches
    assert [name for name, *_ in launches] == [first.kernel_name, second.kernel_name] == order
    assert launches[0][2] == [4 * 32, 2 * 1, 1] and launches[0][3] == [32, 1, 1]  # grid (4, ceil(40/32))
    assert launches[1][2] == [3 * 16, 1, 1] and launches[1][3] == [16, 1, 1]  # grid ceil(40/16)
    torch.testing.assert_close(out, x.sum(-1) * 2.0, rtol=1e-5, atol=1e-5)
    kernel(2.0, torch.randn(100, 32))
    assert launches[2][2] == [4 * 32, 4, 1] and launches[3][2] == [7 * 16, 1, 1]  # recomputed for M=100
    assert len(mps_stand_in.libraries) == 1  # one compile_shader for the whole module
