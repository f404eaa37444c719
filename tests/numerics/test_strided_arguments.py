"""Strided tensors and aliasing at call time (docs/calling_convention.md, "Layouts" and "Aliasing").

Dense parameters (`T.Tensor`) take a non-contiguous or misaligned *input* as a copy and refuse such
an *output*; parameters declared with symbolic strides (`T.StridedTensor`) take any view, with its
strides as kernel arguments. A tensor a kernel writes must not share memory with another argument
(kernel buffers are `__restrict`). Emulator and MLX (emulated metal_kernel on Linux) backends."""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from test_calling_convention import mps_stand_in, named  # noqa: F401  (mps_stand_in is a fixture)
from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck

N = 37  # columns: prime, not a multiple of the 4-row x 37 tile split over 128 threads
ROWS = 4  # rows per threadgroup; M = 10 leaves a partial last threadgroup


@T.macro
def _scale_body(A, B, M):
    with T.Kernel(T.ceildiv(M, ROWS), threads=128) as bx:
        for i, j in T.Parallel(ROWS, N):
            if bx * ROWS + i < M:
                B[bx * ROWS + i, j] = A[bx * ROWS + i, j] * 2.0 + 1.0


def dense_scale():
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        _scale_body(A, B, M)

    return main


def strided_scale():
    """A and B with symbolic strides: any row pitch, transposed views."""
    M = T.dynamic("M")
    a0, a1, b0, b1 = (T.dynamic(name) for name in ("a0", "a1", "b0", "b1"))

    @T.prim_func
    def main(A: T.StridedTensor((M, N), (a0, a1), "float32"), B: T.StridedTensor((M, N), (b0, b1), "float32")):
        _scale_body(A, B, M)

    return main


def constant_strided_scale(M: int = 8):
    """A declared column-major with constant strides: takes exactly that layout."""

    @T.prim_func
    def main(A: T.StridedTensor((M, N), (1, M), "float32"), B: T.Tensor((M, N), "float32")):
        _scale_body(A, B, M)

    return main


def dense_add(n: int = 40):
    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    C[bx * 32 + i] = A[bx * 32 + i] + B[bx * 32 + i]

    return main


BUILDERS = {"dense": dense_scale, "strided": strided_scale, "constant": constant_strided_scale, "add": dense_add}


@functools.lru_cache(maxsize=None)
def kernel(name: str, backend: str = "emulator", out_idx: int | None = None):
    return tilelang.compile(
        BUILDERS[name](), out_idx=out_idx, target=E.plain_metal_target(), execution_backend=backend
    )


def expected(a: torch.Tensor) -> torch.Tensor:
    return a * 2.0 + 1.0


def special_values(shape: tuple[int, ...]) -> torch.Tensor:
    """Random values with a NaN, an inf and a -inf, which must come through where they were."""
    x = torch.randn(shape)
    flat = x.view(-1)
    flat[5], flat[17], flat[-1] = float("nan"), float("inf"), float("-inf")
    return x


