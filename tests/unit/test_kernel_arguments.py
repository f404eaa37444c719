"""Every public builder of `tilelang_metal.kernels` validates every size and option argument before
it builds any TileLang: a float, a bool, 0, a negative number or a value the kernel cannot divide
by is a one-line ValueError (MetalLoweringError for attention) naming the argument, never TVM's
`Check failed: pb->value != 0` / `TIR For nodes require a scalar integer` or a ZeroDivisionError
after a page of builder code. A new builder with no row in BUILDERS fails
`test_every_public_builder_has_a_row`. No kernel is compiled: every call here is refused first."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.kernels import metal4_target

# Public callables of tilelang_metal.kernels that take no sizes or options to validate.
NOT_BUILDERS = {
    "gelu_tanh": "a TIR expression helper for epilogues",
    "metal4_target": "a target",
    "plain_metal_target": "a target",
}

# The bad values every size gets; a row's `fixed` maps an argument to bad values of its own.
SIZE_BAD = (2.5, True, 0, -3)
SIZE_BAD_ZERO_OK = (2.5, True, -3)  # sizes where 0 is meaningful (GEMV's K: C = 0)
OPTION_BAD = (1.5, False, -1)  # counts >= 0 (pipeline stages, swizzle panels)


def row(builder, args, sizes=(), *, zero_ok=(), options=(), fixed=None, kwargs=None):
    """builder(*args, **kwargs) is valid; each name of `sizes` / `zero_ok` / `options` (an argument
    of the builder, positional in `args` or a keyword) gets its class's bad values, `fixed` more."""
    cases = {name: SIZE_BAD for name in sizes} | {name: SIZE_BAD_ZERO_OK for name in zero_ok}
    cases |= {name: OPTION_BAD for name in options}
    for name, bad in (fixed or {}).items():
        cases[name] = cases.get(name, ()) + tuple(bad)
    return builder, tuple(args), dict(kwargs or {}), cases


