"""Fused kernels behind seqzoo's encoders: a readable PyTorch reference plus compiled fast paths."""

from seqzoo.kernels.qrnn_pool import pool_backend, qrnn_layer, qrnn_pool, window_linear
from seqzoo.kernels.qrnn_pool_reference import POOLINGS, qrnn_pool_reference

__all__ = ["POOLINGS", "pool_backend", "qrnn_layer", "qrnn_pool", "qrnn_pool_reference", "window_linear"]
