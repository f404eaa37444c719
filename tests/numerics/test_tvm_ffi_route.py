"""execution_backend="tvm_ffi": tilelang's TVMFFIKernelAdapter over TVM's own Metal runtime module.

Linux has no Metal runtime, so `ffi.Module.create.metal` is replaced by a recording stand-in: the
tests check what the plugin hands to the runtime (per-kernel MSL, FunctionInfo arg types and launch
tags) and run the MSL printed for the runtime's convention (buffers 0..n-1, scalars in one argument
struct at n) in the emulator, with the grid / threadgroup size taken from the launch tags and the
host's extents and the struct bytes packed as the runtime packs them."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch
import tvm_ffi

from tilelang_metal import emulator
from tilelang_metal import host as _host
from tilelang_metal import kernels as E
from tilelang_metal.codegen.tvm_runtime_args import pack_arguments
from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import CodegenError


@pytest.fixture
def metal_runtime():
    """A recording stand-in of TVM's Metal module factory; removed again after the test."""
    assert _host.get_global_func(_host.METAL_MODULE_FACTORY) is None, "a real Metal runtime is registered here"
    calls: list[dict] = []

    def create(smap, fmt, fmap, source):
        calls.append({
            "smap": {str(k): bytes(v).decode() for k, v in smap.items()},
            "fmt": str(fmt),
            "fmap": {str(k): v for k, v in fmap.items()},
            "source": {str(k): str(v) for k, v in source.items()},
        })
        return _host.make_source_module(str(source["metal"]), "metal")  # not runnable: nothing on Linux is

    tvm_ffi.register_global_func(_host.METAL_MODULE_FACTORY, f=create, override=True)
    try:
        yield calls
    finally:
        tvm_ffi.remove_global_func(_host.METAL_MODULE_FACTORY)


def compile_tvm_ffi(func, out_idx=None, target=None):
    return tilelang.compile(func, out_idx=out_idx, target=target or E.plain_metal_target(), execution_backend="tvm_ffi")


def runtime_info(info) -> tuple[list[str], list[str]]:
    return [str(t) for t in info.arg_types], [str(t) for t in info.launch_param_tags]


def runtime_dispatch(tags: list[str], extents: list[int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """TVM's LaunchParamConfig::Extract: one extent per tag after the arguments; blockIdx.d sets
    the grid, threadIdx.d the threadgroup; Metal's runtime ignores the dynamic shared memory size."""
    assert len(tags) == len(extents)
    grid, block = [1, 1, 1], [1, 1, 1]
    for tag, extent in zip(tags, extents):
        if tag.startswith("blockIdx."):
            grid["xyz".index(tag[-1])] = extent
        elif tag.startswith("threadIdx."):
            block["xyz".index(tag[-1])] = extent
        else:
            assert tag == "tirx.use_dyn_shared_memory", tag
    return tuple(grid), tuple(block)


@functools.lru_cache(maxsize=None)
def host_launch(func, kernel_name: str, target_keys: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple]:
    """The kernel's scalar parameters in the order the host passes them (its device parameters),
    and the launch extents the host passes after them (expressions of the host's variables)."""
    artifact = tilelang.lower(func, target=E.metal4_target() if "metal4" in target_keys else E.plain_metal_target())
    (call,) = [c for c in _host.host_kernel_calls(artifact.host_mod, artifact.device_mod) if c.kernel_name == kernel_name]
    scalars = tuple(str(p.name) for p in call.device_func.params if p.dtype != "handle")
    return scalars, tuple(extent for _, extent in call.launch)


def evaluate(expr, sizes: dict[str, int]) -> int:
    free = {}
    _host.tir.stmt_functor.post_order_visit(expr, lambda n: free.setdefault(n, None) if isinstance(n, _host.tir.Var) else None)
    bound = {var: _host.tir.const(sizes[str(var.name)], var.dtype) for var in free}
    return int(_host.tvm.arith.Analyzer().simplify(_host.tir.stmt_functor.substitute(expr, bound)))


def run_as_runtime(func, kernel_name: str, msl: str, info, tensors: list[torch.Tensor], scalars: dict, target_keys=()) -> None:
    """Launch the runtime-convention MSL in the emulator the way TVM's Metal runtime would."""
    arg_types, tags = runtime_info(info)
    buffers = [t for t in arg_types if t == "handle"]
    assert arg_types[: len(buffers)] == buffers, "buffers come first"
    order, extents = host_launch(func, kernel_name, tuple(target_keys))
    grid, block = runtime_dispatch(tags, [evaluate(e, scalars) for e in extents])
    packed = [pack_arguments(arg_types[len(buffers):], [scalars[name] for name in order])] if order else []
    emulator.compile_kernel(msl).launch([*tensors, *packed], grid, block)


# ------------------------------------------------------------------------------------- kernels

N = 37  # prime: the last threadgroup is partial


@functools.lru_cache(maxsize=None)
def mixed_scalars():
    """Scalars of every integer width, a bool and a float in the middle of the parameter list."""

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), alpha: T.float32, shift: T.int16, wide: T.int64, mask: T.uint32,
             flip: T.bool, small: T.uint8, B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "int64")):
        with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < N:
                    B[bx * 32 + i] = T.if_then_else(flip, -A[bx * 32 + i], A[bx * 32 + i]) * alpha + T.cast(shift, "float32")
                    C[bx * 32 + i] = wide + T.cast(T.bitwise_and(mask, T.cast(bx * 32 + i, "uint32")), "int64") + T.cast(small, "int64")

    return main


