"""An artifact's convolutions recorded and replayed (earth2studio_compile._torch.
convolutions), on the CPU: what a dispatch mode sees, the record's checks, and a
replay that makes exactly the recorded calls."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_cores import ConvCore

from earth2studio_compile._torch import convolutions
from earth2studio_compile._torch.convolutions import (
    read_convolutions,
    record_convolutions,
    warm_convolutions,
)

CPU = torch.device("cpu")


@pytest.fixture
def conv():
    torch.manual_seed(0)
    return ConvCore().eval(), torch.randn(2, 3, 8, 8)


def _eager_record(core, x):
    with torch.no_grad():
        return record_convolutions(lambda: core(x))


def test_each_distinct_convolution_is_recorded_once(conv):
    core, x = conv
    record = _eager_record(core, x)
    # ``b`` runs twice on inputs of one shape: one entry.
    assert [e["op"] for e in record] == ["convolution"] * 3
    assert len({json.dumps(e, sort_keys=True) for e in record}) == 3
    for entry, m in zip(record, (core.a, core.b, core.c)):
        inp, weight, bias = entry["tensors"]
        assert weight[:2] == [list(m.weight.shape), list(m.weight.stride())]
        assert (bias is None) == (m.bias is None)
        stride, padding, dilation, transposed, _, groups = entry["arguments"]
        assert [stride, padding, dilation, groups] == [
            list(m.stride),
            list(m.padding),
            list(m.dilation),
            m.groups,
        ]
        assert transposed == (m is core.c)
    assert record[0]["tensors"][0] == [list(x.shape), list(x.stride()), "float32"]


def test_the_record_is_json_and_reads_back(conv):
    record = _eager_record(*conv)
    assert read_convolutions(json.dumps(record)) == record
    assert read_convolutions(json.dumps(record).encode()) == record


def test_a_convolution_that_cannot_be_noted_spoils_the_record_not_the_run(
    conv, monkeypatch
):
    core, x = conv

    def odd(*args):
        raise TypeError("odd")

    monkeypatch.setattr(convolutions, "_entry", odd)
    out = []
    with pytest.raises(ValueError, match="could not be recorded"), torch.no_grad():
        record_convolutions(lambda: out.append(core(x)))
    with torch.no_grad():
        assert torch.equal(out[0], core(x))


def test_no_convolutions_no_entries():
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.no_grad():
        assert record_convolutions(lambda: lin(x)) == []


def _entry(**change):
    entry = {
        "op": "_convolution",
        "tensors": [
            [[1, 2, 4, 4], [32, 1, 8, 2], "float32"],
            [[2, 2, 1, 1], [2, 1, 2, 2], "float32"],
            None,
        ],
        "arguments": [[1, 1], [0, 0], [1, 1], False, [0, 0], 1]
        + [False, False, True, True],
    }
    return entry | change


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        "[1]",
        json.dumps([{"op": "_convolution"}]),
        json.dumps([_entry(op="linear")]),
        json.dumps([_entry(arguments=[[1, 1]])]),
        json.dumps([_entry(arguments=[[1, 1], [0, 0], [1, 1], 0.5, [0], 1] + [0] * 4)]),
        json.dumps([_entry(tensors=[[[1, -2], [1, 1], "float32"], None, None])]),
        json.dumps([_entry(tensors=[[[1, 2], [1], "float32"]] * 2 + [None])]),
        json.dumps([_entry(tensors=[[[1, 2], [2, 1], "tensor"]] * 2 + [None])]),
        json.dumps([_entry(tensors=[[[1, 2], [2, 1], "float32"]] * 2)]),
    ],
)
def test_a_garbled_record_is_a_value_error(text):
    with pytest.raises(ValueError):
        read_convolutions(text)


def test_a_replay_makes_the_recorded_convolutions_and_changes_nothing(conv):
    core, x = conv
    before = {k: v.clone() for k, v in core.state_dict().items()}
    with torch.no_grad():
        want = core(x)
        record = _eager_record(core, x) + [_entry()]
        assert warm_convolutions(record, CPU) == 4
        # The replay makes each recorded call again, as recorded.
        assert record_convolutions(lambda: warm_convolutions(record, CPU)) == record
        assert torch.equal(core(x), want)
    assert all(torch.equal(v, before[k]) for k, v in core.state_dict().items())


def test_a_replay_checks_every_entry_before_it_makes_any(conv, monkeypatch):
    record = _eager_record(*conv) + [_entry(op="linear")]
    made: list[str] = []
    monkeypatch.setattr(convolutions, "_op", lambda name: lambda *a: made.append(name))
    with pytest.raises(ValueError, match="unknown op"):
        warm_convolutions(record, CPU)
    assert made == []
