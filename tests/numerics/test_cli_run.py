"""`python -m tilelang_metal run` in the emulator: the output dtype follows the input, the kernel
is built inside the compile timing (the adapter's warm_up), and the result is checked."""

from __future__ import annotations

import tilelang

from tilelang_metal import kernels as examples
from tilelang_metal.cli import main


def test_run_bfloat16_defaults_output_to_bfloat16_and_passes(capsys):
    code = main(["run", "--m", "40", "--n", "72", "--k", "24", "--dtype", "bfloat16", "--target", "metal", "--backend", "emulator"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "bfloat16->bfloat16" in out and "OK" in out


def test_warm_up_builds_every_kernel_before_the_first_call():
    func = examples.gemm_direct_global(32, 32, 16, 32, 32, threads=32)
    kernel = tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator")
    adapter = kernel.adapter
    assert not adapter.__dict__.get("_kernels")
    adapter.warm_up()
    assert set(adapter.__dict__["_kernels"]) == {launch.kernel_name for launch in adapter.call.launches}


def test_shared_path_with_block_swizzle_matches_torch():
    """T.use_swizzle in the shared-staging idiom (allocations and shared pointers sit between the
    launch attributes): tiles remapped, every tile written once, partial tiles in both directions."""
    import torch

    M, N, K = 136, 200, 40
    func = examples.gemm_shared(M, N, K, 32, 64, 16, threads=128, out_dtype="float32", epilogue="bias", swizzle_panel=2)
    kernel = tilelang.compile(func, out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator")
    assert "__tile_x" in kernel.get_kernel_source()
    torch.manual_seed(1)
    a, b, bias = torch.randn(M, K).half(), torch.randn(K, N).half(), torch.randn(N)
    torch.testing.assert_close(kernel(a, b, bias), a.float() @ b.float() + bias, rtol=1e-3, atol=1e-3)


def test_cli_runs_the_shared_path_with_swizzle(capsys):
    code = main(["run", "--m", "72", "--n", "136", "--k", "24", "--path", "shared", "--swizzle", "4", "--epilogue", "relu", "--target", "metal", "--backend", "emulator"])
    assert code == 0, capsys.readouterr()


def test_tilelang_info_lines_only_with_verbose(capfd):
    """TileLang logs 'TileLang begins to compile kernel ...' at INFO: the CLI keeps its output to its own
    lines unless --verbose."""
    argv = ["run", "--m", "32", "--n", "64", "--k", "16", "--target", "metal", "--backend", "emulator"]
    assert main(argv) == 0
    quiet = capfd.readouterr()
    assert "TileLang begins to compile" not in quiet.out + quiet.err and "relative error" in quiet.out
    assert main(["run", "--m", "32", "--n", "64", "--k", "24", "--target", "metal", "--backend", "emulator", "--verbose"]) == 0
    loud = capfd.readouterr()  # another K: a kernel that is compiled, not served from the JIT memo
    assert "TileLang begins to compile" in loud.out + loud.err


def test_auto_path_runs_transposed_operands(capsys):
    """`--path auto` with --trans-a / --trans-b: a GEMV-sized problem stored transposed takes the
    tiled GEMM and the run checks it against torch."""
    problem = ["--m", "3", "--n", "72", "--k", "40", "--trans-a", "--trans-b", "--chip", "M4"]
    code = main(["run", *problem, "--backend", "emulator"])
    out = capsys.readouterr().out
    assert code == 0 and "OK" in out, out
    assert main(["lower", *problem, "--explain"]) == 0
    explained = capsys.readouterr().out
    assert "matmul 3x72x40 TT float16->float16 on M4 (metal): gemm" in explained and "stored transposed" in explained, explained


def test_quantized_lower_explains_the_route_and_run_matches_torch(capsys):
    """--bits: kernels.quantized_matmul's kernel for the shape, its choice in --explain (vector for
    decoding's few rows, tiled for prefill), checked against x @ dequantize(w).T."""
    assert main(["lower", "--bits", "4", "--m", "40", "--n", "64", "--k", "128", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "// quantized_matmul 4-bit, group 64: tiled kernel (M=40 > 8" in out and "mpp::tensor_ops::matmul2d" in out  # metal4
    code = main(["run", "--bits", "8", "--group-size", "32", "--m", "3", "--n", "40", "--k", "96", "--explain", "--backend", "emulator"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "// quantized_matmul 8-bit, group 32: vector kernel (M=3 <= 8" in out and "OK" in out