MIXED_NAMES = ("alpha", "shift", "wide", "mask", "flip", "small")


def mixed_reference(a, alpha, shift, wide, mask, flip, small):
    b = (-a if flip else a) * torch.tensor(alpha, dtype=torch.float32) + float(shift)
    idx = torch.arange(N, dtype=torch.int64)
    return b, wide + (idx & mask) + small


MIXED_VALUES = [
    (1.5, -3, 2**40 + 7, 0xFFFF_FFF0, True, 200),
    (float("nan"), 32767, -(2**62), 0, False, 0),
    (float("-inf"), -32768, -1, 2**32 - 1, True, 255),
]


@functools.lru_cache(maxsize=None)
def two_kernels():
    """Y = X * alpha in one kernel, Z = Y + n in the next: one struct per kernel."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), alpha: T.float32, n: T.int32, Y: T.Tensor((N,), "float32"), Z: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 16), threads=16) as bx:
            for i in T.Parallel(16):
                if bx * 16 + i < N:
                    Y[bx * 16 + i] = X[bx * 16 + i] * alpha
        with T.Kernel(T.ceildiv(N, 8), threads=8) as bx:
            for i in T.Parallel(8):
                if bx * 8 + i < N:
                    Z[bx * 8 + i] = Y[bx * 8 + i] + T.cast(n, "float32")

    return main


@functools.lru_cache(maxsize=None)
def reversed_rows():
    """Shared memory (a dynamic shared memory launch tag), a 2-D launch and no scalar at all."""

    @T.prim_func
    def main(A: T.Tensor((3, 40), "float32"), B: T.Tensor((3, 40), "float32")):
        with T.Kernel(3, threads=(8, 5)) as bx:
            s = T.alloc_shared((40,), "float32")
            T.copy(A[bx, 0:40], s)
            for j in T.Parallel(40):
                B[bx, j] = s[39 - j]

    return main


@functools.lru_cache(maxsize=None)
def symbolic_rows():
    """C = A * 2 for a symbolic number of rows M: M reaches the kernel in the struct, the grid
    ceil(M / 4) is computed by the host per call."""
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, 16), "float32"), C: T.Tensor((M, 16), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
            for r, j in T.Parallel(4, 16):
                if bx * 4 + r < M:
                    C[bx * 4 + r, j] = A[bx * 4 + r, j] * 2.0

    return main


def half_scalar():
    @T.prim_func
    def main(A: T.Tensor((8,), "float16"), x: T.float16, B: T.Tensor((8,), "float16")):
        with T.Kernel(1, threads=8) as bx:
            for i in T.Parallel(8):
                B[i] = A[i] + x

    return main


# ------------------------------------------------------------------------------------- tests


def test_tvm_ffi_without_a_metal_runtime_names_the_fix():
    with pytest.raises(ValueError, match=r"execution_backend='tvm_ffi' needs TVM's Metal runtime.*use execution_backend='emulator'"):
        compile_tvm_ffi(reversed_rows())


def test_module_and_function_info_for_the_metal_runtime(metal_runtime):
    kernel = compile_tvm_ffi(mixed_scalars(), out_idx=[-2, -1])
    assert type(kernel.adapter).__name__ == "TVMFFIKernelAdapter"  # tilelang's own adapter
    (call,) = metal_runtime
    assert call["fmt"] == "metal"
    assert list(call["fmap"]) == ["main_kernel"] and list(call["smap"]) == ["main_kernel"]
    arg_types, tags = runtime_info(call["fmap"]["main_kernel"])
    assert str(call["fmap"]["main_kernel"].name) == "main_kernel"
    # buffers first (handles), then the scalars as the runtime packs them: narrow ints and bool as int32
    packed_as = {"alpha": "float32", "shift": "int32", "wide": "int64", "mask": "uint32", "flip": "int32", "small": "int32"}
    order, _ = host_launch(mixed_scalars(), "main_kernel")
    assert sorted(order) == sorted(MIXED_NAMES)
    assert arg_types == ["handle"] * 3 + [packed_as[name] for name in order]
    (device_func,) = kernel.artifact.device_mod.functions.values()
    assert tags == [str(t) for t in _host.kernel_launch_param_tags(device_func)]
    assert tags[:2] == ["blockIdx.x", "threadIdx.x"]
    msl = call["smap"]["main_kernel"]
    assert "constant __tlm_main_kernel_args& __tlm_args [[ buffer(3) ]]" in msl
    assert "constant float& alpha" not in msl
    assert call["source"]["metal"] == kernel.get_kernel_source()


@pytest.mark.parametrize("values", MIXED_VALUES, ids=["plain", "nan-extremes", "inf-all-ones"])
def test_argument_struct_form_runs_like_the_runtime_launches_it(metal_runtime, values):
    compile_tvm_ffi(mixed_scalars(), out_idx=[-2, -1])
    msl, info = metal_runtime[0]["smap"]["main_kernel"], metal_runtime[0]["fmap"]["main_kernel"]
    a = torch.randn(N)
    a[3] = float("inf")
    b, c = torch.full((N,), float("nan")), torch.full((N,), -1, dtype=torch.int64)
    run_as_runtime(mixed_scalars(), "main_kernel", msl, info, [a, b, c], dict(zip(MIXED_NAMES, values)))
    want_b, want_c = mixed_reference(a, *values)
    torch.testing.assert_close(b, want_b, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(c, want_c)


def test_standard_form_of_the_same_kernel_agrees_and_has_no_race(metal_runtime):
    standard = tilelang.compile(mixed_scalars(), out_idx=[-2, -1], target=E.plain_metal_target(), execution_backend="emulator")
    assert "constant float& alpha" in standard.get_kernel_source()  # the two signatures never mix
    compile_tvm_ffi(mixed_scalars(), out_idx=[-2, -1])
    assert "__tlm_args" not in standard.get_kernel_source() and "__tlm_args" in metal_runtime[0]["smap"]["main_kernel"]
    a = torch.randn(N)
    values = MIXED_VALUES[0]
    b, c = racecheck(standard, a, *values)
    want_b, want_c = mixed_reference(a, *values)
    torch.testing.assert_close(b, want_b, rtol=0, atol=0)
    assert torch.equal(c, want_c)


def test_each_kernel_of_a_module_gets_its_own_source_struct_and_launch(metal_runtime):
    compile_tvm_ffi(two_kernels(), out_idx=[-2, -1])
    (call,) = metal_runtime
    assert sorted(call["smap"]) == ["main_kernel", "main_kernel_1"]
    x = torch.randn(N)
    y, z = torch.full((N,), float("nan")), torch.full((N,), float("nan"))
    for name, tensors in (("main_kernel", [x, y]), ("main_kernel_1", [y, z])):  # host order
        msl = call["smap"][name]
        assert msl.count("[[kernel") == 1 and f"void {name}(" in msl
        arg_types, _ = runtime_info(call["fmap"][name])
        assert arg_types == ["handle", "handle", {"main_kernel": "float32", "main_kernel_1": "int32"}[name]]
        run_as_runtime(two_kernels(), name, msl, call["fmap"][name], tensors, {"alpha": -0.75, "n": -5})
    torch.testing.assert_close(y, x * -0.75, rtol=0, atol=0)
    torch.testing.assert_close(z, x * -0.75 - 5, rtol=0, atol=0)


def test_kernel_without_scalars_and_with_shared_memory(metal_runtime):
    compile_tvm_ffi(reversed_rows())
    (call,) = metal_runtime
    msl, info = call["smap"]["main_kernel"], call["fmap"]["main_kernel"]
    arg_types, tags = runtime_info(info)
    assert arg_types == ["handle", "handle"] and "__tlm_args" not in msl
    assert "tirx.use_dyn_shared_memory" in tags  # its extent is passed and ignored: the MSL sizes the array itself
    assert "threadgroup float" in msl
    a, b = torch.randn(3, 40), torch.full((3, 40), float("nan"))
    run_as_runtime(reversed_rows(), "main_kernel", msl, info, [a, b], {})
    assert torch.equal(b, a.flip(1))


def test_symbolic_size_travels_in_the_struct_and_the_grid_follows_it(metal_runtime):
    compile_tvm_ffi(symbolic_rows(), out_idx=[-1])  # one lowering for every size
    (call,) = metal_runtime
    msl, info = call["smap"]["main_kernel"], call["fmap"]["main_kernel"]
    assert runtime_info(info)[0] == ["handle", "handle", "int32"]
    for rows in (1, 7, 12):
        a, c = torch.randn(rows, 16), torch.full((rows, 16), float("nan"))
        run_as_runtime(symbolic_rows(), "main_kernel", msl, info, [a, c], {"M": rows})
        torch.testing.assert_close(c, a * 2.0, rtol=0, atol=0, msg=lambda m, rows=rows: f"rows={rows}: {m}")


@functools.lru_cache(maxsize=None)
def ragged_gemm():
    return E.gemm_direct_global(40, 72, 48, block_M=32, block_N=64, dtype="float16", out_dtype="float32", threads=128)


def test_metal4_gemm_in_the_runtime_form(metal_runtime):
    """Cooperative tensors (MPP) through the runtime module; ragged edges in M and N."""
    compile_tvm_ffi(ragged_gemm(), out_idx=[-1], target=E.metal4_target())
    (call,) = metal_runtime
    (name,) = call["smap"]
    msl = call["smap"][name]
    assert "MetalPerformancePrimitives" in msl and "__tlm_args" not in msl
    a, b = torch.randn(40, 48).half(), torch.randn(48, 72).half()
    c = torch.full((40, 72), float("nan"))
    run_as_runtime(ragged_gemm(), name, msl, call["fmap"][name], [a, b, c], {}, target_keys=("metal4",))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)


def test_half_scalar_is_refused_for_the_runtime(metal_runtime):
    with pytest.raises(CodegenError, match=r"^kernel main_kernel: scalar parameter x is float16, .*declare x as T.float32"):
        compile_tvm_ffi(half_scalar(), out_idx=[-1])


def test_print_is_refused_for_the_runtime(metal_runtime):
    @T.prim_func
    def main(A: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=8) as bx:
            T.print(A[0], msg="a")

    with pytest.raises(ValueError, match=r'^T.print runs only in the emulator: execution_backend="tvm_ffi" compiles without'):
        compile_tvm_ffi(main)
    assert not metal_runtime  # refused before a module is made


def test_emulator_checks_the_argument_struct_size(metal_runtime):
    compile_tvm_ffi(two_kernels(), out_idx=[-2, -1])
    kernel = emulator.compile_kernel(metal_runtime[0]["smap"]["main_kernel"])
    with pytest.raises(emulator.EmulatorLaunchError, match=r"__tlm_args.*expected its 8 bytes, got 4 bytes"):
        kernel.launch([torch.zeros(N), torch.zeros(N), b"\0" * 4], (3, 1, 1), (16, 1, 1))


def test_module_compiled_without_a_metal_runtime_is_not_launched(metal_runtime, monkeypatch):
    """TVM_COMPILE_FORCE_FALLBACK: device compile makes the MSL-only module even where the runtime
    is registered (tilelang.lower gives its source, tests/codegen/test_device_compile_source.py);
    tvm_ffi refuses to launch it, naming what to use instead."""
    monkeypatch.setenv("TVM_COMPILE_FORCE_FALLBACK", "1")
    with pytest.raises(CodegenError, match=r"^execution_backend='tvm_ffi' cannot launch this kernel: .*TVM_COMPILE_FORCE_FALLBACK is set.*use execution_backend='emulator'[^\n]*$"):
        compile_tvm_ffi(reversed_rows())
    assert not metal_runtime  # the runtime's factory was never asked for a module
