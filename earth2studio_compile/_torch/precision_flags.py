"""PyTorch's fp32 precision flags: which exist, what they read, what they store.

The per-backend ``fp32_precision`` flags (torch >= 2.9) form a tree whose children
may follow their parent; reading one cannot tell an inherited value from its own.
This module reads the flags through torch's C++ getter and setter and tells the
two apart; :mod:`earth2studio_compile._torch.fp32_scope` forces and restores them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# PyTorch >= 2.9 keeps the precision of fp32 matmuls, convolutions and RNNs twice: in
# the legacy flags (``torch.backends.cuda.matmul.allow_tf32``,
# ``torch.backends.cudnn.allow_tf32``, ``torch.set_float32_matmul_precision``) and in a
# tree of per-backend ``fp32_precision`` flags: ``torch.backends`` above
# ``torch.backends.cudnn`` (all of CUDA) and ``torch.backends.mkldnn``, each above its
# ``matmul``, ``conv`` and ``rnn``. Measured on torch 2.11 and 2.14.1:
# - a legacy getter raises ("mix of the legacy and new APIs") once the two disagree,
#   e.g. after ``torch.backends.cuda.matmul.fp32_precision = "tf32"``;
# - a per-backend getter returns the inherited value: a flag left at "none" follows its
#   parent, one set explicitly does not, and reading cannot tell the two apart;
# - the legacy setters write per-backend flags explicitly (``allow_tf32 = False`` pins
#   ``cuda.matmul`` at "ieee"), and so does Dynamo when it finishes a compile (it
#   writes back the value it read for ``cuda.matmul``);
# - torch 2.14 starts cuDNN's ``conv`` and ``rnn`` at an internal default that reads
#   "tf32", follows a parent once one is set, and that no setter writes back
#   ("default" is refused); torch 2.11 starts them at an explicit "tf32".
# So which flags follow their parent is probed (the parent set to "ieee", then "tf32"),
# precision is forced through the parents wherever the children follow them, and the
# flags' stored values, not their readings, are put back.
_FP32_TREE = (
    # (public object, backend, op, parent)
    ("torch.backends", "generic", "all", None),
    ("torch.backends.cudnn", "cuda", "all", "torch.backends"),
    ("torch.backends.cuda.matmul", "cuda", "matmul", "torch.backends.cudnn"),
    ("torch.backends.cudnn.conv", "cuda", "conv", "torch.backends.cudnn"),
    ("torch.backends.cudnn.rnn", "cuda", "rnn", "torch.backends.cudnn"),
    ("torch.backends.mkldnn", "mkldnn", "all", "torch.backends"),
    ("torch.backends.mkldnn.matmul", "mkldnn", "matmul", "torch.backends.mkldnn"),
    ("torch.backends.mkldnn.conv", "mkldnn", "conv", "torch.backends.mkldnn"),
    ("torch.backends.mkldnn.rnn", "mkldnn", "rnn", "torch.backends.mkldnn"),
)
FP32_ROOT = "torch.backends"
FP32_CUDA = "torch.backends.cudnn"
FP32_CPU = "torch.backends.mkldnn"
INHERIT = "inherit"
"""Stored value of a per-backend flag that follows its parent."""


# The functions behind the public attributes: a precision scope reads and writes the
# flags some 40 times per call, and the attributes cost 3-8 us a read (2-core CPU).
_FP32_GET: Callable[[str, str], str] | None = getattr(
    torch._C, "_get_fp32_precision_getter", None
)
_FP32_SET: Callable[[str, str, str], None] | None = getattr(
    torch._C, "_set_fp32_precision_setter", None
)
FlagKey = tuple[str, str]  # (backend, op), the flag's C++ key


@functools.cache
def fp32_flags() -> dict[str, tuple[str, str, str | None]]:
    """The per-backend fp32 precision flags of this PyTorch, parents first.

    Returns
    -------
    dict[str, tuple[str, str, str | None]]
        Public name -> (backend, op, parent's name); empty before torch 2.9, which
        has only the legacy flags
    """
    if _FP32_GET is None or _FP32_SET is None:
        return {}
    found: dict[str, tuple[str, str, str | None]] = {}
    for name, backend, op, parent in _FP32_TREE:
        if parent is not None and parent not in found:
            continue
        try:
            if isinstance(_FP32_GET(backend, op), str):
                found[name] = (backend, op, parent)
        except Exception:  # this PyTorch does not know the pair
            continue
    return found


def fp32_flag(name: str) -> str:
    """What per-backend flag ``name`` reads now (an inherited value resolved)."""
    backend, op, _ = fp32_flags()[name]
    return read_flag(backend, op)


def read_flag(backend: str, op: str) -> str:
    """The value a per-backend fp32 precision flag reads now.

    Parameters
    ----------
    backend, op : str
        The flag's backend (``"cuda"``, ``"mkldnn"``, ...) and operation (``"conv"``,
        ``"matmul"``, ...), as ``torch.backends`` names them

    Returns
    -------
    str
        What it reads, an inherited value resolved (e.g. ``"ieee"``, ``"tf32"``)
    """
    assert _FP32_GET is not None
    return str(_FP32_GET(backend, op))


def write_flag(key: FlagKey, value: str) -> None:
    """Set a per-backend fp32 precision flag.

    Parameters
    ----------
    key : FlagKey
        The flag's ``(backend, op)``
    value : str
        Its new value (``"ieee"``, ``"tf32"`` or ``"none"``)
    """
    assert _FP32_SET is not None
    _FP32_SET(key[0], key[1], value)


@functools.cache
def fp32_children() -> dict[FlagKey, tuple[FlagKey, ...]]:
    """Each per-backend flag's key -> its children's keys."""
    flags = fp32_flags()
    return {
        flags[name][:2]: tuple(f[:2] for f in flags.values() if f[2] == name)
        for name in flags
    }


def stored_children(parent: FlagKey, then: str) -> list[tuple[FlagKey, str]]:
    """Stored values of ``parent``'s children: their own, or :data:`INHERIT`.

    Sets ``parent`` to "ieee" and to "tf32" to see which children follow it, then
    to ``then``.

    Parameters
    ----------
    parent : FlagKey
        The parent flag's ``(backend, op)``
    then : str
        The value ``parent`` is left at

    Returns
    -------
    list[tuple[FlagKey, str]]
        Each child's key and stored value
    """
    children = fp32_children()[parent]
    try:
        write_flag(parent, "ieee")
        first = [read_flag(*c) for c in children]
        write_flag(parent, "tf32")
        second = [read_flag(*c) for c in children]
    finally:
        write_flag(parent, then)
    return [
        (c, INHERIT if (a, b) == ("ieee", "tf32") else a)
        for c, a, b in zip(children, first, second)
    ]


def stored_fp32_flags() -> dict[str, str]:
    """Every per-backend flag's stored value; :data:`INHERIT` where it follows.

    Reads without raising and leaves every flag as it found it. Empty before
    torch 2.9.
    """
    flags = fp32_flags()
    if not flags:
        return {}
    names = {f[:2]: name for name, f in flags.items()}
    root_key = flags[FP32_ROOT][:2]
    root = read_flag(*root_key)  # no parent: what it reads is what it stores
    stored = {root_key: root}
    stored.update(stored_children(root_key, then=root))
    for backend in fp32_children()[root_key]:
        own = stored[backend]
        stored.update(stored_children(backend, "none" if own == INHERIT else own))
    return {names[key]: value for key, value in stored.items()}


def cudnn_tf32_prop() -> Any:
    """The descriptor behind ``torch.backends.cudnn.allow_tf32``."""
    return vars(type(torch.backends.cudnn))["allow_tf32"]
