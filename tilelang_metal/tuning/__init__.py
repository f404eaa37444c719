"""Tuning: the autotuner over the plugin's GEMM configurations (ranks with performance/, builds kernels/)."""
