"""The zoo's user-style prognostics: a toy conv net and an SFNO-class model.

:class:`GridPrognostic` is written the way an Earth2Studio user writes a model of
their own; :func:`toy` and :func:`sfno` put a core network inside it. Only
:class:`SFNOPrognostic` is in the model table (by name); the others take the generic
compile path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Generator, Iterator

import numpy as np
import torch

from earth2studio_compile._imports import quiet_imports
from earth2studio_compile.tools.zoo.grid import Grid, published

with quiet_imports():
    from earth2studio.models.batch import batch_coords, batch_func
    from earth2studio.models.px.utils import PrognosticMixin
    from earth2studio.utils import handshake_coords, handshake_dim


@published
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


@published
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


@published
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


@published
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
