"""Ready kernels above the compiler: the GEMMs (direct-global, shared staging with fused epilogues,
staged, split-K), GEMV, the shape-aware `matmul` dispatch over them, row softmax and row
reductions, and attention (flash attention forward, flash decoding). The compiler never imports this
package (`tests/unit/test_layers.py`); the CLI, the autotuner, the benchmarks and users do.

    from tilelang_metal import kernels
    func = kernels.gemm_direct_global(256, 256, 256)                      # a T.prim_func
    choice = kernels.matmul_config(1, 4096, 4096, chip="M5")             # route "gemv", with reasons
    attn = kernels.flash_attention_forward(1, 2, 128, 64, execution_backend="emulator")  # compiled
"""

from ..target.normalize import metal4_target, plain_metal_target
from .attention import MASKED_SCORE, flash_attention_forward, flash_attention_program, flash_decoding_program
from .attention_config import check_attention_config
from .gemm import ALPHA, BETA, EPILOGUES, gelu_tanh, gemm_bias_gelu, gemm_direct_global, gemm_shared, gemm_staged
from .gemm_batched import gemm_batched
from .gemv import GEMV_MAX_ROWS, gemv_small_m, gemv_small_n
from .matmul import MatmulChoice, matmul, matmul_config, matmul_program
from .reduce_rows import reduce_rows, row_max, row_sum
from .softmax import softmax
from .split_k import gemm_split_k
from .quantize import dequantize, quantize
from .quantized_matmul import quantized_matmul, quantized_matmul_program, quantized_matmul_route
from .norms import layer_norm, norm_program, rms_norm
from .rope import rope, rope_program

__all__ = [
    "ALPHA",
    "BETA",
    "EPILOGUES",
    "GEMV_MAX_ROWS",
    "MASKED_SCORE",
    "MatmulChoice",
    "check_attention_config",
    "flash_attention_forward",
    "flash_attention_program",
    "flash_decoding_program",
    "gelu_tanh",
    "gemm_bias_gelu",
    "gemm_batched",
    "gemm_direct_global",
    "gemm_shared",
    "gemm_split_k",
    "gemm_staged",
    "gemv_small_m",
    "gemv_small_n",
    "matmul",
    "matmul_config",
    "matmul_program",
    "metal4_target",
    "plain_metal_target",
    "reduce_rows",
    "row_max",
    "row_sum",
    "softmax",
    "quantize",
    "dequantize",
    "quantized_matmul",
    "quantized_matmul_program",
    "quantized_matmul_route",
    "rms_norm",
    "layer_norm",
    "norm_program",
    "rope",
    "rope_program",
]
