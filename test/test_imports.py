"""Imports without the native "no GPU" noise (earth2studio_compile._imports): the
one known line is dropped, everything else written to descriptor 2 comes through."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_only_the_known_noise_is_dropped_and_the_rest_kept_in_order():
    # A child process: the test reads what reaches its real descriptor 2.
    code = textwrap.dedent(
        """
        import os
        from earth2studio_compile._imports import NOISE, quiet_imports

        with quiet_imports():
            os.write(2, b"first\\n")
            os.write(2, (NOISE[0] + "\\n").encode())
            os.write(2, b"second\\n")
        os.write(2, b"after\\n")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines == ["first", "second", "after"], done.stderr
