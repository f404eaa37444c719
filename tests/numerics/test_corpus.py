"""Whatever lowers with the in-tree Metal backend lowers with the plugin, and runs right."""

import pytest
import tilelang
import torch
from corpus_kernels import CORPUS
from gemm_support import lower_source

import tilelang_metal


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_kernel_lowers_and_matches_torch(name, metal4, plain_metal):
    func, makers, reference = CORPUS[name]()
    tilelang_metal.deactivate()
    try:
        in_tree = lower_source(func, plain_metal)  # the in-tree backend must lower it (corpus premise)
    finally:
        tilelang_metal.activate()
    assert "tilelang_metal" not in in_tree
    kernel = tilelang.compile(func, out_idx=[-1], target=plain_metal, execution_backend="emulator")
    for source in (kernel.get_kernel_source(), lower_source(func, metal4)):  # plain metal: the kernel's own
        assert source.startswith("// tilelang_metal")
    torch.manual_seed(0)
    inputs = [make() for make in makers]
    out = kernel(*inputs)
    ref = reference(*inputs)
    if ref.dtype.is_floating_point:
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-3, atol=2e-3)
    else:
        assert torch.equal(out, ref)
