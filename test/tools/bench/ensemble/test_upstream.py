"""The store a row writes (tools/bench/ensemble/upstream.py), on either kind of grid."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from earth2studio_compile.tools.bench.ensemble.upstream import store_bytes


class _Coords:
    """A prognostic's ``input_coords`` and nothing else."""

    def __init__(self, grid: dict[str, int]) -> None:
        self.coords = OrderedDict(
            batch=np.empty(0),
            time=np.empty(0),
            lead_time=np.zeros(2),  # Aurora's two input times: not in the store
            variable=np.array(["u10m", "v10m", "t2m", "msl", "z500"]),
            **{name: np.arange(n) for name, n in grid.items()},
        )

    def input_coords(self) -> OrderedDict:
        return self.coords


def test_store_bytes_counts_the_grid_after_the_variables():
    lat_lon = _Coords({"lat": 16, "lon": 32})
    assert store_bytes(lat_lon, 2, 3, "all") == 4 * 2 * 4 * 5 * 16 * 32
    assert store_bytes(lat_lon, 2, 3, "few") == 4 * 2 * 4 * 3 * 16 * 32


def test_store_bytes_of_a_hrrr_window():
    # StormCast's grid is hrrr_y/hrrr_x: the workflow bench's floor failed on it
    # with KeyError: 'lat'.
    hrrr = _Coords({"hrrr_y": 16, "hrrr_x": 32})
    assert store_bytes(hrrr, 1, 2, "all") == 4 * 1 * 3 * 5 * 16 * 32
