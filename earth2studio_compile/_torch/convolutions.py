"""The convolutions a compiled artifact makes: recorded once, replayed to warm cuDNN.

torch 2.11's AOTInductor binding holds the GIL for a whole run (pytorch issue
#197516), and a conv net's first run is mostly cuDNN's first-call work (plans,
kernel loading), so every other Python thread stalls through it. A
``TorchDispatchMode`` sees the artifact's convolutions with real tensors (their
channels-last strides, no bias where Inductor fused it out, and the flags it
passes): :func:`record_convolutions` keeps each distinct one, and
:func:`warm_convolutions` replays them on empty tensors of the same layout with
eager ops, which let the GIL go, so that the artifact's first run finds the
plans made.

A record is a list of JSON-able entries, one per distinct call::

    {"op": "_convolution",
     "tensors": [[size, stride, dtype], [size, stride, dtype], null],
     "arguments": [stride, padding, dilation, transposed, output_padding, groups,
                   ...]}

``tensors`` are the input, the weight and the bias (null without one);
``arguments`` are the op's other arguments as it got them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The ops recorded, and how many non-tensor arguments follow their three
# tensors: convolution's six, and _convolution's four more (benchmark,
# deterministic, cudnn_enabled, allow_tf32), which pick cuDNN's plan too.
_OPS: dict[str, int] = {"convolution": 6, "_convolution": 10}


def _op(name: str) -> Any:
    return getattr(torch.ops.aten, name).default


def _tensor_entry(t: Any) -> list[Any] | None:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"a convolution's tensor argument is a {type(t).__name__}")
    return [list(t.shape), list(t.stride()), str(t.dtype).removeprefix("torch.")]


class _Recorder(TorchDispatchMode):
    """Notes every convolution it sees; anything it cannot note spoils the lot."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[dict[str, Any]] = []
        self.error: str | None = None
        self._ops = {_op(name): name for name in _OPS}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        name = self._ops.get(func)
        if name is not None and self.error is None:
            try:
                self.entries.append(_entry(name, args, kwargs or {}))
            except Exception as err:  # noted, raised after the run, not inside it
                self.error = f"{type(err).__name__}: {err}"
        return func(*args, **(kwargs or {}))


def _entry(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict:
    if kwargs or len(args) != 3 + _OPS[name]:
        raise ValueError(f"{name} called with {len(args)} arguments and keywords")
    entry = {
        "op": name,
        "tensors": [_tensor_entry(t) for t in args[:3]],
        "arguments": list(args[3:]),
    }
    # As it will be read back: a value JSON cannot hold fails here, not at load.
    return _checked(json.loads(json.dumps(entry)))


def record_convolutions(run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The distinct convolutions ``run()`` makes, in the order first made.

    Parameters
    ----------
    run : Callable[[], Any]
        One call of the compiled code (an artifact's run, or an eager module);
        its result is discarded

    Returns
    -------
    list[dict[str, Any]]
        The record (see the module's description); empty without convolutions

    Raises
    ------
    ValueError
        A convolution could not be recorded (then none is)
    """
    recorder = _Recorder()
    with recorder:
        run()
    if recorder.error is not None:
        raise ValueError(f"a convolution could not be recorded ({recorder.error})")
    unique = {json.dumps(e, sort_keys=True): e for e in recorder.entries}
    return list(unique.values())


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ValueError(f"{what} is not a list of non-negative integers: {value!r}")
    return value


def _checked_tensor(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"{what} is not [size, stride, dtype]: {value!r}")
    size, stride, dtype = value
    if len(_ints(size, f"{what}'s size")) != len(_ints(stride, f"{what}'s stride")):
        raise ValueError(f"{what}'s size and stride differ in length")
    if not isinstance(dtype, str) or not isinstance(
        getattr(torch, dtype, None), torch.dtype
    ):
        raise ValueError(f"{what}'s dtype {dtype!r} is not a torch dtype")
    return value


def _checked_argument(value: Any) -> Any:
    if type(value) in (int, bool):
        return value
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    raise ValueError(f"argument {value!r} is neither an integer, a flag nor a list")


def _checked(entry: Any) -> dict[str, Any]:
    """``entry`` when it is one a replay can make, else ValueError."""
    if not isinstance(entry, dict) or set(entry) != {"op", "tensors", "arguments"}:
        raise ValueError(f"not a convolution entry: {entry!r}")
    name, tensors, arguments = entry["op"], entry["tensors"], entry["arguments"]
    if name not in _OPS:
        raise ValueError(f"unknown op {name!r}")
    if not isinstance(tensors, list) or len(tensors) != 3:
        raise ValueError("tensors are not [input, weight, bias]")
    _checked_tensor(tensors[0], "the input")
    _checked_tensor(tensors[1], "the weight")
    if tensors[2] is not None:
        _checked_tensor(tensors[2], "the bias")
    if not isinstance(arguments, list) or len(arguments) != _OPS[name]:
        raise ValueError(f"{name} takes {_OPS[name]} other arguments")
    for a in arguments:
        _checked_argument(a)
    return entry


def read_convolutions(data: bytes | str) -> list[dict[str, Any]]:
    """A record as :func:`record_convolutions` made it, from its JSON text.

    Parameters
    ----------
    data : bytes | str
        The JSON text of the record

    Returns
    -------
    list[dict[str, Any]]
        The record's entries, each checked

    Raises
    ------
    ValueError
        It is not JSON, not a list, or an entry is not one a replay can make
    """
    record = json.loads(data)
    if not isinstance(record, list):
        raise ValueError("a convolution record is a list")
    return [_checked(entry) for entry in record]


def _empty(entry: list[Any] | None, device: torch.device) -> torch.Tensor | None:
    if entry is None:
        return None
    size, stride, dtype = entry
    return torch.empty_strided(size, stride, dtype=getattr(torch, dtype), device=device)


def warm_convolutions(record: Sequence[Mapping[str, Any]], device: torch.device) -> int:
    """Make each recorded convolution once on empty tensors on ``device``.

    The caller enters the scope the compiled code runs in (``no_grad``, its
    precision flags: cuDNN's plans depend on TF32) and synchronizes. The outputs
    are discarded; the inputs are uninitialized, so they may hold anything.

    Parameters
    ----------
    record : Sequence[Mapping[str, Any]]
        Entries of :func:`record_convolutions` (or :func:`read_convolutions`)
    device : torch.device
        Where to make them

    Returns
    -------
    int
        How many were made

    Raises
    ------
    ValueError
        An entry is not one a replay can make (checked before any is made)
    """
    entries = [_checked(dict(e)) for e in record]
    for e in entries:
        tensors = [_empty(t, device) for t in e["tensors"]]
        _op(e["op"])(*tensors, *e["arguments"])
    return len(entries)
