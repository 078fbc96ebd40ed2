"""Stub, NOT flash-attn: only satisfies earth2studio's `import flash_attn` check.

flash-attn needs CUDA kernels (flash_attn_2_cuda) that cannot be built on a CPU
machine. The tiny models use anemoi's scaled_dot_product_attention path; anemoi's
FlashAttentionWrapper rejects this version (< 2.6) if it were ever selected.
"""
__version__ = "0.0.0+stub"
