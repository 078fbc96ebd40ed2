"""Does AOTInductor's first run hold the GIL, and can its first-call work be moved
to calls that let the GIL go?

This session's first-run profile (first-run-dlwp-58ee37a.txt) put DLWP's artifact's
first run at 0.29-0.40 s on the region's thread: cuDNN's first calls (198
convolutions, 168 ms self CPU) and 403 ``cudaFuncGetAttributes`` (116 ms) — while
upstream's ``fetch_data`` on the workflow's thread took 0.71-0.88 s against eager's
0.34-0.46. torch 2.11's AOTInductor bindings hold the GIL for the whole run
(pytorch issue #197516); eager ops release it inside each op. So: if the same
cuDNN plans and kernels were made ready by eager calls on the region's thread
first, the artifact's first run would hold the GIL for a short time only.

The parent compiles the full-size DLWP core (zoo ``dlwp("full")``, batch 8, TF32)
with AOTInductor, then runs four fresh child processes, each timing the package's
first and second run while a counter thread measures how much of the run it could
hold the GIL (``gil_free``: its rate during the run over its rate alone):

- ``plain``: the first run as the region runs it today;
- ``eager-warm``: one eager call of the same core on the same input first;
- ``mode-probe``: the first run under a ``TorchDispatchMode`` recording every op
  it sees (does Python see the artifact's convolutions, with their strides?);
- ``param-warm``: ``torch.convolution`` on empty tensors of each convolution the
  probe recorded, then the first run.

Writes ``OUT/gil-probe.json`` after every child. Run from the repository root:

    python3 docs/bench/2026-11-28-h200-twentythird/gil_probe.py OUT
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

WORK = Path(os.environ.get("PROBE_DIR", "/tmp/gil-probe"))
SIZE = os.environ.get("PROBE_SIZE", "full")
BATCH = int(os.environ.get("PROBE_BATCH", "8"))
VARIANTS = ("plain", "eager-warm", "mode-probe", "param-warm")


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _core() -> torch.nn.Module:
    from earth2studio_compile.tools import zoo

    return zoo.dlwp(SIZE).model.to(_device()).eval()


def _input() -> torch.Tensor:
    face = 64 if SIZE == "full" else 8
    gen = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, 18, 6, face, face, generator=gen).to(_device())


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Counter:
    """A thread counting while it holds the GIL: its rate during a call over its
    rate alone is the share of the call that let the GIL go."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        time.sleep(0.05)
        self.rate = self._rate(0.2)

    def _spin(self) -> None:
        while not self._stop:
            self.count += 1

    def _rate(self, seconds: float) -> float:
        start, t0 = self.count, time.perf_counter()
        time.sleep(seconds)
        return (self.count - start) / (time.perf_counter() - t0)

    def during(self, fn):  # type: ignore[no-untyped-def]
        start, t0 = self.count, time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
        rate = (self.count - start) / seconds
        return out, round(seconds, 4), round(rate / self.rate, 3)

    def stop(self) -> None:
        self._stop = True
        self._thread.join()


def _load() -> object:
    import earth2studio.models.px  # noqa: F401  (the loader crashes without it)

    index = -1
    return torch._C._aoti.AOTIModelPackageLoader(
        str(WORK / "dlwp.pt2"), "model", True, 1, index
    )


def _convolutions_seen(loader: object, x: torch.Tensor) -> dict:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict = {"ops": {}, "convolutions": []}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = str(func)
            seen["ops"][name] = seen["ops"].get(name, 0) + 1
            if "convolution" in name:
                tensors = [a for a in args[:3] if isinstance(a, torch.Tensor)]
                seen["convolutions"].append(
                    {
                        "op": name,
                        "shapes": [list(t.shape) for t in tensors],
                        "strides": [list(t.stride()) for t in tensors],
                        "has_bias": args[2] is not None,
                        "rest": [
                            a if not isinstance(a, torch.Tensor) else None
                            for a in args[3:]
                        ],
                    }
                )
            return func(*args, **(kwargs or {}))

    with Record():
        loader.run([x])  # type: ignore[attr-defined]
    return seen