GEMM_TILE = ("M", "N", "K", "block_M", "block_N", "threads")
BUILDERS = {
    "gemm_direct_global": row(kernels.gemm_direct_global, (64, 64, 64), GEMM_TILE, options=("swizzle_panel",),
                              fixed={"threads": (48, 2048), "trans_A": (1, "yes"), "accumulate": (0,), "swizzle_order": ("zigzag",)}),
    "gemm_bias_gelu": row(kernels.gemm_bias_gelu, (64, 64, 64), GEMM_TILE, fixed={"threads": (100,)}),
    "gemm_shared": row(kernels.gemm_shared, (64, 64, 64), GEMM_TILE + ("block_K",), options=("num_stages", "swizzle_panel"),
                       fixed={"threads": (40,), "c_in_shared": (1,), "epilogue": ("tanh",), "shared_scope": ("local",),
                              "trans_B": (None,)}),
    "gemm_staged": row(kernels.gemm_staged, (64, 64, 64), GEMM_TILE + ("block_K",), options=("num_stages", "swizzle_panel", "row_pad"),
                       fixed={"threads": (100,), "keep_staging": ("no",)}),
    "gemm_split_k": row(kernels.gemm_split_k, (32, 32, 64, 2), ("M", "N", "K", "splits", "block_m", "block_n", "block_k", "threads",
                                                                 "reduce_threads"),
                        options=("num_stages",), fixed={"block_k": (12,), "threads": (64.0,), "reduce_threads": (4096,),
                                                        "batch": (2.5, True, 0)}),
    "gemv_small_m": row(kernels.gemv_small_m, (2, 4, 4), ("M", "N", "rows", "simdgroups", "n_lanes", "vec"), zero_ok=("K",),
                        fixed={"M": (9,), "n_lanes": (3,), "vec": (3,), "simdgroups": (64,), "batch": (2.5, True, 0)}),
    "gemv_small_n": row(kernels.gemv_small_n, (4, 2, 4), ("M", "N", "rows", "vec"), zero_ok=("K",), fixed={"N": (9,), "vec": (8,),
                                                                                                           "rows": (33,), "batch": (2.5, 0)}),
    "matmul_config": row(kernels.matmul_config, (64, 64, 64), ("M", "N", "K"), fixed={"M": (2**31,), "trans_A": (1,),
                                                                                       "target": ("cuda",), "dtype": ("int8",),
                                                                                       "batch": (2.5, True, 0)}),
    "matmul": row(kernels.matmul, (64, 64, 64), ("M", "N", "K"), fixed={"trans_B": (0,), "out_dtype": ("float64",), "batch": (2.5, True, 0)}),
    "matmul_program": row(kernels.matmul_program, (kernels.matmul_config(64, 64, 64, chip="M5"),),
                          fixed={"choice": ((64, 64, 64),), "trans_A": (1,)}),
    "softmax": row(kernels.softmax, (4, 8), ("rows", "cols", "threads"), fixed={"threads": (96,), "dtype": ("int32",)}),
    "reduce_rows": row(kernels.reduce_rows, (4, 8), ("rows", "cols", "threads"), fixed={"kind": ("mean",), "threads": (48,)}),
    "row_sum": row(kernels.row_sum, (4, 8), ("rows", "cols", "threads")),
    "row_max": row(kernels.row_max, (4, 8), ("rows", "cols", "threads")),
    "flash_attention_program": row(kernels.flash_attention_program, (1, 2, 64, 64),
                                   ("batch", "heads", "seq_len", "head_dim", "kv_heads", "seq_len_kv", "block_m", "block_n", "threads"),
                                   options=("num_stages",),
                                   fixed={"head_dim": (36,), "block_n": (20,), "block_m": (12,), "threads": (48,), "kv_heads": (3,),
                                          "causal": (1, "yes"), "layout": ("sbhd",), "dtype": ("float64",), "dataflow": ("vector",),
                                          "mask": ("causal", True, "float16"), "sinks": (1, "float16", None)}),
    "flash_attention_forward": row(kernels.flash_attention_forward, (1, 2, 64, 64), ("batch", "heads", "seq_len", "head_dim", "block_m",
                                                                                       "block_n", "threads"),
                                   fixed={"causal": (0,), "seq_len_kv": (0, 2.5), "mask": ("causal",), "sinks": (1,)}),
    "flash_decoding_program": row(kernels.flash_decoding_program, (1, 4, 2, 64, 64),
                                  ("batch", "heads", "kv_heads", "seq_len_kv", "head_dim", "block_h", "block_n", "threads", "num_split"),
                                  fixed={"kv_heads": (3,), "head_dim": (36,), "dataflow": ("tiled",), "mask": ("causal", False),
                                         "sinks": (1, "bfloat16")}),
    # the GEMM dataflows read block_h (the vector one does not): block_h 0 was a ZeroDivisionError there
    "flash_decoding_program[staged]": row(kernels.flash_decoding_program, (1, 4, 2, 64, 64), ("block_h", "block_n", "threads"),
                                          kwargs={"dataflow": "staged"}, fixed={"block_h": (12,), "block_n": (20,), "threads": (48,)}),
    "flash_decoding_program[direct]": row(kernels.flash_decoding_program, (1, 4, 2, 64, 64), ("block_h",),
                                          kwargs={"dataflow": "direct", "target": metal4_target()}),
    "norm_program": row(kernels.norm_program, ("rms_norm", 4, 8), ("rows", "cols", "threads"), kwargs={"dtype": "float16", "eps": 1e-5},
                        fixed={"kind": ("l3",), "threads": (48,), "dtype": ("int8",)}),
    "rms_norm": row(kernels.rms_norm, (4, 8), ("rows", "cols", "threads"), kwargs={"dtype": "float16", "eps": 1e-5}),
    "layer_norm": row(kernels.layer_norm, (4, 8), ("rows", "cols", "threads"), kwargs={"dtype": "float16", "eps": 1e-5}),
    "rope_program": row(kernels.rope_program, (1, 2, 2, 8), ("batch", "seq_len", "heads", "head_dim", "threads"),
                        kwargs={"dtype": "float16"}, fixed={"head_dim": (7,), "offset": (2.5, True), "threads": (48,)}),
    "rope": row(kernels.rope, (1, 2, 2, 8), ("batch", "seq_len", "heads", "head_dim", "threads"), kwargs={"dtype": "float16"},
                fixed={"offset": (2.5,)}),
    "quantize": row(kernels.quantize, (torch.ones(4, 64),), fixed={"bits": (2.5, True, 0, 7), "group_size": (2.5, True, 0, 48)}),
    "dequantize": row(kernels.dequantize, kernels.quantize(torch.ones(4, 64)), fixed={"bits": (2.5, True, 0, 7),
                                                                                      "group_size": (2.5, True, 0, 48)}),
    "quantized_matmul_program": row(kernels.quantized_matmul_program, (4, 8, 128), ("M", "N", "K", "bits", "group_size"),
                                    kwargs={"bits": 4, "group_size": 64},
                                    fixed={"K": (100,), "bits": (7,), "group_size": (48,), "route": ("x",), "transpose": (1,),
                                           "dtype": ("int8",)}),
    "quantized_matmul": row(kernels.quantized_matmul, (4, 8, 128), ("M", "N", "K", "bits", "group_size"),
                            kwargs={"bits": 4, "group_size": 64}, fixed={"route": ("x",)}),
    "quantized_matmul_route": row(kernels.quantized_matmul_route, (4,), ("M",), fixed={"transpose": (1,)}),
    "gemm_batched": row(kernels.gemm_batched, (64, 64, 64), GEMM_TILE + ("block_K",), options=("num_stages",),
                        kwargs={"batch": 2}, fixed={"batch": (2.5, True, 0), "shared_B": (1,), "epilogue": ("tanh",),
                                                    "threads": (100,)}),
    "check_attention_config": row(kernels.check_attention_config, (64, 32, 32, "float16", 64), ("head_dim", "block_m", "block_n", "threads"),
                                  fixed={"head_dim": (12,), "threads": (48,)}),
}


