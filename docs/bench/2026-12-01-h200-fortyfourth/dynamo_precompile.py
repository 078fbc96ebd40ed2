"""Dynamo's precompile (``torch.compile(fn, fullgraph=True).aot_compile``, torch
>= 2.10, experimental) against ``torch.compile`` with a warm Inductor cache: a
stage of eight transformer blocks with FlexAttention (which AOTInductor cannot
compile), on the CPU or, with ``DEVICE=cuda``, on a GPU with CUDA graphs
(Inductor's ``triton.cudagraphs``). Each mode in a fresh process, one
``TORCHINDUCTOR_CACHE_DIR``:

    python dynamo_precompile.py plain   # cold Inductor cache: fills it
    python dynamo_precompile.py plain   # warm: Dynamo traces again
    python dynamo_precompile.py save    # aot_compile, save the compiled function
    python dynamo_precompile.py load    # load it, call: no trace
    SEED=1 python dynamo_precompile.py load  # other weights: read at the call

``ATTENTION=sdpa`` puts SDPA in flex's place; ``WORKAROUND=1`` loads inside a
tracing context (torch 2.11, see ``load``). Prints the seconds to the first
call's end and the relative L2 against eager.
"""

import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

ATTENTION = (
    torch.nn.functional.scaled_dot_product_attention
    if os.environ.get("ATTENTION") == "sdpa"
    else flex_attention
)
WORKAROUND = os.environ.get("WORKAROUND") == "1"
SAVED = Path(os.environ.get("SAVED", "/tmp/dynamo-precompile.bin"))
torch.manual_seed(int(os.environ.get("SEED", "0")))
if hasattr(torch._dynamo.config, "enable_aot_compile"):
    torch._dynamo.config.enable_aot_compile = True  # torch 2.11 asks for it


class Block(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        # Three projections: torch 2.11's CPU FlexAttention refuses a query, key
        # and value that are views of one buffer.
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.norm1(x)
        q, k, v = (
            p(h).view(b, n, self.heads, d // self.heads).transpose(1, 2).contiguous()
            for p in (self.q, self.k, self.v)
        )
        a = ATTENTION(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.out(a)
        return x + self.mlp(self.norm2(x))


class Stage(nn.Module):
    def __init__(self, depth: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


device = torch.device(os.environ.get("DEVICE", "cpu"))
options = {"triton.cudagraphs": True} if device.type == "cuda" else {}
model, x = Stage().eval().to(device), torch.randn(2, 128, 64, device=device)
mode = sys.argv[1]
with torch.no_grad():
    ref = model(x)
    start = time.perf_counter()
    if mode == "save":
        compiled = torch.compile(Stage.forward, fullgraph=True, options=options)
        fn = compiled.aot_compile(((model, x), {}))
        out = fn(model, x)
        fn.save_compiled_function(str(SAVED))
    elif mode == "load":
        from torch._dynamo.aot_compile import AOTCompiledFunction
        from torch._guards import TracingContext, tracing

        # torch 2.11 rebuilds an ImportSource (flex's) whose __post_init__
        # installs a guard, which needs a tracing context: without one the load
        # fails ("TracingContext.get() must be called within an ongoing trace").
        context = tracing(TracingContext(None)) if WORKAROUND else nullcontext()
        with context:
            fn = AOTCompiledFunction.deserialize(
                SAVED.read_bytes(), f_globals=Stage.forward.__globals__
            )
        out = fn(model, x)
    else:
        out = torch.compile(model, fullgraph=True, options=options)(x)
    if device.type == "cuda":
        out = out.clone()  # a CUDA graph's output is overwritten by the next replay
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    again = fn(model, x) if mode in ("save", "load") else None
err = ((out - ref).norm() / ref.norm()).item()
print(f"torch {torch.__version__}, {device.type}; {mode}: {seconds:.2f} s, ", end="")
print(f"rel. L2 {err:.1e}")
if again is not None:
    print(f"  second call: rel. L2 {((again - ref).norm() / ref.norm()).item():.1e}")
