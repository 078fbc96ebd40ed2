"""The loaded runner of an artifact (earth2studio_compile.artifacts.aot_runner) on
CPU: its signature checks, binding and warm-up; its CUDA graphs on a GPU.
"""

from __future__ import annotations

import gc
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from aot_helpers import aot_target, eager, load, tiny_target
from tiny_cores import SteppedCore, TinyCore

from earth2studio_compile.aot import capture_calls
from earth2studio_compile.artifacts import aot_runner
from earth2studio_compile.artifacts.aot_build import build_region
from earth2studio_compile.artifacts.aot_load import load_runner, verify
from earth2studio_compile.artifacts.aot_runner import AotRunner, SignatureMismatch
from earth2studio_compile.metrics import rel_l2


def test_an_artifact_serves_only_the_argument_values_it_was_built_for(tmp_path):
    """Export bakes a Python number in: the runner ran step 0's program for every
    later step (a per-step LoRA's correction lost), now it refuses it."""
    core, x = SteppedCore(uses_step=True), torch.randn(4, 8)
    build_region(tiny_target(core), (x, 0), {}, root=tmp_path)
    runner = load_runner(tiny_target(core), (x, 0), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert rel_l2(runner(x, 0), core(x, 0)) <= 1e-5
    with pytest.raises(SignatureMismatch, match="other arguments 1, built for 0"):
        runner(x, 1)
    with pytest.raises(SignatureMismatch):
        runner(x, step=0)  # another structure: no value compares equal by accident
    # Another value has its own key: no artifact for it until built.
    assert "no artifact" in load_runner(tiny_target(core), (x, 1), {}, root=tmp_path)


@pytest.mark.parametrize(
    "layout",
    [
        # Aurora's Perceiver: its latents, one row expanded over every patch.
        lambda x: x[:1].expand(4, 8),
        lambda x: x.t().contiguous().t(),  # dense, another order
        lambda x: x[:, ::2].repeat(1, 2),  # contiguous, no change
    ],
)
def test_an_input_laid_out_otherwise_than_the_build_saw_computes_right(
    tmp_path, layout
):
    """The build exports a clone of the first call's inputs, and an expanded input's
    clone is contiguous: AOTInductor's code read the live expanded latents as if
    they were (non-finite Aurora outputs). The runner gives the code its inputs in
    the layout it was built for, at its first call and later ones."""
    core = TinyCore()
    x = layout(torch.randn(4, 8))
    target = tiny_target(core)
    build_region(target, (x,), {}, root=tmp_path)
    runner = load_runner(target, (x,), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    for _ in range(3):
        x = layout(torch.randn(4, 8))
        assert rel_l2(runner(x), eager(core, (x,))) <= 1e-5


def test_an_argument_the_core_does_not_read_serves_every_value(tmp_path):
    core, x = SteppedCore(uses_step=False), torch.randn(4, 8)
    target = tiny_target(core, unused=("step",))
    assert target.aot_key((x, 0), {})[0] == target.aot_key((x, 7), {})[0]
    build_region(target, (x, 0), {}, root=tmp_path)
    runner = load_runner(target, (x, 3), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    for step in (3, 4, 40):
        assert rel_l2(runner(x, step), core(x, step)) <= 1e-5


def test_outputs_follow_weight_changes(built):
    runner = load(built)
    assert isinstance(runner, AotRunner), runner
    before = runner(*built.args)
    weight = built.core.head.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)  # in place: the bound tensor itself
        changed = runner(*built.args)
        assert rel_l2(changed, before) > 1e-3
        assert rel_l2(changed, eager(built.core, built.args)) <= 1e-5
        # A replaced parameter (not updated in place) is rebound, never stale.
        built.core.head.weight = torch.nn.Parameter(saved * 0.5)
        replaced = runner(*built.args)
        assert rel_l2(replaced, eager(built.core, built.args)) <= 1e-5
    finally:
        built.core.head.weight = weight
        with torch.no_grad():
            weight.copy_(saved)
    assert rel_l2(runner(*built.args), before) == 0.0


def test_another_input_shape_is_refused_by_the_runner(built):
    runner = load(built)
    assert isinstance(runner, AotRunner), runner
    with pytest.raises(SignatureMismatch):
        runner(torch.cat([built.args[0]] * 2))


class _SyncsElsewhereWhileCapturing:
    """A loader whose run, during a CUDA-graph capture, has another thread wait on a
    CUDA event, as OverlappedIO's writers wait on a step's copy."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.errors, self.captures = loader, [], 0
        self.event = torch.cuda.Event()
        self.event.record()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def boxed_run(self, tensors: list[torch.Tensor]) -> Any:
        if torch.cuda.is_current_stream_capturing():
            self.captures += 1
            waiter = threading.Thread(target=self._wait)
            waiter.start()
            waiter.join()
        return self.loader.boxed_run(tensors)

    def _wait(self) -> None:
        try:
            self.event.synchronize()
        except Exception as e:  # raised in that thread: kept for the test
            self.errors.append(e)


@pytest.mark.gpu
def test_cuda_graph_runner_keeps_held_outputs(tmp_path):
    """On CUDA the runner captures its own graph at call 2 and clones outputs; its
    capture leaves other threads free to wait on CUDA events (a "global" capture
    made their waits fail: an OverlappedIO writer's, in a workflow's second call)."""
    from earth2studio_compile import example_input
    from earth2studio_compile.precision import scope
    from earth2studio_compile.tools import zoo

    device = torch.device("cuda")
    model = zoo.build("fcn", size="small").to(device)
    core = model.model
    x, coords = example_input(model)
    args, kwargs, *_ = capture_calls(model, [core], x, coords)[id(core)]
    owner = f"{type(model).__module__}.{type(model).__qualname__}"
    target = aot_target(core, owner, "fp32", device, mode="reduce-overhead")
    build_region(target, args, kwargs, root=tmp_path)
    runner = load_runner(target, args, kwargs, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    assert runner.cudagraphs
    runner.loader = elsewhere = _SyncsElsewhereWhileCapturing(runner.loader)
    inputs = [torch.randn_like(args[0]) for _ in range(3)]
    outs = [runner(i) for i in inputs]
    assert runner.phases["cudagraph_capture"] >= 0.0
    assert (elsewhere.captures, elsewhere.errors) == (1, [])
    for i, out in zip(inputs, outs):
        with torch.no_grad(), scope("fp32", device):
            assert verify(out, core(i), "fp32") is None
    # Kept unused (its region eager for being slower), it holds no graph memory;
    # a later call records the graph again.
    held = torch.cuda.memory_allocated(device)
    runner.free_graph()
    gc.collect()
    assert torch.cuda.memory_allocated(device) < held
    again = runner(inputs[1])
    assert elsewhere.captures == 2
    with torch.no_grad(), scope("fp32", device):
        assert verify(again, core(inputs[1]), "fp32") is None


# -- The recorded convolutions, replayed before the first run -----------------------
def _conv_runner(conv_built, root=None):
    runner = load_runner(
        tiny_target(conv_built.core),
        conv_built.args,
        {},
        root=root if root is not None else conv_built.root,
    )
    assert isinstance(runner, AotRunner), runner
    return runner


class _Spy:
    """A loader that notes each run in ``events``."""

    def __init__(self, loader, events: list[str]) -> None:
        self.loader, self.events = loader, events

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def boxed_run(self, tensors):
        self.events.append("run")
        return self.loader.boxed_run(tensors)


@pytest.fixture
def warms(monkeypatch):
    """The CPU warms its convolutions as CUDA does; each replay noted (``"warm
    <count>"``) in the list returned."""
    events: list[str] = []
    real = aot_runner._torch.warm_convolutions

    def noted(record, device):
        count = real(record, device)
        events.append(f"warm {count}")
        return count

    monkeypatch.setattr(aot_runner, "WARM_DEVICES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(aot_runner._torch, "warm_convolutions", noted)
    return events


def test_the_first_call_replays_the_convolutions_before_its_run(conv_built, warms):
    runner = _conv_runner(conv_built)
    runner.loader = _Spy(runner.loader, warms)
    first = runner(*conv_built.args)
    again = runner(*conv_built.args)
    assert warms == ["warm 3", "run", "run"]
    assert runner.phases["warm_convolutions"] >= 0.0
    assert runner.phases["first_run"] >= 0.0
    # The replay's outputs are discarded: the artifact's answer is unchanged.
    plain = _conv_runner(conv_built)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aot_runner, "WARM_DEVICES", frozenset())
        unwarmed = plain(*conv_built.args)
    assert "warm_convolutions" not in plain.phases
    assert torch.equal(first, unwarmed) and torch.equal(again, unwarmed)
    assert rel_l2(first, eager(conv_built.core, conv_built.args)) <= 1e-5


def test_the_cpu_does_not_warm(conv_built):
    runner = _conv_runner(conv_built)
    runner(*conv_built.args)
    assert "warm_convolutions" not in runner.phases


def _rewritten(conv_built, root: Path, record: bytes | None) -> Path:
    """A copy of the conv artifact under ``root`` whose record is ``record``
    (None: none), its checksums made to match."""
    from earth2studio_compile.artifacts import store

    target = root / "aot" / conv_built.path.name
    shutil.copytree(conv_built.path, target)
    meta = json.loads((target / "meta.json").read_text())
    member = target / "convolutions.json"
    if record is None:
        member.unlink()
        del meta["sha256"]["convolutions.json"]
    else:
        member.write_bytes(record)
        meta["sha256"]["convolutions.json"] = store.sha256_file(member)
    (target / "meta.json").write_text(json.dumps(meta))
    return root


_WRONG_CHANNELS = [
    {
        "op": "convolution",
        "tensors": [
            [[1, 5, 4, 4], [80, 16, 4, 1], "float32"],
            [[2, 3, 1, 1], [3, 1, 1, 1], "float32"],
            None,
        ],
        "arguments": [[1, 1], [0, 0], [1, 1], False, [0, 0], 1],
    }
]


@pytest.mark.parametrize(
    "record",
    [b"\x00garbled", b'[{"op": "linear"}]', json.dumps(_WRONG_CHANNELS).encode()],
    ids=["not-json", "not-an-entry", "fails-to-run"],
)
def test_a_record_that_cannot_be_replayed_costs_the_warm_up_only(
    conv_built, tmp_path, warms, record
):
    root = _rewritten(conv_built, tmp_path, record)
    runner = _conv_runner(conv_built, root)
    out = runner(*conv_built.args)
    assert "warm_convolutions" not in runner.phases
    assert rel_l2(out, eager(conv_built.core, conv_built.args)) <= 1e-5


def test_an_artifact_without_a_record_runs_as_before(conv_built, tmp_path, warms):
    """Artifacts built before convolutions were recorded."""
    runner = _conv_runner(conv_built, _rewritten(conv_built, tmp_path, None))
    out = runner(*conv_built.args)
    assert warms == [] and "warm_convolutions" not in runner.phases
    assert rel_l2(out, eager(conv_built.core, conv_built.args)) <= 1e-5


@pytest.mark.gpu
def test_a_conv_artifact_warms_its_convolutions_on_cuda(tmp_path):
    """On CUDA the first call replays the recorded convolutions (a phase of its
    own) and the artifact still gives eager's answer."""
    from tiny_cores import ConvCore

    from earth2studio_compile.precision import scope

    device = torch.device("cuda")
    torch.manual_seed(0)
    core = ConvCore().eval().to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    target = aot_target(core, "tiny_cores.ConvCore", "fp32", device)
    path = build_region(target, (x,), {}, root=tmp_path)
    assert (path / "convolutions.json").is_file()
    runner = load_runner(target, (x,), {}, root=tmp_path)
    assert isinstance(runner, AotRunner), runner
    out = runner(x)
    assert runner.phases["warm_convolutions"] >= 0.0
    with torch.no_grad(), scope("fp32", device):
        assert verify(out, core(x), "fp32") is None
