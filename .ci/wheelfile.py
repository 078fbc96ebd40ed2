"""Writing a wheel from its files, for the GPU machine's hand-made wheels
(python-only-wheel.py, stand-in-wheel.py import it: run as ``python3 .ci/X.py``,
their folder is on the path)."""

import base64
import hashlib
import zipfile
from pathlib import Path


def write_wheel(out: Path, files: dict[str, bytes], record: str) -> Path:
    """Write ``files`` (archive name -> bytes) to the wheel ``out`` with its
    ``RECORD`` at ``record``: each file's sha256 and size, as installers check."""
    lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        lines.append(f"{name},sha256={digest.decode()},{len(data)}")
    files = {**files, record: ("\n".join([*lines, f"{record},,"]) + "\n").encode()}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return out