def _param_warm(convolutions: list) -> int:
    unique = {json.dumps(c, sort_keys=True): c for c in convolutions}
    dev, dtype = _device(), torch.float32
    for c in unique.values():
        (xs, ws, *bs), (xt, wt, *bt) = c["shapes"], c["strides"]
        x = torch.empty_strided(xs, xt, device=dev, dtype=dtype)
        w = torch.empty_strided(ws, wt, device=dev, dtype=dtype)
        b = torch.empty_strided(bs[0], bt[0], device=dev, dtype=dtype) if bs else None
        stride, padding, dilation, transposed, output_padding, groups = c["rest"][:6]
        torch.convolution(
            x, w, b, stride, padding, dilation, transposed, output_padding, groups
        )
    _sync()
    return len(unique)


def child(out: Path, variant: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    t0 = time.perf_counter()
    x = _input()
    loader = _load()
    row: dict = {"variant": variant, "load_s": round(time.perf_counter() - t0, 3)}
    counter = _Counter()
    row["counter_rate"] = round(counter.rate)
    with torch.no_grad():
        if variant == "eager-warm":
            core = _core()
            _, row["warm_s"], row["warm_gil_free"] = counter.during(
                lambda: (core(x), _sync())
            )
        if variant == "param-warm":
            probe = json.loads((out / "mode-probe.json").read_text())
            convs = probe.get("seen", {}).get("convolutions", [])
            n, row["warm_s"], row["warm_gil_free"] = counter.during(
                lambda: _param_warm(convs)
            )
            row["warm_convolutions"] = n
        if variant == "mode-probe":
            seen, row["first_s"], row["first_gil_free"] = counter.during(
                lambda: (_convolutions_seen(loader, x), _sync())[0]
            )
            row["ops_seen"] = sum(seen["ops"].values())
            row["convolutions_seen"] = len(seen["convolutions"])
            row["seen"] = seen
        else:
            _, row["first_s"], row["first_gil_free"] = counter.during(
                lambda: (loader.run([x]), _sync())  # type: ignore[attr-defined]
            )
        _, row["second_s"], row["second_gil_free"] = counter.during(
            lambda: (loader.run([x]), _sync())  # type: ignore[attr-defined]
        )
    counter.stop()
    (out / f"{variant}.json").write_text(json.dumps(row))
    return row


def parent(out: Path) -> None:
    from earth2studio_compile._torch.aoti import aoti_compile

    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    result: dict = {"size": SIZE, "batch": BATCH, "torch": torch.__version__}
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    core, x = _core(), _input()
    with torch.no_grad():
        program = torch.export.export(core, (x,))
        aoti_compile(program, str(WORK / "dlwp.pt2"), {})
    result["compile_s"] = round(time.perf_counter() - t0, 1)
    print("compiled", result, flush=True)
    (out / "gil-probe.json").write_text(json.dumps(result, indent=1))
    here = [sys.executable, __file__, str(out), "child"]
    first = {v: subprocess.Popen([*here, v]) for v in VARIANTS[:3]}
    for v, p in first.items():
        result[v] = {"rc": p.wait()}
    result["param-warm"] = {"rc": subprocess.call([*here, "param-warm"])}
    for v in VARIANTS:
        path = out / f"{v}.json"
        if path.exists():
            row = json.loads(path.read_text())
            row.pop("seen", None)
            result[v].update(row)
        print(v, result[v], flush=True)
        (out / "gil-probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "child":
        row = child(Path(sys.argv[1]), sys.argv[3])
        print(sys.argv[3], {k: v for k, v in row.items() if k != "seen"}, flush=True)
    else:
        parent(Path(sys.argv[1]))
