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

    python3 .ci/stand-in-wheel.py NAME OUT_DIR
"""

import sys
from pathlib import Path

from wheelfile import write_wheel

VERSION = "0.0.0+stand.in"
MODULE = '''"""Stand-in for {name} (.ci/stand-in-wheel.py): every attribute is an empty
class, enough for an import path that subclasses its types and never calls them."""

__version__ = "{version}"


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {{"__module__": __name__}})
'''


def main(name: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{VERSION}.dist-info"
    files = {
        f"{name}/__init__.py": MODULE.format(name=name, version=VERSION),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n"
            "Summary: stand-in (.ci/stand-in-wheel.py)\n"
        ),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: stand-in-wheel\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    data = {n: text.encode() for n, text in files.items()}
    out = out_dir / f"{name}-{VERSION}-py3-none-any.whl"
    return write_wheel(out, data, f"{info}/RECORD")


if __name__ == "__main__":
    print(main(sys.argv[1], Path(sys.argv[2])))
