"""Real Earth2Studio models with random weights, built without downloads.

Used by the demo, the benchmark and the tests. ``size="full"`` builds the
operational configuration (FCN: AFNO on 720x1440, DLWP: cubed sphere 6x64x64 from
721x1440); ``size="small"`` shrinks grids and networks so a CPU compiles them in
seconds. Weights are random (seeded): timings and eager-vs-compiled agreement do not
depend on trained values, forecasts do.

The Earth2Studio wrappers (:class:`earth2studio.models.px.FCN`, ``DLWP``,
``Persistence``) are used as shipped; small variants only override their fixed grid
sizes. ``sfno`` is a user-style prognostic around torch-harmonics' SFNO, since
Earth2Studio's own SFNO wrapper needs makani, which is not on PyPI.

Examples
--------
>>> from earth2studio_compile.tools import zoo
>>> model = zoo.build("fcn", size="small")  # doctest: +SKIP
>>> data = zoo.random_source(model)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from earth2studio_compile._imports import quiet_imports

with quiet_imports():
    import xarray as xr
    from earth2studio.data import Random
    from earth2studio.data.utils import prep_data_inputs
    from earth2studio.models.batch import batch_coords, batch_func
    from earth2studio.models.px.utils import PrognosticMixin
    from earth2studio.utils import handshake_coords, handshake_dim

MODELS = ("fcn", "dlwp", "sfno", "persistence", "toy")
SIZES = ("small", "medium", "full")

# Variables of Earth2Studio's DLWP (7 atmospheric fields on the cubed sphere).
_DLWP_CHANNELS = 7


@dataclass(frozen=True)
class Grid:
    """A lat-lon grid (``nlat`` x ``nlon``), optionally with the south pole."""

    nlat: int
    nlon: int
    south_pole: bool = False

    @property
    def lat(self) -> np.ndarray:
        if self.south_pole:
            return np.linspace(90, -90, self.nlat)
        return np.linspace(90, -90, self.nlat, endpoint=False)

    @property
    def lon(self) -> np.ndarray:
        return np.linspace(0, 360, self.nlon, endpoint=False)


def _subclass(base: Any, name: str, **methods: Callable[..., Any]) -> type:
    """A subclass of ``base`` named ``name`` in this module, overriding ``methods``.

    The model table is keyed by ``module.QualName``: both are set here, so the key
    does not depend on where the class is built.
    """
    names = {"__module__": __name__, "__qualname__": name}
    return type(name, (base,), {**methods, **names})


def _on_grid(cls: Any, grid: Grid) -> type:
    """Subclass of an Earth2Studio wrapper whose fixed lat-lon grid is ``grid``."""

    def input_coords(self: Any) -> OrderedDict:
        coords = cls.input_coords(self)
        coords["lat"], coords["lon"] = grid.lat, grid.lon
        return coords

    def output_coords(self: Any, input_coords: OrderedDict) -> OrderedDict:
        coords = cls.output_coords(self, input_coords)
        coords["lat"], coords["lon"] = grid.lat, grid.lon
        return coords

    name = f"{cls.__name__}{grid.nlat}x{grid.nlon}"
    return _subclass(cls, name, input_coords=input_coords, output_coords=output_coords)


# -- FCN ---------------------------------------------------------------------------
def fcn(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio FCN around a random physicsnemo AFNO.

    Parameters
    ----------
    size : str, optional
        ``"full"``: 26 channels, 720x1440, patch 8, embed 768, depth 12 (FourCastNet
        v1); ``"medium"``: 64x128, patch 4, embed 64, depth 2 (the CPU demo);
        ``"small"``: 16x32, patch 4, embed 32, depth 2. By default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.FCN`` (subclassed for the small grid)
    """
    from earth2studio.models.px import FCN
    from earth2studio.models.px.fcn import VARIABLES
    from physicsnemo.models.afno import AFNO

    torch.manual_seed(seed)
    n = len(VARIABLES)
    if size == "full":
        core = AFNO(
            inp_shape=[720, 1440],
            in_channels=n,
            out_channels=n,
            patch_size=[8, 8],
            embed_dim=768,
            depth=12,
            num_blocks=8,
        )
        cls = FCN
    else:
        # medium: a CPU step of tens of ms, long enough to time against the noise
        # of a shared machine, still compiled in well under a minute.
        medium = size == "medium"
        grid = Grid(64, 128) if medium else Grid(16, 32)
        core = AFNO(
            inp_shape=[grid.nlat, grid.nlon],
            in_channels=n,
            out_channels=n,
            patch_size=[4, 4],
            embed_dim=64 if medium else 32,
            depth=2,
            num_blocks=4,
        )
        cls = _on_grid(FCN, grid)
    center, scale = torch.randn(1, n, 1, 1) * 0.1, 1.0 + torch.rand(1, n, 1, 1)
    return cls(core.eval(), center=center, scale=scale)