def _cases():
    for key, (builder, args, kwargs, cases) in BUILDERS.items():
        for name, bad_values in cases.items():
            for bad in bad_values:
                yield pytest.param(key, name, bad, id=f"{key}-{name}={bad!r}")


def _call_with(builder, args, kwargs, name, value):
    signature = inspect.signature(builder).parameters
    params = list(signature)
    args, kwargs = list(args), dict(kwargs)
    if name not in params:  # an option passed through **options (row_sum's threads), else a row naming no argument
        # not a ValueError: `params.index` of a missing name passed as a refusal that names it
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()), f"{builder.__name__} has no argument {name}"
        return builder(*args, **kwargs, **{name: value})
    position = params.index(name)
    if position < len(args):
        args[position] = value
    else:
        kwargs[name] = value
    return builder(*args, **kwargs)


def test_every_public_builder_has_a_row():
    """A public callable of tilelang_metal.kernels is either a builder with a row here or named in
    NOT_BUILDERS: a new kernel without argument checks cannot slip in unnoticed."""
    public = {name for name in kernels.__all__ if callable(getattr(kernels, name)) and not inspect.isclass(getattr(kernels, name))}
    covered = {key.split("[")[0] for key in BUILDERS} | set(NOT_BUILDERS)
    assert public - covered == set(), f"public builders without a row in BUILDERS: {sorted(public - covered)}"
    for key, (builder, args, kwargs, cases) in BUILDERS.items():
        params = inspect.signature(builder).parameters
        sizes = [name for name, p in params.items() if p.annotation in (int, int | None, "int", "int | None")]
        missing = [name for name in sizes if name not in cases and "[" not in key]
        assert not missing, f"{key}: integer arguments without bad values in its row: {missing}"


@pytest.mark.parametrize("key,name,bad", list(_cases()))
def test_bad_arguments_are_refused_in_one_line_naming_them(key, name, bad):
    builder, args, kwargs, _ = BUILDERS[key]
    with pytest.raises(ValueError) as info:
        _call_with(builder, args, kwargs, name, bad)
    message = str(info.value)
    assert "\n" not in message, message
    assert re.search(rf"\b{re.escape(name)}\b", message), f"the message does not name {name}: {message}"
    assert "Check failed" not in message and "TIR" not in message, message


COMPILES = {"matmul", "flash_attention_forward", "rms_norm", "layer_norm", "rope", "quantized_matmul"}  # their valid call compiles a kernel: left to the numerics tests


@pytest.mark.parametrize("key", [key for key in BUILDERS if key not in COMPILES])
def test_each_rows_valid_call_builds(key):
    """The row's own arguments pass, so each refusal above comes from the one bad value."""
    builder, args, kwargs, _ = BUILDERS[key]
    builder(*args, **kwargs)


def test_symbolic_problem_sizes_stay_symbolic():
    """A T.dynamic M, N or K of a GEMM (and the large side and K of a GEMV) is checked per call by
    the calling convention, not refused as a non-integer; a split-K plan needs K's value."""
    import tilelang.language as T

    m, k = T.dynamic("m"), T.dynamic("k")
    kernels.gemm_direct_global(m, 64, 64)
    kernels.gemm_staged(m, 64, k)
    with pytest.raises(ValueError, match=r"^gemm_direct_global K=k must be an integer"):  # a T.gemm tile extent on that path
        kernels.gemm_direct_global(64, 64, k)
    kernels.gemv_small_m(2, m, k)
    with pytest.raises(ValueError, match=r"^gemm_split_k K=k must be an integer \(a Var was given\)"):
        kernels.gemm_split_k(64, 64, k, 2)
    with pytest.raises(ValueError, match=r"^gemv_small_m M=m must be an integer"):
        kernels.gemv_small_m(m, 64, 64)
