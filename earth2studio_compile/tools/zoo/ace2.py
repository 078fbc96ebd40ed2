"""The zoo's ACE2: Earth2Studio's ``ACE2ERA5`` around a random fme stepper.

Needs Ai2's ``fme`` package, installed without its dependencies (it pins
torch-harmonics 0.8.0 and pulls plotting and cloud packages the wrapper's path never
imports), with dacite, tensorly, tensorly-torch and wandb, which its imports do need.
fme's spherical-harmonic transforms call torch-harmonics 0.8.0's Legendre API, which
0.9 changed: with torch-harmonics 0.9.x building the network fails
(``clenshaw_curtiss_weights`` gets a tensor). CI installs fme and torch-harmonics
0.8.0 into a folder of their own that shadows the project's 0.9.3 for the ACE2 test
only (``.ci/run``).

The stepper is built from fme's own configuration classes, as the published
checkpoint's ``StepperConfig`` describes it (Ai2's ``ace2-era5`` training
configuration): an SFNO of embed 384 and 8 layers, the ocean mask prescribing
surface temperature, the dry-air and moisture-budget corrector, DSWRFtoa taken from
the next step. Weights are fme's initialisation under a seeded generator; the
normalisation constants are random (seeded). Nothing is downloaded: the forcing
data source is a :class:`.data.SeededRandom` on the model's grid.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from earth2studio_compile.tools.zoo.data import SeededRandom

_FORCING = [
    "land_fraction",
    "ocean_fraction",
    "sea_ice_fraction",
    "DSWRFtoa",
    "HGTsfc",
    "global_mean_co2",
]
_SURFACE = ["PRESsfc", "surface_temperature", "TMP2m", "Q2m", "UGRD10m", "VGRD10m"]
_LEVELED = [
    "air_temperature",
    "specific_total_water",
    "eastward_wind",
    "northward_wind",
]
_DIAGNOSTIC = [
    "LHTFLsfc",
    "SHTFLsfc",
    "PRATEsfc",
    "ULWRFsfc",
    "ULWRFtoa",
    "DLWRFsfc",
    "DSWRFsfc",
    "USWRFsfc",
    "USWRFtoa",
    "tendency_of_total_water_path_due_to_advection",
    "TMP850",
    "h500",
]
_POSITIVE = ["Q2m", "PRATEsfc", "ULWRFsfc", "ULWRFtoa", "DLWRFsfc", "DSWRFsfc"]
_POSITIVE += ["USWRFsfc", "USWRFtoa"]
# The published network (ace2-era5 training configuration).
_FULL: dict[str, Any] = {
    "embed_dim": 384,
    "filter_type": "linear",
    "hard_thresholding_fraction": 1.0,
    "use_mlp": True,
    "normalization_layer": "instance_norm",
    "num_layers": 8,
    "operator_type": "dhconv",
    "scale_factor": 1,
    "separable": False,
    "spectral_layers": 3,
    "spectral_transform": "sht",
}
# The same network, narrow and shallow.
_SMALL: dict[str, Any] = {**_FULL, "embed_dim": 16, "num_layers": 2}


def _grid(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray]:
    """ACE's grid: Gaussian latitudes (as ``earth2studio.data.ace2``), cell-centred
    longitudes."""
    from scipy.special import roots_legendre

    lat = np.degrees(np.arcsin(roots_legendre(nlat)[0]))
    return lat, np.linspace(0, 360, nlon, endpoint=False) + 180 / nlon


def _stepper(
    nlat: int, nlon: int, levels: int, network: dict[str, Any], gen: torch.Generator
) -> Any:
    """An fme ``Stepper`` from fme's configuration classes, with random weights."""
    from fme.ace.stepper.single_module import StepperConfig
    from fme.core.coordinates import HybridSigmaPressureCoordinate, LatLonCoordinates
    from fme.core.dataset_info import DatasetInfo
    from fme.core.step.step import StepSelector

    leveled = [f"{name}_{k}" for name in _LEVELED for k in range(levels)]
    prognostic = _SURFACE + leveled
    names = _FORCING + prognostic + _DIAGNOSTIC
    means = torch.randn(len(names), generator=gen).tolist()
    stds = (0.5 + torch.rand(len(names), generator=gen)).tolist()
    water = [f"specific_total_water_{k}" for k in range(levels)]
    step = {
        "builder": {"type": "SphericalFourierNeuralOperatorNet", "config": network},
        "in_names": _FORCING + prognostic,
        "out_names": prognostic + _DIAGNOSTIC,
        "normalization": {
            "network": {
                "means": dict(zip(names, means)),
                "stds": dict(zip(names, stds)),
            }
        },
        "ocean": {
            "surface_temperature_name": "surface_temperature",
            "ocean_fraction_name": "ocean_fraction",
        },
        "corrector": {
            "conserve_dry_air": True,
            "moisture_budget_correction": "advection_and_precipitation",
            "force_positive_names": water + _POSITIVE,
        },
        "next_step_forcing_names": ["DSWRFtoa"],
    }
    lat, lon = _grid(nlat, nlon)
    # Hybrid sigma-pressure interfaces from the model top (pure pressure) down to
    # the surface (pure sigma), which the corrector integrates over.
    sigma = torch.linspace(0, 1, levels + 1)
    info = DatasetInfo(
        horizontal_coordinates=LatLonCoordinates(
            lat=torch.tensor(lat, dtype=torch.float32),
            lon=torch.tensor(lon, dtype=torch.float32),
        ),
        vertical_coordinate=HybridSigmaPressureCoordinate(
            ak=2e4 * sigma * (1 - sigma), bk=sigma**2
        ),
        timestep=datetime.timedelta(hours=6),
    )
    # Through fme's own state path, as `load_stepper` reads a published checkpoint:
    # it puts the coordinates on fme's device (CUDA where there is one), where the
    # corrector meets the network's outputs; built in place they would stay on
    # the CPU and the first corrected step on a GPU would fail.
    info = DatasetInfo.from_state(info.get_state())
    config = StepperConfig(step=StepSelector(type="single_module", config=step))
    return config.get_stepper(info)


def ace2(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio ACE2ERA5 around a random fme SFNO stepper.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the published layout, 180x360 Gaussian grid, 8 model levels (38
        prognostic, 6 forcing and 12 diagnostic variables), SFNO embed 384 with 8
        layers; ``"small"``: 16x32, 2 levels (14 prognostic variables), embed 16
        with 2 layers. By default "small"
    seed : int, optional
        Weight seed (the forcing data's seed too), by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.ACE2ERA5``; its network is
        ``model.stepper.modules[0]`` (the stepper is not a module)
    """
    from earth2studio.models.px import ACE2ERA5

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    nlat, nlon, levels = (180, 360, 8) if full else (16, 32, 2)
    stepper = _stepper(nlat, nlon, levels, _FULL if full else _SMALL, gen)
    for module in stepper.modules:
        module.eval()
    lat, lon = _grid(nlat, nlon)
    forcing = SeededRandom(OrderedDict({"lat": lat, "lon": lon}), seed)
    model = ACE2ERA5(stepper, forcing_data_source=forcing)
    # The wrapper keeps its grid in instance attributes (ACE's 1-degree grid), so
    # the small size sets them; the full size's grid is the same as the wrapper's.
    model.lat, model.lon = lat, lon
    return model
