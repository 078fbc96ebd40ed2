"""earth2studio-compile: torch.compile for Earth2Studio rollouts, safely.

Compile the tensor-only core network of Earth2Studio models in place, keep the
coordinate bookkeeping eager, and fall back to eager at the first failing call.

The workflows live in :mod:`earth2studio_compile.run` (imported on demand: importing
``earth2studio.run`` takes several seconds).
"""

from earth2studio_compile import _torch
from earth2studio_compile.aot import build
from earth2studio_compile.artifacts.background import cancel as cancel_builds
from earth2studio_compile.artifacts.background import wait as wait_for_builds
from earth2studio_compile.cache import cache_root
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.models import MODEL_TABLE, ModelSpec, register_model
from earth2studio_compile.options import CompileOptions
from earth2studio_compile.planning import plan
from earth2studio_compile.report import CompileReport, RegionReport
from earth2studio_compile.resident import release
from earth2studio_compile.session import CompileSession, example_input

__version__ = "0.1.0"

# Inductor's CPU compiles import torch.utils.cpp_extension, which warns about CUDA
# on machines without a GPU (see _torch.quiet_cpp_extension_log).
_torch.quiet_cpp_extension_log()

__all__ = [
    "MODEL_TABLE",
    "CompileOptions",
    "CompileReport",
    "CompileSession",
    "ModelSpec",
    "OverlappedIO",
    "RegionReport",
    "build",
    "cache_root",
    "cancel_builds",
    "example_input",
    "plan",
    "register_model",
    "release",
    "wait_for_builds",
]
