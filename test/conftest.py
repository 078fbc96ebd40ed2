"""Shared test set-up.

Inductor's first CPU compile of a network costs 15-90 s on 2 cores; a persistent
cache directory (``E2SC_TEST_INDUCTOR_CACHE``, default under ``~/.cache``) makes
later runs reuse the generated code. Set before torch is imported.

The package's own persistent cache (portable bundles) is off unless a test turns it
on, so the suite never writes into the user's ``~/.cache/earth2studio``.

The tests mirror the package: ``test/<dir>/test_<m>.py`` tests
``earth2studio_compile/<dir>/<m>.py`` (``test_<dir>_<m>.py`` where two packages
have an ``<m>``: basenames stay unique, there is no ``__init__.py``), and only it
may use ``<m>``'s private names; test_layout.py checks both. At the top level
besides the mirrored modules, the tests of the whole package: test_layout.py (its
shape), test_numpydoc.py (its docstrings), test_docs.py (the documents' code and
figures), test_messages.py (what a user reads across modules), test_gpu.py (the
GPU-marked rollouts, one process on a GPU machine) and test_cluster.py (several
processes sharing one cache).

Helpers are imported by name (``pythonpath = ["test"]``): this file, tiny_cores,
io_helpers, aot_helpers, cache_helpers (their fixtures are imported here) and
zoo_helpers (the zoo's models against eager). Fixtures shared by several files
live here, not in a ``conftest.py`` of a subfolder: pytest imports every such file
as the module ``conftest``, and ``from conftest import ...`` would then find the
wrong one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

_INDUCTOR = Path(
    os.environ.get(
        "E2SC_TEST_INDUCTOR_CACHE",
        str(Path.home() / ".cache" / "earth2studio-compile" / "test-inductor"),
    )
)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_INDUCTOR))

os.environ.setdefault("EARTH2STUDIO_COMPILE_CACHE", "off")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# The ahead-of-time fixtures, built once for the files under artifacts/, executors/,
# tools/ and test_aot.py.
from aot_helpers import built, conv_built, planted  # noqa: E402, F401
from cache_helpers import bundles  # noqa: E402, F401
from loguru import logger  # noqa: E402

# earth2studio.run replaces loguru's handlers when imported; import it before any
# test adds a capturing handler. Through the package's run module, which imports it
# without the stack walks of its optional-dependency registry (~35 s of this
# process's start on 2 cores otherwise).
import earth2studio_compile.run  # noqa: E402, F401

TIME = ["2024-01-01T00:00"]


def pytest_configure(config: pytest.Config) -> None:
    """One Inductor cache per xdist worker (a subfolder; Inductor reads the
    variable at each compile): two workers compiling the same graph for
    AOTInductor at once write the same cache files, and one packaged the other's
    half-written extern-kernel JSON (the built FCN fixture in CI, 2026-11-30:
    "parse error ... attempting to parse an empty input" at the artifact's load).
    A cache the caller named is left as it is."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == str(_INDUCTOR):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_INDUCTOR / worker)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    # Tests of published-size models take minutes each: first, so that pytest-xdist's
    # workers run them beside the short ones rather than after them all. With
    # `--dist loadgroup` (a test a unit) the first units go one to each worker, the
    # next as workers run short; `--dist load` hands each worker a few consecutive
    # tests at once, and gave one worker both published tests (H200, 2026-11-30:
    # 314 + 185 s in a row, the suite 539 s).
    items.sort(key=lambda item: "published" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts and ends with empty Dynamo caches (a failed compile can
    leave the process in a state that trips the next compile)."""
    as_new_process()
    yield
    as_new_process()


def as_new_process() -> None:
    """What a new process would find in this one: no compiled code kept
    (:mod:`earth2studio_compile.resident`) and empty Dynamo caches."""
    import torch._dynamo

    from earth2studio_compile import resident

    resident.release()
    torch._dynamo.reset()


@pytest.fixture
def strict_fp32():
    """TF32 off for cuDNN and matmuls (PyTorch lets cuDNN use it by default): GPU
    comparisons are fp32 against fp32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def same_speed(monkeypatch):
    """The speed probe times every call alike: compiled code never judged slower.
    For tests of what compiles and what it computes, not of this CPU's verdict
    (CI's once found a built Aurora stage slower than eager and ran it eagerly;
    StormCast's denoiser is called often enough in two steps to be judged)."""
    from earth2studio_compile.probe import SpeedProbe

    # Each reading a millisecond after the last: every timed call takes 1 ms
    # (eager's too, so the figures are kept where a session keeps them).
    ticks = itertools.count()
    monkeypatch.setattr(SpeedProbe, "clock", staticmethod(lambda: next(ticks) / 1e3))


@pytest.fixture
def logs():
    """Loguru records emitted during the test."""
    records: list = []
    handler = logger.add(lambda m: records.append(m.record), level="DEBUG")
    yield records
    logger.remove(handler)


@pytest.fixture
def background_on(monkeypatch, tmp_path):
    """Background builds on (on the CPU too), the persistent cache in a fresh
    directory: for artifacts/test_background.py and the background executor's."""
    from earth2studio_compile.artifacts import background

    monkeypatch.setenv(background.ENV, "on")
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    return tmp_path


def messages(records: list, level: str) -> list[str]:
    return [r["message"] for r in records if r["level"].name == level]


def run_workflow(
    workflow: Callable,
    kind: str,
    model: torch.nn.Module,
    nsteps: int = 2,
    device: str = "cpu",
    seed: int = 0,
    overlap: bool = False,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """Run one of the three workflows from the same seeded data; return its arrays.

    ``overlap`` writes through :class:`~earth2studio_compile.io.OverlappedIO`.
    """
    from earth2studio.io import KVBackend
    from earth2studio.models.dx import Identity
    from earth2studio.perturbation import Gaussian

    from earth2studio_compile.io import OverlappedIO
    from earth2studio_compile.tools import zoo

    np.random.seed(seed)
    torch.manual_seed(seed)
    data = zoo.random_source(model)
    backend = KVBackend()
    io = OverlappedIO(backend) if overlap else backend
    common = dict(device=torch.device(device), verbose=False, **kwargs)
    if kind == "deterministic":
        workflow(TIME, nsteps, model, data, io, **common)
    elif kind == "diagnostic":
        workflow(TIME, nsteps, model, Identity(), data, io, **common)
    elif kind == "ensemble":
        # 3 members in batches of 2: the last batch is smaller (a recompile trap).
        workflow(
            TIME,
            nsteps,
            3,
            model,
            data,
            io,
            Gaussian(noise_amplitude=0.05, seed=seed),
            batch_size=2,
            **common,
        )
    else:
        raise ValueError(kind)
    # The workflow flushed an OverlappedIO before it returned.
    return {k: v.detach().cpu().clone() for k, v in backend.root.items()}


def held_rollout(model: torch.nn.Module, nsteps: int, compile: bool) -> tuple:
    """Iterate ``model`` from a seeded state on the CPU, keeping every yielded tensor
    without copying (an output the session reused would change under the caller).

    Returns the kept tensors and the session (None without ``compile``).
    """
    from earth2studio_compile import CompileSession
    from earth2studio_compile.tools.bench.runs import initial_state

    torch.manual_seed(0)
    x, coords = initial_state(model, torch.device("cpu"))
    session = CompileSession(model) if compile else None
    kept = []
    with session if session is not None else contextlib.nullcontext():
        for step, (y, _) in enumerate(model.create_iterator(x, coords)):
            kept.append(y)
            if step == nsteps:
                break
    return kept, session


def snapshot(model: torch.nn.Module) -> dict:
    """Everything a session must leave as it found it."""
    return {
        "type": type(model),
        "dicts": {name: sorted(m.__dict__) for name, m in model.named_modules()},
        "types": {name: type(m) for name, m in model.named_modules()},
        "state": OrderedDict(
            (k, v.detach().clone()) for k, v in model.state_dict().items()
        ),
    }


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, layouts and sparsity patterns. Sparse maps (DLWP's and AIFS's
    regridding) compare by their parts: AIFS's dense form is terabytes."""
    if a.layout != b.layout or a.shape != b.shape:
        return False
    if a.layout == torch.sparse_coo:
        a, b = a.coalesce(), b.coalesce()
        return torch.equal(a.indices(), b.indices()) and torch.equal(
            a.values(), b.values()
        )
    if a.layout == torch.sparse_csr:
        parts = ("crow_indices", "col_indices", "values")
        return all(torch.equal(getattr(a, p)(), getattr(b, p)()) for p in parts)
    return torch.equal(a, b)


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["type"] is before["type"]
    assert after["types"] == before["types"]
    assert after["dicts"] == before["dicts"], "instance attributes changed"
    assert list(after["state"]) == list(before["state"]), "state_dict keys changed"
    for key, value in before["state"].items():
        now = after["state"][key]
        assert _same_tensor(now, value), f"{key} changed"
    for name, module in model.named_modules():
        assert "_compiled_call_impl" not in module.__dict__, f"{name} left compiled"


def eager_backend(gm, example_inputs):
    """A backend that compiles nothing: fast, and enough to exercise Dynamo."""
    return gm.forward


class FailingBackend:
    """Compiles ``ok`` graphs, then raises: a compiler that breaks at a recompile."""

    def __init__(self, ok: int = 0):
        self.ok = ok
        self.calls = 0
        self.__name__ = "failing"

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if self.calls > self.ok:
            raise RuntimeError("injected compiler failure")
        return gm.forward


def session_calls(core: torch.nn.Module, inputs: list, **session_kwargs) -> tuple:
    """Call ``core`` on each input eagerly, then in a session compiling ``core.net``.

    Returns the eager outputs, the session's outputs and the session.
    """
    from earth2studio_compile import CompileSession

    with torch.no_grad():
        expected = [core(x) for x in inputs]
    with CompileSession(core, regions=("net",), **session_kwargs) as session:
        with torch.no_grad():
            outs = [core(x) for x in inputs]
    return expected, outs, session


def run_inputs(core: torch.nn.Module, inputs: list, **session_kwargs):
    """Call ``core.net`` on each input in a session; check every output against eager.

    Returns the session's single region report.
    """
    expected, outs, session = session_calls(core, inputs, **session_kwargs)
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref)
    return session.report.regions[0]
