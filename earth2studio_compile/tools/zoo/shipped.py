"""The zoo's Earth2Studio wrappers as shipped: FCN, DLWP and Persistence.

Each builder takes ``size`` and ``seed`` and returns Earth2Studio's own wrapper around
a random core (physicsnemo's AFNO and DLWP); a small size only overrides the wrapper's
fixed grid (:func:`.grid.on_grid`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from earth2studio_compile.tools.zoo.grid import Grid, on_grid, subclass

# Variables of Earth2Studio's DLWP (7 atmospheric fields on the cubed sphere).
_DLWP_CHANNELS = 7


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
        cls = on_grid(FCN, grid)
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

    base = on_grid(DLWP, grid) if (grid.nlat, grid.nlon) != (721, 1440) else DLWP
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
    return subclass(
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
