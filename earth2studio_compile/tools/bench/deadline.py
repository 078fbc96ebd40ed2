"""A bench run's deadline: a row starts only if it can finish in the time left.

The workflow mode and ``--ensemble`` write their JSON after every row, so a row that
finished survives a later timeout; :class:`Deadline` keeps them from starting a row
that cannot finish, judged by the longest earlier row of the same kind (a row with
none before it starts, and is stopped at the deadline). Rows compared with each
other start together or not at all: an eager row starts only if one of the
compiled rows compared with it can finish after it, and a compiled row whose eager
row was skipped is skipped too (a compiled sample with no eager one beside it spent
the time that a whole pair could have used).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


class Deadline:
    """Seconds from its creation after which no row starts.

    Parameters
    ----------
    seconds : float | None
        The deadline; None: none
    keys : Sequence[str]
        What makes two rows the same kind (their spec's values of these keys)
    """

    def __init__(self, seconds: float | None, keys: Sequence[str]) -> None:
        self.seconds, self.keys = seconds, tuple(keys)
        self.began = time.perf_counter()

    def left(self) -> float | None:
        """Seconds left (None: no deadline)."""
        if self.seconds is None:
            return None
        return self.seconds - (time.perf_counter() - self.began)

    def needs(self, spec: dict[str, Any], done: Sequence[dict[str, Any]]) -> float:
        """The longest ``process_s`` of an earlier row of ``spec``'s kind (0: none)."""
        kind = tuple(spec.get(k) for k in self.keys)
        return max(
            (
                r["process_s"]
                for r in done
                if r.get("process_s") and tuple(r.get(k) for k in self.keys) == kind
            ),
            default=0.0,
        )

    def skip(
        self,
        spec: dict[str, Any],
        done: Sequence[dict[str, Any]],
        then: Sequence[dict[str, Any]] = (),
    ) -> str | None:
        """Why ``spec`` does not start (None: it starts).

        Parameters
        ----------
        spec : dict[str, Any]
            The row about to start
        done : Sequence[dict[str, Any]]
            The rows so far, with ``process_s`` where measured
        then : Sequence[dict[str, Any]], optional
            Rows compared with ``spec`` that would run after it: ``spec`` starts
            only if the quickest of them (by earlier rows of its kind) can finish
            after it; by default none

        Returns
        -------
        str | None
            ``"skipped: deadline"``, with the seconds an earlier row of its kind
            took where that is more than what is left
        """
        left = self.left()
        if left is None:
            return None
        if left <= 0:
            return "skipped: deadline"
        need = self.needs(spec, done)
        after = min((self.needs(t, done) for t in then), default=0.0)
        if need + after > left:
            pair = f", a row compared with it {after:.0f} s" if after else ""
            return (
                f"skipped: deadline (a row like it took {need:.0f} s{pair},"
                f" {left:.0f} left)"
            )
        return None

    def timeout(self, timeout: float) -> float:
        """``timeout``, cut to the time left."""
        left = self.left()
        return timeout if left is None else max(0.0, min(timeout, left))
