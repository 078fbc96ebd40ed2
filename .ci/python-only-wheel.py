"""A torch-harmonics wheel without its compiled parts, for another torch (issue 33).

torch-harmonics 0.9.3 rewrote its spherical-harmonic transforms for Inductor, but
its wheels are built for torch 2.14 (their extensions link that torch's libc10),
while the GPU machine has torch 2.11. SFNO's transforms and spectral convolutions
are Python; only DISCO convolutions and neighbourhood attention need the compiled
kernels. This copy drops every compiled module and puts Python stand-ins where the
package imports its two helper modules unconditionally: no optimized or CUDA
kernels, and DISCO's weight packing raises. Never ship it; it is for measuring SFNO
with torch-harmonics 0.9.3 on the GPU machine.

    python3 .ci/python-only-wheel.py WHEEL OUT_DIR
"""

import re
import sys
import zipfile
from pathlib import Path

from wheelfile import write_wheel

_NO_KERNELS = '''"""Stand-in for torch-harmonics' compiled {name}
(.ci/python-only-wheel.py)."""


def cuda_kernels_is_available():
    return False


def optimized_kernels_is_available():
    return False
'''
_DISCO = """

def kpacked_sm90_kernels_is_available():
    return False


def kpacked_sm100_kernels_is_available():
    return False


def _missing(*args, **kwargs):
    raise NotImplementedError(
        "torch-harmonics' compiled DISCO helpers are not in this Python-only build"
    )


pack_psi_dense = preprocess_psi = _missing
"""
# The modules that hold the compiled kernels' Python side: their kernel namespace
# comes from torch.ops only when the kernels load, and the package imports their
# functions unconditionally. Here the namespace is None and every such function
# raises when called (SFNO calls none).
_OPTIMIZED = (
    "attention/optimized/attention_optimized.py",
    "disco/optimized/disco_optimized.py",
)
_KERNELS_IMPORT = re.compile(r"^from \.\. import (\w+_kernels)$", re.M)
_MISSING = """

def __getattr__(name):  # .ci/python-only-wheel.py: no compiled kernels in this build
    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"torch_harmonics {name}: not in this Python-only build"
        )

    return missing
"""
STAND_INS = {
    "disco_helpers.py": _NO_KERNELS.format(name="disco_helpers") + _DISCO,
    "attention_helpers.py": _NO_KERNELS.format(name="attention_helpers"),
}


def main(wheel: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src:
        names = [i.filename for i in src.infolist()]
        record = next(n for n in names if n.endswith("RECORD"))
        files = {n: src.read(n) for n in names if not n.endswith((".so", "RECORD"))}
    files |= {n: text.encode() for n, text in STAND_INS.items()}
    for name in (f"torch_harmonics/{m}" for m in _OPTIMIZED):
        text = _KERNELS_IMPORT.sub(r"\1 = None", files[name].decode())
        files[name] = (text + _MISSING).encode()
    return write_wheel(out_dir / wheel.name, files, record)


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), Path(sys.argv[2])))
