"""PyTorch's pytree utilities: flattening nested inputs and outputs, and specs.

Re-exported from ``torch.utils._pytree``, which has no public home yet; the spec
functions read an ahead-of-time package's call spec.
"""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "tree_flatten",
    "tree_map",
    "tree_unflatten",
    "treespec_dumps",
    "treespec_loads",
]


def treespec_dumps(spec: Any) -> str:
    """A pytree spec's serialised form (what :func:`treespec_loads` reads)."""
    from torch.utils._pytree import treespec_dumps as dumps

    return str(dumps(spec))


def treespec_loads(text: str) -> Any:
    """A pytree spec from its serialised form (the package's call spec)."""
    from torch.utils._pytree import treespec_loads as loads

    return loads(text)


def tree_unflatten(leaves: list[Any], spec: Any) -> Any:
    """The pytree ``spec`` describes, filled with ``leaves``.

    Parameters
    ----------
    leaves : list[Any]
        The leaves, in the order :func:`tree_flatten` gives them
    spec : Any
        The tree's spec (a ``TreeSpec``)

    Returns
    -------
    Any
        The tree
    """
    from torch.utils._pytree import tree_unflatten as unflatten

    return unflatten(leaves, spec)
