"""The table's compile choices per device and precision (table_choices)."""

from __future__ import annotations

import torch

from earth2studio_compile import MODEL_TABLE
from earth2studio_compile.table_choices import aurora_attention_backends

CPU = torch.device("cpu")


def test_aurora_takes_the_math_path_only_on_cuda_with_tf32_matmuls():
    cuda = torch.device("cuda")
    assert aurora_attention_backends(cuda, "tf32") == ("math",)
    assert aurora_attention_backends(cuda, "fp32") == ()
    assert aurora_attention_backends(cuda, "bf16") == ()
    assert aurora_attention_backends(CPU, "tf32") == ()
    spec = MODEL_TABLE["earth2studio.models.px.aurora.Aurora"]
    assert spec.attention_backends is aurora_attention_backends
