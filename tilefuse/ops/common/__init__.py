"""Shared building blocks of the op variants: GEMM device helpers, launch config, argument checks
(importing it defines Triton kernels: ``import tilefuse`` sets ``TRITON_INTERPRET=1`` on CPU first)."""

from .checks import SUPPORTED_DTYPES, check_divisible, check_dtypes, check_inner_dim, check_matrix, check_same_device
from .config import Config, check_config_fits, default_config
from .gemm import ensure_triton_allocator, gemm_layout, matmul

__all__ = [
    "SUPPORTED_DTYPES", "Config", "check_config_fits", "check_divisible", "check_dtypes", "check_inner_dim",
    "check_matrix", "check_same_device", "default_config", "ensure_triton_allocator", "gemm_layout", "matmul",
]
