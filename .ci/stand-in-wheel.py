"""A stand-in wheel for a package an import path names but never uses (issue 33).

fme, whose ACE2 the zoo builds, imports ``wandb`` at import time only to subclass
its logging types (``Histogram``, ``Table``, ``Video``); inference never logs. The
real wheel (20 MB) would push the GPU machine's carry past 64 MiB, so there it is
replaced by a module whose every attribute is an empty class. Never ship it.

    python3 .ci/stand-in-wheel.py NAME OUT_DIR
"""

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

VERSION = "0.0.0+stand.in"
MODULE = '''"""Stand-in for {name} (.ci/stand-in-wheel.py): every attribute is an empty
class, enough for an import path that subclasses its types and never calls them."""

__version__ = "{version}"


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {{"__module__": __name__}})
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


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
    record = [_record_line(n, d) for n, d in data.items()] + [f"{info}/RECORD,,"]
    data[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = out_dir / f"{name}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for n, d in data.items():
            wheel.writestr(n, d)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1], Path(sys.argv[2])))
