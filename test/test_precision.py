"""Reduced precision: opt-in, scoped to the regions' calls, measured on every run.

bf16 autocast exists on CPU, so scoping, restoring and the accuracy probe are tested
here; the speed and the GPU thresholds are the benchmark's and the GPU tests' job.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from conftest import TIME, FailingBackend, eager_backend, messages

from earth2studio_compile import CompileSession, register_model
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.models import MODEL_TABLE
from earth2studio_compile.precision import ENV, THRESHOLDS, KeepFp32, tf32_enabled
from earth2studio_compile.tools import zoo


def global_state() -> tuple:
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
    )


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_precision_is_scoped_and_outputs_keep_their_dtype(precision):
    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    seen = []
    forward = model.model.net.forward

    def spy(*args):
        seen.append((torch.is_autocast_enabled("cpu"), tf32_enabled()))
        return forward(*args)

    model.model.net.forward = spy
    before = global_state()
    with CompileSession(model, backend=eager_backend, precision=precision) as session:
        assert global_state() == before
        with torch.no_grad():
            out = model.model(x)
        assert global_state() == before
    del model.model.net.forward
    assert out.dtype == torch.float32
    tf32 = precision == "tf32"
    assert seen and seen[0] == (precision == "bf16", (tf32, tf32))
    region = session.report.regions[0]
    assert region.status == "compiled" and region.precision == precision
    if precision == "fp32":
        assert region.precision_error is None
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        # The probe's figure is the error a user would measure by hand.
        assert region.precision_error == pytest.approx(rel_l2(out, expected), rel=1e-3)
        assert region.precision_error < THRESHOLDS[precision]
        assert precision in session.report.summary()
    if precision == "bf16":
        assert region.precision_error > 1e-6  # bf16 really ran (fp32: ~1e-8)


def test_state_is_restored_after_an_exception_and_a_fallback():
    model = zoo.build("toy")
    before = global_state()
    with CompileSession(model, backend=eager_backend, precision="bf16"):
        with pytest.raises(RuntimeError):
            model.model(torch.randn(1, 3, 16, 32))  # wrong channels: the caller's error
        assert global_state() == before
    with CompileSession(model, backend=FailingBackend(), precision="bf16") as session:
        with torch.no_grad():
            out = model.model(torch.randn(1, 4, 16, 32))
        assert global_state() == before
    region = session.report.regions[0]
    assert region.status == "eager" and region.precision == "bf16"
    assert out.dtype == torch.float32 and region.precision_error is not None
    assert "kept bf16" in session.report.summary()


def test_bad_precision_names_the_choices(monkeypatch):
    model = zoo.build("toy")
    with pytest.raises(
        ValueError, match=r"precision must be one of \['fp32', 'tf32', 'bf16'\]"
    ):
        CompileSession(model, precision="fp16")
    from earth2studio_compile import run

    monkeypatch.setenv(ENV, "half")
    with pytest.raises(ValueError, match=ENV):
        run.deterministic(TIME, 1, model, zoo.random_source(model), None, compile=True)


def test_spectral_convolutions_stay_fp32_under_bf16():
    model = zoo.build("sfno")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=eager_backend, precision="bf16") as session:
        with torch.no_grad():
            out = model.model(x)
    region = session.report.regions[0]
    assert region.status == "compiled", session.report.summary()
    assert out.dtype == torch.float32
    assert rel_l2(out, expected) < THRESHOLDS["bf16"]
    assert "forward" not in model.model.sfno.blocks[0].global_conv.__dict__


def test_a_precision_the_table_refuses_is_not_used(logs):
    class Touchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 4)

    register_model(Touchy, regions=("net",), precisions_refused={"bf16": "needs fp32"})
    try:
        model = Touchy()
        with CompileSession(model, backend=eager_backend, precision="bf16") as session:
            with torch.no_grad():
                model.net(torch.randn(2, 4))
    finally:
        del MODEL_TABLE[f"{Touchy.__module__}.{Touchy.__qualname__}"]
    assert session.report.regions[0].precision is None
    assert any("needs fp32" in w for w in messages(logs, "WARNING"))


def test_workflow_precision_from_the_environment(monkeypatch):
    from earth2studio.io import KVBackend

    from earth2studio_compile import run

    model = zoo.build("toy")
    monkeypatch.setenv(ENV, "bf16")
    io = KVBackend()
    run.deterministic(
        TIME, 2, model, zoo.random_source(model), io, verbose=False, compile=True
    )
    region = run.last_report().regions[0]
    assert region.precision == "bf16" and region.precision_error is not None
    assert all(
        v.dtype == torch.float32 for v in io.root.values() if v.is_floating_point()
    )


def test_a_refused_precision_is_reported_once_per_model(logs):
    class TwoCores(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

    register_model(TwoCores, regions=("a", "b"), precisions_refused={"tf32": "no"})
    try:
        with CompileSession(TwoCores(), backend=eager_backend, precision="tf32") as s:
            pass
    finally:
        del MODEL_TABLE[f"{TwoCores.__module__}.{TwoCores.__qualname__}"]
    assert [r.precision for r in s.report.regions] == [None, None]
    assert sum("does not run in tf32" in w for w in messages(logs, "WARNING")) == 1


# -- PyTorch's precision settings: left as found, whichever API set them ---------------
# The per-backend flags of torch >= 2.9 (``torch.backends.fp32_precision`` and below);
# "" is the global one. All of them are settable and readable on a CPU build.
FP32_FLAGS = (
    "",
    "cuda.matmul",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)


def _flag(path: str):
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _has_flag(path: str) -> bool:
    try:
        return isinstance(_flag(path).fp32_precision, str)
    except (AttributeError, RuntimeError):
        return False


def _set_flag(path: str, value: str) -> None:
    if not _has_flag(path):
        pytest.skip(f"this PyTorch has no torch.backends.{path}.fp32_precision")
    _flag(path).fp32_precision = value


def observed() -> dict:
    """What a user's code sees of the precision settings, read without raising.

    The legacy getters raise once the legacy and per-backend flags disagree: that
    outcome is part of the state. Inherited flags must keep inheriting, so the
    per-backend flags are also read with the global flag set (and put back: it has no
    parent, so its value is all there is to it).
    """
    state: dict = {}
    legacy: dict[str, Callable] = {
        "get_float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    }
    for name, read in legacy.items():
        try:
            state[name] = read()
        except RuntimeError:
            state[name] = "raises"
    flags = [path for path in FP32_FLAGS if _has_flag(path)]
    state["fp32_precision"] = {path: _flag(path).fp32_precision for path in flags}
    if flags:
        own = torch.backends.fp32_precision
        for probe in ("ieee", "tf32"):
            torch.backends.fp32_precision = probe
            state[f"global={probe}"] = {p: _flag(p).fp32_precision for p in flags}
        torch.backends.fp32_precision = own
    state["autocast"] = [
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
        for d in ("cpu", "cuda")
    ]
    return state


@pytest.fixture
def pytorch_precision_defaults():
    """Back to PyTorch's default precision settings after the test (as far as the
    public API can write them: torch 2.14's cuDNN flags start at a default no setter
    writes back, which the subprocess test below covers)."""
    yield
    torch.set_float32_matmul_precision("highest")
    for path in ("", "cudnn", "cuda.matmul", "mkldnn", *FP32_FLAGS[-3:]):
        if _has_flag(path):
            _flag(path).fp32_precision = "none"
    torch.backends.cudnn.allow_tf32 = True


# Ways a user's process sets precision before a session: PyTorch's defaults, the
# legacy flags, the per-backend flags at each level, set_float32_matmul_precision.
USER_SETTINGS: dict[str, Callable[[], None]] = {
    "defaults": lambda: None,
    "legacy allow_tf32": lambda: (
        setattr(torch.backends.cuda.matmul, "allow_tf32", True),
        setattr(torch.backends.cudnn, "allow_tf32", False),
    ),
    "new global": lambda: _set_flag("", "tf32"),
    "new cuda.matmul": lambda: _set_flag("cuda.matmul", "tf32"),
    "new cudnn": lambda: _set_flag("cudnn", "ieee"),
    "new cudnn.conv": lambda: _set_flag("cudnn.conv", "ieee"),
    "new cudnn.rnn": lambda: _set_flag("cudnn.rnn", "ieee"),
    "new mkldnn": lambda: _set_flag("mkldnn", "bf16"),
    "new mkldnn.matmul": lambda: _set_flag("mkldnn.matmul", "bf16"),
    "matmul high": lambda: torch.set_float32_matmul_precision("high"),
    "matmul medium": lambda: torch.set_float32_matmul_precision("medium"),
    "matmul highest": lambda: torch.set_float32_matmul_precision("highest"),
}


class LinearCore(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 4)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("user", list(USER_SETTINGS))
def test_a_session_leaves_precision_settings_as_it_found_them(
    user, precision, pytorch_precision_defaults
):
    USER_SETTINGS[user]()
    before = observed()
    model = LinearCore()
    x = torch.randn(2, 4)
    with CompileSession(
        model, regions=("net",), backend=eager_backend, precision=precision
    ) as session:
        with torch.no_grad():
            out = model.net(x)
            assert observed() == before  # between calls too
            with pytest.raises(RuntimeError):
                model.net(torch.randn(2, 3))  # the caller's error, inside the scope
            assert observed() == before
    assert observed() == before
    assert out.dtype == torch.float32
    region = session.report.regions[0]
    assert region.precision == precision and region.calls == 2


def test_inherited_flags_still_inherit_from_pytorchs_defaults():
    """A fresh process: the state no other test has touched (on torch 2.14 cuDNN's
    flags start at an internal default that follows its parents and that no setter
    can write back, so a session must never write them)."""
    script = """
