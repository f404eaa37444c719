"""Softmax and row sum / max on 4096 columns (one block per row) and 4099 (two blocks, the last of
3 columns), with non-finite rows: 5-10 s each in the emulator."""

import pytest

from tests.numerics import test_row_kernels as rows  # a module: its test functions are not collected here


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
@pytest.mark.parametrize("shape", [(3, 4099), (2, 4096)])
def test_wide_rows_match_torch(name, shape):
    rows.test_row_kernels_match_torch(name, *shape)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
def test_wide_non_finite_rows_match_torch(name):
    rows.test_non_finite_rows_match_torch(name, 4, 4099)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
def test_two_column_blocks_under_racecheck(name):
    """The online pass over two blocks and softmax's second pass (re-reading X) under the race checker."""
    import torch

    from tilelang_metal.emulator import racecheck

    torch.manual_seed(3)
    x = torch.randn(1, 4099)
    out = racecheck(rows.row_kernel(name, 1, 4099), x, seeds=(0, 1))
    torch.testing.assert_close(out, rows.reference(name, x), rtol=1e-5, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
def test_ready_row_kernels_lower_without_buffer_init_warnings(name, capfd):
    """A ready kernel must not warn its user: softmax over two column blocks read its running
    maximum in the first block's (discarded) select operand before writing it, and tilelang's
    VerifyBufferInit printed 'row_max is read before anything writes it' at every compile."""
    import tilelang

    from tilelang_metal import kernels

    func = kernels.softmax(2, 4099) if name == "softmax" else kernels.reduce_rows(2, 4099, name)
    tilelang.lower(func, target="metal")
    captured = capfd.readouterr()
    assert "read before" not in captured.out + captured.err
