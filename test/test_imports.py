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


def test_earth2studios_registry_finds_its_callers_file_without_reading_source(
    monkeypatch,
):
    """Earth2Studio's optional-dependency registry names each registering module by
    its file, from ``inspect.stack()``, which read the source lines of every frame
    (regression: ~180 such calls, 38 s of a fresh process's 43 s to build the small
    FCN on 2 cores). Under quiet_imports it gets the same file, and reads none."""
    import inspect

    from earth2studio.utils import imports as registry

    from earth2studio_compile._imports import quiet_imports

    with quiet_imports():
        pass

    def unread(*args, **kwargs):
        raise AssertionError("a frame's source was read")

    monkeypatch.setattr(registry.OptionalDependencyFailure, "failures", {})
    with monkeypatch.context() as m:
        m.setattr(inspect, "findsource", unread)
        m.setattr(inspect, "getmodule", unread)
        try:
            import e2sc_no_such_module  # noqa: F401
        except ImportError:
            registry.OptionalDependencyFailure("e2sc-test")
        line = inspect.currentframe().f_lineno
        frames = registry.inspect.stack()
    assert list(registry.OptionalDependencyFailure.failures) == [__file__]
    assert (frames[0].filename, frames[0].lineno) == (__file__, line + 1)
    # The frames above are inspect's own, less their source lines.
    full = inspect.stack()
    assert [(f.filename, f.lineno, f.function) for f in frames[1:]] == [
        (f.filename, f.lineno, f.function) for f in full[1:]
    ]
    assert all(f.code_context is None for f in frames)


def test_a_registry_of_other_code_keeps_pythons_inspect(tmp_path):
    """Only the registry's callers of ``inspect.stack()`` that were read (their
    source's digest) get the stack without source lines: other code may read
    more of it."""
    import importlib.util
    import inspect

    from earth2studio_compile._imports import quicken

    path = tmp_path / "registry.py"
    path.write_text(
        textwrap.dedent(
            """
            import inspect

            class OptionalDependencyFailure:
                def __init__(self):
                    self.line = inspect.stack()[1].code_context[0]

            def check_optional_dependencies():
                return inspect.stack()[1].filename
            """
        )
    )
    spec = importlib.util.spec_from_file_location("e2sc_other_registry", path)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    assert not quicken(other)
    assert other.inspect is inspect
