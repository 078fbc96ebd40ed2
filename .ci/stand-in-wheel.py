"""A stand-in wheel for a package an import path names but never uses (issue 33).

fme, whose ACE2 the zoo builds, imports ``wandb`` at import time only to subclass
its logging types (``Histogram``, ``Table``, ``Video``); inference never logs. The
real wheel (20 MB) would push the GPU machine's carry past 64 MiB, so there it is
replaced by a module whose every attribute is an empty class. Earth2Studio's AIFS
modules import ``flash_attn`` only to check that it is there; the zoo's AIFS2ENS
runs PyTorch's SDPA, and flash-attn is a source package that needs CUDA to build:
CI and the GPU machine install this stand-in for it (a network configured for
flash attention fails at its first call, an empty class taking no arguments). Never
ship it.

makani, whose FourCastNet3 the zoo builds, imports its trainers and plotting at
import time: ``wandb``, ``moviepy.video.io.ImageSequenceClip`` (a dotted NAME:
every package on the path is a stand-in module) and ``numba``, whose ``jit`` its
zenith angle calls as ``@jit(forceobj=True)``, object mode, which is plain Python:
``--pass-through jit,njit`` makes those names decorators returning the function
unchanged (with or without arguments), which is what object mode computes.

    python3 .ci/stand-in-wheel.py NAME OUT_DIR [--pass-through ATTR,...]
"""

import argparse
from pathlib import Path

from wheelfile import write_wheel

VERSION = "0.0.0+stand.in"
MODULE = '''"""Stand-in for {name} (.ci/stand-in-wheel.py): every attribute is an empty
class, enough for an import path that subclasses its types and never calls
them{more}."""

__version__ = "{version}"
_PASS_THROUGH = {pass_through!r}


def _pass_through(*args, **kwargs):
    """A decorator, bare or called with options, that returns the function."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda function: function


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    if attr in _PASS_THROUGH:
        return _pass_through
    return type(attr, (), {{"__module__": __name__}})
'''


def main(name: str, out_dir: Path, pass_through: tuple[str, ...] = ()) -> Path:
    """Write the stand-in wheel for the module path ``name`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = name.split(".")
    top = parts[0]
    more = f"; {', '.join(pass_through)} return the function" if pass_through else ""
    info = f"{top}-{VERSION}.dist-info"
    files = {}
    for depth in range(1, len(parts) + 1):
        path = "/".join(parts[:depth])
        module = ".".join(parts[:depth])
        # The last part is a module, the ones before it packages.
        file = f"{path}.py" if depth == len(parts) > 1 else f"{path}/__init__.py"
        files[file] = MODULE.format(
            name=module, version=VERSION, pass_through=pass_through, more=more
        )
    files |= {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {top}\nVersion: {VERSION}\n"
            "Summary: stand-in (.ci/stand-in-wheel.py)\n"
        ),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: stand-in-wheel\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    data = {n: text.encode() for n, text in files.items()}
    out = out_dir / f"{top}-{VERSION}-py3-none-any.whl"
    return write_wheel(out, data, f"{info}/RECORD")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="module path, e.g. wandb or moviepy.video.io.X")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--pass-through",
        default="",
        help="comma-separated attributes that are decorators returning the function",
    )
    args = parser.parse_args()
    names = tuple(n for n in args.pass_through.split(",") if n)
    print(main(args.name, args.out_dir, names))