import torch
from earth2studio_compile import CompileSession

def reads(value):
    torch.backends.fp32_precision = value
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv,
             torch.backends.cudnn.rnn, torch.backends.mkldnn.matmul)
    out = [f.fp32_precision for f in flags]
    torch.backends.fp32_precision = "none"
    return out

if not hasattr(torch.backends, "fp32_precision"):
    print("no per-backend flags"); raise SystemExit
expected = {v: reads(v) for v in ("none", "ieee", "tf32")}
legacy = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
net = torch.nn.Sequential(torch.nn.Linear(4, 4))
for precision in ("fp32", "tf32", "bf16"):
    with CompileSession(net, regions=("0",), backend="eager", precision=precision):
        with torch.no_grad():
            net[0](torch.randn(2, 4))
    got = {v: reads(v) for v in ("none", "ieee", "tf32")}
    assert got == expected, (precision, got, expected)
    now = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    assert now == legacy, (precision, now, legacy)
print("inherit ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout or "no per-backend" in done.stdout


def test_sfno_options_read_tf32_set_through_the_per_backend_flags(
    pytorch_precision_defaults,
):
    from earth2studio_compile.models import sfno_inductor_options

    _set_flag("cuda.matmul", "tf32")  # cuDNN's convolutions default to TF32 too
    options = sfno_inductor_options(torch.device("cuda"))
    assert options["conv_1x1_as_mm"] is True


class ReadsLegacyFlags(torch.nn.Module):
    """A core whose forward reads PyTorch's documented legacy TF32 flags."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 4)
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(
            (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        )
        return self.net(x)


class HoldsLegacyReader(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.core = ReadsLegacyFlags()


# What a user sets before a session; each leaves the legacy getters readable.
LEGACY_READABLE: dict[str, Callable[[], None]] = {
    "defaults": lambda: None,
    "cudnn allow_tf32 False": lambda: setattr(
        torch.backends.cudnn, "allow_tf32", False
    ),
    "matmul allow_tf32 True": lambda: setattr(
        torch.backends.cuda.matmul, "allow_tf32", True
    ),
    "matmul high": lambda: torch.set_float32_matmul_precision("high"),
}


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("user", list(LEGACY_READABLE))
def test_code_inside_a_scope_reads_the_legacy_tf32_flags(
    user, precision, pytorch_precision_defaults
):
    """No "mix of the legacy and new APIs" error inside a core: cuDNN's flag reads
    what its convolutions do (as ``allow_tf32 = True`` would give for tf32), also
    in code Dynamo traces; afterwards, also after an error, the user's state."""
    from earth2studio_compile.precision import scope

    LEGACY_READABLE[user]()
    before = observed()
    tf32 = precision == "tf32"
    model = HoldsLegacyReader()
    x = torch.randn(2, 4)
    with CompileSession(
        model, regions=("core",), backend=eager_backend, precision=precision
    ) as session:
        with torch.no_grad():
            model.core(x)  # traced by Dynamo, and the fp32 reference runs eagerly
            assert observed() == before
            with pytest.raises(RuntimeError, match="shapes"):
                model.core(torch.randn(2, 3))  # the caller's error, inside the scope
            assert observed() == before
    assert observed() == before
    assert session.report.regions[0].status == "compiled"
    # The region's calls read the region's precision; the accuracy reference, run
    # once in fp32 eager, reads fp32.
    assert model.core.seen[0] == (tf32, tf32)
    assert set(model.core.seen) <= {(tf32, tf32), (False, False)}
    with pytest.raises(ValueError), scope(precision, torch.device("cpu")):
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        raise ValueError("user's error")
    assert observed() == before


class _Recurrent(torch.nn.Module):
    """Keeps its state in a plain attribute, set anew at each call (as DLESyM's
    ConvGRU blocks do: ``self.h = ...``), not in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.h: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x) if self.h is None else self.h
        self.h = self.lin(x) + h
        return self.h


class _HoldsRecurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _Recurrent()


def _recurrent_calls(monkeypatch, measured: bool) -> tuple[list, torch.Tensor]:
    from earth2studio_compile import accuracy

    if not measured:
        monkeypatch.setattr(accuracy.Reference, "before", lambda *a, **k: None)
    torch.manual_seed(0)
    owner = _HoldsRecurrent()
    xs = [torch.randn(2, 4) for _ in range(3)]
    with (
        CompileSession(
            owner, regions=("net",), backend=eager_backend, precision="bf16"
        ) as session,
        torch.no_grad(),
    ):
        outs = [owner.net(x) for x in xs]
    assert session.report.regions[0].precision_error is not None or not measured
    monkeypatch.undo()
    return outs, owner.net.h


def test_the_accuracy_reference_leaves_a_state_attribute_alone(monkeypatch):
    """Regression: the fp32 reference that measures a reduced precision's cost ran
    the core once more on the live module, which set its state attribute a second
    time: DLESyM's forecast in bf16 moved by a relative L2 of 1.5e-2 (CPU,
    2026-11-30) against the same session without the measurement. Now the
    reference runs from the attributes the call started with and puts back those
    the call left: the forecast is bitwise the unmeasured one."""
    measured, h = _recurrent_calls(monkeypatch, measured=True)
    plain, h_plain = _recurrent_calls(monkeypatch, measured=False)
    for a, b in zip(measured, plain, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(h, h_plain)


def test_a_first_call_on_bad_input_keeps_the_precision_and_raises_its_error():
    """An input error at the first call fails in the caller's precision too: the
    caller gets the region's eager error, and the region keeps bf16."""
    model = LinearCore()
    with CompileSession(
        model, regions=("net",), backend=eager_backend, precision="bf16"
    ) as session:
        with torch.no_grad(), pytest.raises(RuntimeError, match="shapes"):
            model.net(torch.randn(2, 3))
    assert session.report.regions[0].precision == "bf16"


