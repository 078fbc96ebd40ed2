"""The zoo's data source: random fields, the same for the same request."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

from earth2studio_compile._imports import quiet_imports
from earth2studio_compile.tools.zoo.grid import published

with quiet_imports():
    import xarray as xr
    from earth2studio.data import Random
    from earth2studio.data.utils import prep_data_inputs


@published
class SeededRandom(Random):
    """Earth2Studio's ``Random`` data source, the same data for the same request.

    Upstream's ``Random`` draws from numpy's global generator at every fetch, so two
    runs of one forecast would start from different states. Here each (time,
    variable) field is drawn from a generator seeded by a hash of the time, the
    variable and ``seed``: a forecast fetched twice, compiled or eager, sees the same
    input, whatever else ran in between and however the request is split.

    Parameters
    ----------
    domain_coords : OrderedDict[str, np.ndarray]
        Domain coordinates of the data (``lat``, ``lon``)
    seed : int, optional
        Mixed into every field's seed, by default 0
    """

    def __init__(self, domain_coords: OrderedDict, seed: int = 0) -> None:
        super().__init__(domain_coords)
        self.seed = seed

    def __call__(self, time: Any, variable: Any) -> xr.DataArray:
        """Normal random data for ``time`` x ``variable`` on the domain.

        Parameters
        ----------
        time : datetime | list[datetime] | TimeArray
            Timestamps to return data for
        variable : str | list[str] | VariableArray
            Variables to return

        Returns
        -------
        xr.DataArray
            Dimensions ``time``, ``variable``, then the domain's
        """
        times, variables = prep_data_inputs(time, variable)
        shape = tuple(len(v) for v in self.domain_coords.values())
        data = np.stack(
            [np.stack([self._field(t, v, shape) for v in variables]) for t in times]
        )
        coords = {"time": times, "variable": variables, **self.domain_coords}
        return xr.DataArray(data=data, dims=list(coords), coords=coords)

    def _field(self, time: Any, variable: str, shape: tuple[int, ...]) -> np.ndarray:
        # A stable hash (Python's hash() of a str changes between processes).
        key = f"{self.seed}|{np.datetime64(time, 'ns')}|{variable}".encode()
        seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(shape)


def random_source(model: Any, seed: int = 0) -> SeededRandom:
    """A random data source on ``model``'s grid, the same for the same request.

    Parameters
    ----------
    model : Any
        A prognostic with ``lat`` and ``lon`` input coordinates, or another
        spatial grid in the input coordinates after ``variable`` (StormCast's
        ``hrrr_y``, ``hrrr_x``; DLESyM's HEALPix ``face``, ``height``,
        ``width``), else in the last two
    seed : int, optional
        Data seed, by default 0

    Returns
    -------
    SeededRandom
        An ``earth2studio.data.Random`` whose normal random data depend only on the
        requested time and variable (and ``seed``): no reseeding needed to compare
        two runs
    """
    coords = model.input_coords()
    names = list(coords)
    if "lat" in coords:
        dims = ["lat", "lon"]
    elif "variable" in coords:
        dims = names[names.index("variable") + 1 :]
    else:
        dims = names[-2:]
    return SeededRandom(OrderedDict({d: coords[d] for d in dims}), seed)


class Prefetched:
    """A data source whose answers are kept: the same request again costs only
    a copy, as for a user whose initial state was fetched before the forecast
    (to local disk or memory) rather than drawn or downloaded during it.

    Parameters
    ----------
    source : Any
        The data source whose answers are kept (called once per request)
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self._kept: dict[tuple[tuple[Any, ...], tuple[str, ...]], xr.DataArray] = {}

    def __call__(self, time: Any, variable: Any) -> xr.DataArray:
        """``source(time, variable)``, kept from the first such request.

        Parameters
        ----------
        time : datetime | list[datetime] | TimeArray
            Timestamps to return data for
        variable : str | list[str] | VariableArray
            Variables to return

        Returns
        -------
        xr.DataArray
            A copy of the kept answer (a caller may change it)
        """
        times, variables = prep_data_inputs(time, variable)
        key = (
            tuple(np.datetime64(t, "ns") for t in times),
            tuple(str(v) for v in variables),
        )
        if key not in self._kept:
            self._kept[key] = self.source(time, variable)
        return self._kept[key].copy()