# -- DLWP --------------------------------------------------------------------------
def _nearest_map(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Sparse ``rows x cols`` map with one unit weight per row (nearest neighbour)."""
    nearest = torch.randint(cols, (rows,), generator=gen)
    index = torch.stack([torch.arange(rows), nearest])
    return torch.sparse_coo_tensor(index, torch.ones(rows), (rows, cols)).coalesce()


def _dlwp_class(grid: Grid, face: int) -> type:
    from earth2studio.models.px import DLWP

    base = _on_grid(DLWP, grid) if (grid.nlat, grid.nlon) != (721, 1440) else DLWP
    if face == 64:
        return base

    def to_cubedsphere(self: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(*x.shape[:-2], -1) @ self.M
        return x.reshape(*x.shape[:-1], 6, face, face)

    def to_equirectangular(self: Any, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-3]
        x = (self.N @ x.reshape(-1, 6 * face * face).T).T
        return x.reshape(*shape, grid.nlat, grid.nlon)

    name = f"DLWP{grid.nlat}x{grid.nlon}c{face}"
    return _subclass(
        base,
        name,
        to_cubedsphere=to_cubedsphere,
        to_equirectangular=to_equirectangular,
    )


def dlwp(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio DLWP around a random physicsnemo DLWP core.

    Parameters
    ----------
    size : str, optional
        ``"full"``: 721x1440 to a 6x64x64 cubed sphere, 64 initial channels, depth 2
        (the NGC checkpoint's layout); ``"small"``: 9x16 to 6x8x8, 8 channels, depth 1
        (7 convolutions per face instead of 11: the GPU suite compiles it in six
        configurations, and its compiles dominated the suite's time).
        Regridding maps are nearest-neighbour (one weight per row), not the real
        bilinear maps. By default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.DLWP`` (subclassed for the small grid)
    """
    from physicsnemo.models.dlwp import DLWP as DLWPCore

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if size == "full":
        grid, face, channels, depth = Grid(721, 1440, south_pole=True), 64, 64, 2
    else:
        grid, face, channels, depth = Grid(9, 16, south_pole=True), 8, 8, 1
    core = DLWPCore(
        nr_input_channels=2 * _DLWP_CHANNELS + 4,
        nr_output_channels=2 * _DLWP_CHANNELS,
        nr_initial_channels=channels,
        depth=depth,
    ).eval()
    cube = (6, face, face)
    cells, points = 6 * face * face, grid.nlat * grid.nlon
    return _dlwp_class(grid, face)(
        core,
        landsea_mask=(torch.rand(cube, generator=gen) > 0.7).float(),
        orography=torch.rand(cube, generator=gen) * 5e3,
        latgrid=torch.rand(cube, generator=gen) * 180 - 90,
        longrid=torch.rand(cube, generator=gen) * 360,
        cubed_sphere_transform=_nearest_map(cells, points, gen),
        cubed_sphere_inverse=_nearest_map(points, cells, gen),
        center=torch.randn(1, _DLWP_CHANNELS, 1, 1, generator=gen) * 0.1,
        scale=1.0 + torch.rand(1, _DLWP_CHANNELS, 1, 1, generator=gen),
    )


# -- Persistence -------------------------------------------------------------------
def persistence(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio Persistence (no network) on the FCN grid and variables.

    Parameters
    ----------
    size : str, optional
        ``"full"``: 26 variables on 720x1440; ``"small"``: 16x32. By default "small"
    seed : int, optional
        Unused (no weights); accepted for a uniform builder signature

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.Persistence``
    """
    from earth2studio.models.px import Persistence
    from earth2studio.models.px.fcn import VARIABLES

    grid = Grid(720, 1440) if size == "full" else Grid(16, 32)
    return Persistence(list(VARIABLES), OrderedDict({"lat": grid.lat, "lon": grid.lon}))


# -- User-style prognostics (the generic path) ---------------------------------------
class GridPrognostic(torch.nn.Module, PrognosticMixin):
    """A minimal user prognostic: one core network on a lat-lon grid, 6 h steps.

    Written the way an Earth2Studio user writes their own model (``PrognosticMixin``
    hooks, batched coordinate systems, ``create_iterator``), with the tensor work in
    ``self.model`` and numpy/datetime coordinate handling around it. Not in the
    model table, so it takes the generic compile path unless registered.

    Parameters
    ----------
    core : torch.nn.Module
        Network mapping ``[batch, variable, lat, lon]`` to the same shape
    variables : list[str]
        Variable names
    grid : Grid
        Lat-lon grid
    """

    def __init__(self, core: torch.nn.Module, variables: list[str], grid: Grid) -> None:
        super().__init__()
        self.model = core
        self.variables = np.array(variables)
        self.grid = grid

    def input_coords(self) -> OrderedDict:
        return OrderedDict(
            {
                "batch": np.empty(0),
                "lead_time": np.array([np.timedelta64(0, "h")]),
                "variable": self.variables,
                "lat": self.grid.lat,
                "lon": self.grid.lon,
            }
        )

    @batch_coords()
    def output_coords(self, input_coords: OrderedDict) -> OrderedDict:
        target = self.input_coords()
        for i, key in enumerate(target):
            if key != "batch":
                handshake_dim(input_coords, key, i)
            if key in ("variable", "lat", "lon"):
                handshake_coords(input_coords, target, key)
        out = input_coords.copy()
        out["lead_time"] = input_coords["lead_time"] + np.timedelta64(6, "h")
        return out

    @torch.inference_mode()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.model(x.reshape(-1, *shape[-3:])).reshape(shape)

    @batch_func()
    def __call__(self, x: torch.Tensor, coords: OrderedDict) -> tuple:
        return self._forward(x), self.output_coords(coords)

    @batch_func()
    def _default_generator(
        self, x: torch.Tensor, coords: OrderedDict
    ) -> Generator[tuple[torch.Tensor, OrderedDict], None, None]:
        coords = coords.copy()
        self.output_coords(coords)
        yield x, coords
        while True:
            x, coords = self.front_hook(x, coords)  # type: ignore[operator]
            coords = self.output_coords(coords)
            x = self._forward(x)
            x, coords = self.rear_hook(x, coords)  # type: ignore[operator]
            yield x, coords.copy()

    def create_iterator(
        self, x: torch.Tensor, coords: OrderedDict
    ) -> Iterator[tuple[torch.Tensor, OrderedDict]]:
        yield from self._default_generator(x, coords)


class ToyCore(torch.nn.Module):
    """Residual conv net: a stand-in for a user's core network."""

    def __init__(self, channels: int, hidden: int = 32) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(channels, hidden, 3, padding=1, padding_mode="circular"),
            torch.nn.GELU(),
            torch.nn.Conv2d(hidden, hidden, 3, padding=1, padding_mode="circular"),
            torch.nn.GELU(),
            torch.nn.Conv2d(hidden, channels, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * self.net(x)


def toy(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """A user-defined prognostic (:class:`GridPrognostic`) around a small conv net.

    Parameters
    ----------
    size : str, optional
        ``"full"``: 8 variables on 721x1440, 64 hidden channels; ``"small"``: 4
        variables on 16x32. By default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        A :class:`GridPrognostic`
    """
    torch.manual_seed(seed)
    if size == "full":
        variables, grid, hidden = [f"v{i}" for i in range(8)], Grid(721, 1440, True), 64
    else:
        variables, grid, hidden = ["t2m", "u10m", "v10m", "z500"], Grid(16, 32), 16
    return GridPrognostic(ToyCore(len(variables), hidden).eval(), variables, grid)


class SFNOCore(torch.nn.Module):
    """torch-harmonics' SFNO behind a tensor-only ``forward``."""

    def __init__(self, channels: int, grid: Grid, embed_dim: int, layers: int) -> None:
        super().__init__()
        from torch_harmonics.examples.models import SphericalFourierNeuralOperator

        self.sfno = SphericalFourierNeuralOperator(
            img_size=(grid.nlat, grid.nlon),
            grid="equiangular",
            in_chans=channels,
            out_chans=channels,
            embed_dim=embed_dim,
            num_layers=layers,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sfno(x)


class SFNOPrognostic(GridPrognostic):
    """SFNO-class prognostic (torch-harmonics SFNO, 6 h steps) with random weights.

    Its compile spec is the library's
    :data:`~earth2studio_compile.models.TORCH_HARMONICS_SFNO`, listed in the model
    table under this class's name: importing the zoo registers nothing.
    """


def sfno(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """An SFNO-class prognostic around torch-harmonics' SFNO.

    Parameters
    ----------
    size : str, optional
        ``"full"``: 73 channels on 721x1440, embed 256, 8 layers; ``"small"``: 4
        channels on 16x32, embed 16, 2 layers. By default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        A :class:`SFNOPrognostic`
    """
    torch.manual_seed(seed)
    if size == "full":
        variables, grid = [f"v{i}" for i in range(73)], Grid(721, 1440, True)
        embed, layers = 256, 8
    else:
        variables, grid = ["t2m", "u10m", "v10m", "z500"], Grid(16, 32, True)
        embed, layers = 16, 2
    core = SFNOCore(len(variables), grid, embed, layers).eval()
    return SFNOPrognostic(core, variables, grid)


_BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "fcn": fcn,
    "dlwp": dlwp,
    "sfno": sfno,
    "persistence": persistence,
    "toy": toy,
}


def build(name: str, size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Build a named model with random weights.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`, or ``"module:callable"`` for a user factory that
        returns a prognostic (called with no arguments)
    size : str, optional
        ``"small"``, ``"full"``, or ``"medium"`` (``"fcn"`` only), by default "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        The prognostic model, on CPU

    Raises
    ------
    ValueError
        Unknown name or size
    """
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; use one of {SIZES}.")
    if size == "medium" and name != "fcn":
        raise ValueError(
            f"size='medium' exists for 'fcn' only; use 'small' or 'full' for {name!r}."
        )
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)()
    if name not in _BUILDERS:
        raise ValueError(
            f"Unknown model {name!r}; use one of {MODELS} or 'module:callable'."
        )
    # The builders import Earth2Studio's models and physicsnemo (Warp's CUDA probe).
    with quiet_imports():
        return _BUILDERS[name](size=size, seed=seed)


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
    """A random data source on ``model``'s lat-lon grid, the same for the same request.

    Parameters
    ----------
    model : Any
        A prognostic with ``lat`` and ``lon`` input coordinates
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
    return SeededRandom(OrderedDict({"lat": coords["lat"], "lon": coords["lon"]}), seed)