def test_a_kept_fp32_submodule_reads_the_device_of_keyword_inputs():
    """Regression: the fp32 wrapper found the device in positional tensors only;
    called with keyword ones (as anemoi's layers are) it took the CPU's autocast
    for theirs. Tensors on the meta device, which has no autocast, leave the
    CPU's alone."""
    seen = []

    class Inner(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.is_autocast_enabled("cpu"))
            return x

    inner = Inner()
    kept = KeepFp32(inner)
    kept.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inner(x=torch.empty(2, device="meta"))
    finally:
        kept.restore()
    assert seen == [True]


def test_a_bf16_region_called_by_keyword_returns_its_callers_dtype():
    """Regression: a bf16 region cast its outputs back to the dtype of its first
    positional tensor; called by keyword (anemoi's processor takes its inputs
    so), it found none and returned bfloat16 where eager returns float32."""

    class ByKeyword(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(input=x)

    core = ByKeyword()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = core(x)
    with CompileSession(
        core, regions=("net",), backend=eager_backend, precision="bf16"
    ) as session:
        with torch.no_grad():
            out = core(x)
    assert session.report.regions[0].precision == "bf16", session.report.summary()
    assert out.dtype == torch.float32
    assert rel_l2(out, expected) < THRESHOLDS["bf16"]