def assert_scaled(out: torch.Tensor, a: torch.Tensor) -> None:
    torch.testing.assert_close(out, expected(a), rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------ dense parameters (T.Tensor)


@pytest.mark.parametrize(
    "make_input",
    [
        lambda: special_values((N, 10)).t(),  # transposed: strides (1, 10)
        lambda: special_values((10, 64))[:, 3:40],  # sliced: row pitch 64, data 12 bytes in
        lambda: special_values((10, N + 1))[:, 1:],  # sliced by one column: misaligned start
        lambda: special_values((1, N)).expand(10, N),  # broadcast rows: stride 0
    ],
    ids=["transposed", "sliced", "offset-by-one", "broadcast"],
)
def test_a_non_contiguous_input_to_a_dense_parameter_is_read_as_a_copy(make_input):
    a = make_input()
    before = a.clone()
    out = kernel("dense", out_idx=1)(a)
    assert_scaled(out, before)
    torch.testing.assert_close(a, before, rtol=0, atol=0, equal_nan=True)  # the caller's view is untouched


def test_a_non_contiguous_output_of_a_dense_parameter_is_refused():
    base = torch.zeros(10, 64)
    a = torch.randn(10, N)
    with pytest.raises(ValueError) as err:
        kernel("dense")(a, base[:, 4 : 4 + N])
    message = str(err.value)
    assert message.startswith("B: expected a contiguous tensor, got strides (64, 1) for shape (10, 37)")
    assert "a kernel writes B" in message and "B.contiguous()" in message and "T.StridedTensor" in message
    assert "\n" not in message
    assert (base == 0).all()  # nothing was launched


def test_a_misaligned_contiguous_output_is_refused():
    flat = torch.zeros(1 + 10 * N)
    with pytest.raises(ValueError, match=r"^B: data starts 4 bytes past a 16-byte boundary \(storage offset 1\);"):
        kernel("dense")(torch.randn(10, N), flat[1:].view(10, N))


# ------------------------------------------------------------------ symbolic strides (T.StridedTensor)


@pytest.mark.parametrize("backend", ["emulator"])
def test_symbolic_strides_take_transposed_and_sliced_views_as_they_are(backend):
    k = kernel("strided", backend)
    cases = [
        (special_values((N, 10)).t(), torch.zeros(10, N)),  # transposed input, dense output
        (special_values((10, 68))[:, 4 : 4 + N], torch.zeros(N, 10).t()),  # row pitch 68 in, transposed out
        (special_values((10, 64))[:, 3 : 3 + N], torch.zeros(10, N)),  # misaligned input: read as a copy
        (special_values((1, N)).expand(10, N), torch.zeros(10, N)),  # broadcast input (stride 0)
        (special_values((7, N)), torch.zeros(7, N)),  # dense, another M: one compile serves it
    ]
    for a, b in cases:
        k(a, b)
        assert_scaled(b, a)


def test_a_strided_output_is_written_in_place_and_nothing_around_it():
    base = torch.full((10, 72), -5.0)
    a = special_values((10, N))
    out = base[:, 8 : 8 + N]  # row pitch 72, 32 bytes in
    kernel("strided")(a, out)
    assert_scaled(base[:, 8 : 8 + N], a)
    around = torch.cat([base[:, :8], base[:, 8 + N :]], dim=1)
    assert (around == -5.0).all()


def test_strided_outputs_that_cannot_be_written_are_refused():
    a = torch.randn(10, N)
    with pytest.raises(ValueError, match=r"^B: elements share memory \(strides \(0, 1\) for shape \(10, 37\)\) and a kernel writes B;"):
        kernel("strided")(a, torch.zeros(1, N).expand(10, N))
    with pytest.raises(ValueError, match=r"^B: data starts 12 bytes past a 16-byte boundary \(storage offset 3\);"):
        kernel("strided")(a, torch.zeros(10, 64)[:, 3 : 3 + N])


def test_strided_kernel_is_race_free_on_a_strided_output():
    a = torch.randn(N, 10).t()
    base = torch.zeros(10, 48)
    racecheck(kernel("strided"), a, base[:, 8 : 8 + N])
    assert_scaled(base[:, 8 : 8 + N], a)


def test_racecheck_takes_a_broadcast_input_and_writes_back_only_what_kernels_write():
    """racecheck runs on copies and copies the results back: a read-only broadcast view (stride 0)
    cannot take a copy, and nothing must be written to it."""
    a = special_values((1, N)).expand(10, N)
    b = torch.zeros(10, N)
    racecheck(kernel("strided"), a, b)
    assert_scaled(b, a)


def test_constant_declared_strides_take_exactly_that_layout():
    a = special_values((N, 8)).t()  # strides (1, 8), as declared
    b = torch.zeros(8, N)
    kernel("constant")(a, b)
    assert_scaled(b, a)
    with pytest.raises(ValueError, match=r"^A: expected strides \(1, 8\), got \(37, 1\) for shape \(8, 37\)$"):
        kernel("constant")(a.contiguous(), b)


# ------------------------------------------------------------------ aliasing (__restrict)


def test_an_output_that_is_an_input_is_refused():
    a = torch.randn(10, N)
    with pytest.raises(ValueError) as err:
        kernel("dense")(a, a)
    assert str(err.value) == (
        "B and A share memory and a kernel writes B (kernel buffers are __restrict): pass a separate tensor for B, "
        "or A.clone()"
    )


def test_overlapping_views_of_one_tensor_are_refused():
    flat = torch.randn(3 * 10 * N)
    with pytest.raises(ValueError, match=r"^B and A share memory and a kernel writes B"):
        kernel("dense")(flat[: 10 * N].view(10, N), flat[4 * N : 14 * N].view(10, N))  # rows 4.. of A are B's
    base = torch.randn(10, 80)
    with pytest.raises(ValueError, match=r"^B and A share memory"):  # interleaved rows, columns 36 in common
        kernel("strided")(base[:, :N], base[:, 36 : 36 + N])


def test_disjoint_views_of_one_tensor_are_accepted_and_correct():
    flat = torch.randn(2 * 10 * N + 2)
    a, b = flat[: 10 * N].view(10, N), flat[10 * N + 2 : 20 * N + 2].view(10, N)  # b: 2 elements past a's end, aligned
    a_before = a.clone()
    kernel("dense")(a, b)
    assert_scaled(b, a_before)
    torch.testing.assert_close(a, a_before, rtol=0, atol=0)
    base = torch.randn(10, 80)  # interleaved but disjoint: the byte ranges overlap, the elements do not
    a, b = base[:, :N], base[:, 40 : 40 + N]
    a_before = a.clone()
    kernel("strided")(a, b)
    assert_scaled(b, a_before)
    torch.testing.assert_close(base[:, :N], a_before, rtol=0, atol=0)


def test_one_tensor_as_two_inputs_is_accepted():
    a = special_values((40,))
    c = torch.zeros(40)
    kernel("add")(a, a, c)
    torch.testing.assert_close(c, a + a, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"^C and B share memory and a kernel writes C"):
        kernel("add")(a, c, c)


# ------------------------------------------------------------------ MLX arrays


def test_mlx_views_reach_dense_and_strided_kernels():
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    base = mx.array(special_values((10, 64)).numpy())
    transposed = mx.array(special_values((N, 10)).numpy()).T
    for a in (base[:, 3 : 3 + N], transposed):
        want = np.array(a) * 2.0 + 1.0
        for name in ("dense", "strided"):
            out = kernel(name, "mlx")(a, mx.zeros((10, N)))  # B is written: returned, the zeros untouched
            np.testing.assert_array_equal(np.array(out), want)


def test_mlx_takes_one_array_as_input_and_written_parameter():
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    a = mx.array(special_values((10, N)).numpy())
    want = np.array(a) * 2.0 + 1.0
    out = kernel("dense", "mlx")(a, a)  # arrays are immutable: the written B is a private copy
    np.testing.assert_array_equal(np.array(out), want)
    np.testing.assert_array_equal(np.array(a) * 2.0 + 1.0, want)  # a unchanged


# ------------------------------------------------------------------ torch (MPS) adapter, recording stand-in


def test_mps_adapter_passes_a_strided_view_as_its_memory_and_its_strides(mps_stand_in):
    k = tilelang.compile(strided_scale(), target=E.plain_metal_target(), execution_backend="torch")
    (launch,) = k.adapter.call.launches

    def reference(*args):
        v = named(launch, args)
        strides = {name: int(v[name].item()) for name in ("a0", "a1", "b0", "b1")}
        rows = int(v["M"].item())
        a = v["A"].as_strided((rows, N), (strides["a0"], strides["a1"]))  # as the kernel addresses it
        v["B"].as_strided((rows, N), (strides["b0"], strides["b1"])).copy_(a * 2.0 + 1.0)

    mps_stand_in.references[launch.kernel_name] = reference
    a = special_values((N, 10)).t()
    base = torch.zeros(10, 72)
    b = base[:, 8 : 8 + N]
    k(a, b)
    ((_, args, _, _),) = mps_stand_in.libraries[0].launches
    v = named(launch, args)
    for given, view in ((v["A"], a), (v["B"], b)):  # flat views of exactly the memory each view spans
        assert given.is_contiguous() and given.dim() == 1 and given.data_ptr() == view.data_ptr()
        assert given.numel() == 1 + sum((s - 1) * st for s, st in zip(view.shape, view.stride()))
    assert [int(v[n].item()) for n in ("a0", "a1", "b0", "b1")] == [1, 10, 72, 1]
    assert all(v[n].dtype == torch.int32 for n in ("a0", "a1", "b0", "b1"))
    assert_scaled(b, a)
    assert (base[:, :8] == 0).all() and (base[:, 8 + N :] == 0).all()

