"""CLI error paths: exit status 2, one line on stderr, no traceback (--debug shows it); --help
documents every flag with its default; path-dependent defaults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tilelang_metal.cli import _parser, main, validate

SMALL = ["--m", "64", "--n", "64", "--k", "64"]


def _error_line(capsys, argv):
    code = None
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse refuses the flag itself
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--m", "0"], "--m: 0 must be a positive integer"),
        (["run", "--k", "-5"], "--k: -5 must be a positive integer"),
        (["lower", "--n", "x"], "--n: 'x' is not an integer"),
        (["lower", "--block-m", "0"], "--block-m: 0 must be a positive integer"),
        (["lower", "--threads", "0"], "--threads: 0 must be a positive integer"),
        (["lower", "--swizzle", "-1"], "--swizzle: -1 must be 0"),
        (["run", "--dtype", "int8"], "invalid choice: 'int8'"),
        (["run", "--out-dtype", "float64"], "invalid choice: 'float64'"),
        (["lower", "--path", "direct_global", "--epilogue", "gelu_tanh"], "add --path shared"),
        # --epilogue with --path auto is kernels.matmul's epilogue (it was refused as pinning the shared kernel)
        (["lower", "--path", "shared", "--epilogue", "residual"], "--epilogue residual is kernels.matmul's (--path auto) only"),
        (["lower", "--path", "shared", "--batch", "2"], "--batch applies to --path auto only"),
        (["lower", *SMALL, "--epilogue", "scale"], "matmul epilogue='scale' needs alpha="),
        (["lower", "--block-k", "16"], "--block-k pins one kernel, but --path auto picks the kernel by shape and chip; add --path shared"),
        (["lower", "--path", "direct_global", "--block-k", "16"], "--block-k applies to --path shared only"),
        (["run", "--threads", "256"], "--threads pins one kernel, but --path auto picks the kernel by shape and chip; add --path direct_global"),
        (["lower", *SMALL, "--path", "shared", "--swizzle", "3"], "power-of-two panel size, got 3"),
        (["lower", "--bits", "4", "--trans-a"], "--trans-a applies to the fp GEMMs, not to --bits"),
        (["lower", "--bits", "4", "--path", "shared"], "--path applies to the fp GEMMs, not to --bits"),
        (["lower", "--group-size", "32"], "--group-size applies with --bits only"),
        (["profile", "--bits", "4"], "--bits applies to lower and run only"),
        (["lower", "--bits", "7"], "invalid choice: 7"),
        (["lower", "--bits", "4", "--k", "100"], "needs K to be a multiple of group_size=64"),
        (["lower", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_flags_exit_2_with_one_line(capsys, argv, needle):
    assert needle in _error_line(capsys, argv)


def test_kernel_error_is_one_line_and_debug_shows_the_traceback(capsys):
    line = _error_line(capsys, ["lower", *SMALL, "--path", "direct_global", "--threads", "100"])
    assert "threads=100 is not a multiple of 32" in line and "threads=96" in line
    assert main(["lower", *SMALL, "--path", "direct_global", "--threads", "100", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: gemm_direct_global threads=100" in err  # the builder's check, before lowering


def test_unavailable_backend_is_one_line(capsys):
    pytest.importorskip("torch")
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("torch backend is available here")
    line = _error_line(capsys, ["run", *SMALL, "--backend", "torch"])
    assert "a Mac's GPU through torch's MPS backend" in line and "--backend emulator" in line


def test_help_documents_every_flag_with_its_default():
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings} has no help"
            assert "default" in action.help, f"{name} {action.option_strings} does not show its default"


def test_help_is_fast_and_imports_nothing_heavy():
    code = "import sys, runpy; sys.argv=['x','run','--help']\ntry:\n  runpy.run_module('tilelang_metal', run_name='__main__')\nexcept SystemExit as e:\n  assert e.code == 0\nprint(sorted(m for m in ('tilelang','torch','tvm_ffi') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("[]")
    assert "--out-dtype" in proc.stdout


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_output_dtype_defaults_to_input_dtype(dtype):
    args = validate(_parser().parse_args(["run", "--dtype", dtype]))
    assert args.out_dtype == dtype
    assert validate(_parser().parse_args(["run", "--dtype", dtype, "--out-dtype", "float32"])).out_dtype == "float32"


def test_path_dependent_defaults():
    direct = validate(_parser().parse_args(["lower", "--path", "direct_global"]))
    shared = validate(_parser().parse_args(["lower", "--path", "shared"]))
    assert (direct.block_m, direct.block_n, direct.threads, direct.swizzle, direct.epilogue) == (64, 128, 128, 0, "none")
    assert (shared.block_n, shared.block_k, shared.epilogue) == (64, 32, "none")
