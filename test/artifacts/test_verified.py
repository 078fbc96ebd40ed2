"""Which weights an artifact gave eager's answer with
(earth2studio_compile.artifacts.verified): the weights' fingerprint, the seal of a
package and weights, and the record beside the artifact."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from earth2studio_compile.artifacts import store, verified
from earth2studio_compile.artifacts.aot_key import PACKAGE


def _core() -> torch.nn.Module:
    torch.manual_seed(0)
    core = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    with torch.no_grad():
        core[1].running_mean.uniform_()  # a buffer with values of its own
    return core


def test_the_fingerprint_is_of_the_values_of_every_parameter_and_buffer():
    core = _core()
    base = verified.weights_print(core)
    assert verified.weights_print(copy.deepcopy(core)) == base
    changed = copy.deepcopy(core)
    with torch.no_grad():  # the smallest change of one element: its last bit
        w = changed[0].weight.view(-1)
        w[3] = torch.nextafter(w[3], torch.tensor(1.0))
    assert verified.weights_print(changed) != base
    swapped = copy.deepcopy(core)
    with torch.no_grad():  # same values, in other places
        swapped[0].weight.copy_(swapped[0].weight.flip(0))
    assert verified.weights_print(swapped) != base
    buffer = copy.deepcopy(core)
    with torch.no_grad():
        buffer[1].running_mean[0] += 1
    assert verified.weights_print(buffer) != base
    half = copy.deepcopy(core).to(torch.bfloat16)
    assert verified.weights_print(half) != base


def test_tensors_in_several_groups_are_all_summed(monkeypatch):
    """Groups of tensors laid end to end (a bound on the temporary copy) cover
    every element of every tensor, and a move from one tensor to the next counts."""
    core = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    base = verified.weights_print(core)
    kept = core[1].bias[-1].item()
    monkeypatch.setattr(verified, "_GROUP", 100)  # a group per tensor
    split = verified.weights_print(core)
    with torch.no_grad():
        core[1].bias[-1] += 1  # the last element of the last group
    assert verified.weights_print(core) != split
    monkeypatch.undo()
    assert verified.weights_print(core) != base
    with torch.no_grad():
        core[1].bias[-1] = kept
    assert verified.weights_print(core) == base


def _artifact(path, package: bytes = b"code"):
    path.mkdir(exist_ok=True)
    (path / PACKAGE).write_bytes(package)
    store.write_meta(path, {"model": "m"}, [PACKAGE])
    return path


def test_a_seal_is_of_the_package_and_the_weights(tmp_path):
    one = _artifact(tmp_path / "one", b"code")
    two = _artifact(tmp_path / "two", b"other")
    assert verified.seal(one, "w") != verified.seal(two, "w")
    assert verified.seal(one, "w") != verified.seal(one, "v")
    assert verified.seal(tmp_path, "w") is None  # no meta.json: nothing to seal


def test_a_recorded_seal_is_known_and_the_record_stays_bounded(tmp_path):
    path = _artifact(tmp_path)
    sealed = verified.seal(path, "w")
    assert not verified.known(path, sealed)
    verified.record(path, sealed)
    assert verified.known(path, sealed) and not verified.known(path, None)
    for i in range(verified.KEEP + 3):
        verified.record(path, f"other-{i}")
    seals = json.loads((path / verified.FILE).read_text())["verified"]
    assert len(seals) == verified.KEEP and not verified.known(path, sealed)
    verified.record(path, None)  # nothing to record
    assert json.loads((path / verified.FILE).read_text())["verified"] == seals


@pytest.mark.parametrize("text", ["not json", '{"verified": [1, 2]}', "[]"])
def test_a_damaged_record_is_not_trusted_and_is_written_again(tmp_path, text):
    path = _artifact(tmp_path)
    (path / verified.FILE).write_text(text)
    assert not verified.known(path, "x")
    verified.record(path, "x")
    assert verified.known(path, "x")


def test_a_cache_that_cannot_be_written_only_means_verifying_again(
    tmp_path, monkeypatch
):
    path = _artifact(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(store, "write_file", refuse)
    verified.record(path, "x")  # no error
    assert not verified.known(path, "x")


def test_the_fingerprint_reads_no_element_on_the_host():
    """Only its sums leave the device: formatting a tensor (sorting groups by their
    str()) read 47,000 elements one at a time from FCN's weights on an H100, 0.55 s
    of a fresh process's first step."""
    core, seen = _core(), []

    class Seen(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Seen():
        verified.weights_print(core)
    assert seen
    assert not {"__repr__", "__format__", "item", "tolist"} & set(seen), set(seen)
