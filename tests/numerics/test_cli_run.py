"""`python -m tilelang_metal run` in the emulator: the output dtype follows the input, the kernel
is built inside the compile timing (the adapter's warm_up), and the result is checked."""

from __future__ import annotations

import tilelang

from tilelang_metal import examples
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
