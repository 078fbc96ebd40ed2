"""``bench.kernels`` with PyTorch's fused attention kernels off: SDPA's math path.

The thirty-ninth session's lead for Aurora in TF32 (README): the fp32
memory-efficient attention kernel ran at ~11 TFLOP/s, far below both the TF32
matmuls and the bytes it moves. With the fused kernels off, SDPA decomposes into
two batched matmuls (TF32 under TF32 flags) and a softmax, which Inductor fuses.
Arguments are ``bench.kernels``'s; the flags hold for the whole process, eager
and compiled runs alike.

    python3 docs/bench/2026-11-30-h200-thirtyninth/sdpa_math.py --models aurora \
        --precision tf32 --runs compiled --steps 3 --json OUT.json
"""

from __future__ import annotations

import sys

from torch.nn.attention import SDPBackend, sdpa_kernel

from earth2studio_compile.tools.bench import kernels

if __name__ == "__main__":
    with sdpa_kernel([SDPBackend.MATH]):
        sys.exit(kernels.main(sys.argv[1:]))
