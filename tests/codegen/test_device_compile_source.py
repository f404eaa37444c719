"""`tilelang.lower(..., enable_device_compile=True)` on a host without TVM's Metal runtime (Linux,
or TVM_COMPILE_FORCE_FALLBACK set, TVM's switch for its fallback module) gives the MSL to inspect,
the same text as without device compile, as TileLang's in-tree backend does there (the property of
TileLang's Metal suite `test_metal_address_space.py`, written for this repo): threadgroup views of
the shared pool keep their address space in the declaration and in every pointer cast. Launching
such a module is refused in tests/numerics/test_tvm_ffi_route.py."""

from __future__ import annotations

import functools
import re

import pytest
import tilelang
import tilelang.language as T
import torch
from tilelang import tvm

SIZE, TILE, K_TILE = 64, 16, 8
ADDRESS_SPACES = ("device", "threadgroup", "thread", "constant")


@functools.lru_cache(maxsize=None)
def shared_gemm():
    """A, B and C all in threadgroup memory: three typed views of one shared pool."""

    @T.prim_func
    def main(A: T.Tensor((SIZE, SIZE), "float16"), B: T.Tensor((SIZE, SIZE), "float16"), C: T.Tensor((SIZE, SIZE), "float32")):
        with T.Kernel(SIZE // TILE, SIZE // TILE, threads=64) as (bx, by):
            A_s = T.alloc_shared((TILE, K_TILE), "float16")
            B_s = T.alloc_shared((K_TILE, TILE), "float16")
            C_s = T.alloc_shared((TILE, TILE), "float32")
            T.clear(C_s)
            for k in T.serial(SIZE // K_TILE):
                T.copy(A[by * TILE, k * K_TILE], A_s)
                T.copy(B[k * K_TILE, bx * TILE], B_s)
                T.gemm(A_s, B_s, C_s)
            T.copy(C_s, C[by * TILE, bx * TILE])

    return main


def lowered_source(device_compile: bool) -> str:
    target = tvm.target.Target("metal", tvm.target.Target("llvm"))
    with target:
        artifact = tilelang.lower(shared_gemm(), target=target, target_host="llvm", enable_device_compile=device_compile)
    return artifact.kernel_source


@pytest.mark.parametrize("force_fallback", [None, "1"], ids=["no-runtime", "forced-fallback"])
def test_device_compile_gives_the_same_msl_as_source_only(monkeypatch, force_fallback):
    if force_fallback is None:
        monkeypatch.delenv("TVM_COMPILE_FORCE_FALLBACK", raising=False)
    else:
        monkeypatch.setenv("TVM_COMPILE_FORCE_FALLBACK", force_fallback)
    compiled = lowered_source(device_compile=True)
    assert "[[kernel" in compiled
    assert compiled == lowered_source(device_compile=False)


def test_shared_views_keep_their_address_space():
    source = lowered_source(device_compile=False)
    views = re.findall(r"threadgroup half\* (\w+) = \(threadgroup half\*\)", source)
    assert len(views) >= 2, source
    casts = re.findall(r"\(((?:const )?\w+ ?\w*)\*\)", source)
    assert casts, source
    unqualified = [cast for cast in casts if cast.replace("const ", "").split()[0] not in ADDRESS_SPACES]
    assert unqualified == [], source


def test_shared_gemm_runs_in_the_emulator():
    kernel = tilelang.compile(shared_gemm(), out_idx=[-1], target="metal", execution_backend="emulator")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(SIZE, SIZE, generator=g).half()
    b = torch.randn(SIZE, SIZE, generator=g).half()
    torch.testing.assert_close(kernel(a, b), a.float() @ b.float(), rtol=1e-3, atol=1e-3)
