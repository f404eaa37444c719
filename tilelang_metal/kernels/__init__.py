"""Ready kernels above the compiler: the GEMMs (direct-global, shared staging with fused epilogues,
staged), row softmax and row reductions, and attention (flash attention forward, flash decoding). The compiler never imports this
package (`tests/unit/test_layers.py`); the CLI, the autotuner, the benchmarks and users do.

    from tilelang_metal import kernels
    func = kernels.gemm_direct_global(256, 256, 256)                      # a T.prim_func
    attn = kernels.flash_attention_forward(1, 2, 128, 64, execution_backend="emulator")  # compiled
"""

from ..target import metal4_target, plain_metal_target
from .attention import (
    MASKED_SCORE,
    check_attention_config,
    flash_attention_forward,
    flash_attention_program,
    flash_decoding_program,
)
from .gemm import ALPHA, BETA, EPILOGUES, gemm_direct_global, gemm_shared, gemm_staged
from .reduce_rows import reduce_rows, row_max, row_sum
from .softmax import softmax

__all__ = [
    "ALPHA",
    "BETA",
    "EPILOGUES",
    "MASKED_SCORE",
    "check_attention_config",
    "flash_attention_forward",
    "flash_attention_program",
    "flash_decoding_program",
    "gemm_direct_global",
    "gemm_shared",
    "gemm_staged",
    "metal4_target",
    "plain_metal_target",
    "reduce_rows",
    "row_max",
    "row_sum",
    "softmax",
]
