"""The zoo's FCN3: Earth2Studio's ``FCN3`` wrapper around a random makani FourCastNet3.

Needs ``makani`` (NVIDIA), which Earth2Studio's FCN3 module imports and which is not
on the package index: CI installs it from the source vendored in ``third_party/``
(Earth2Studio's pinned revision, b38fcb2), with stand-ins for the training and
plotting packages its imports name (``wandb``, ``moviepy``; ``numba``'s ``jit``, which
its zenith angle calls in object mode, a decorator returning the function), into a
folder of their own (``.ci/run``).

The network is built as Earth2Studio's ``FCN3.load_model`` builds it, through
makani's own ``load_model_package``, from a package folder written here (a
``config.json``, normalisation statistics, orography and land-sea mask) with
``pretrained=False``: no checkpoint is read or downloaded. The configuration is
makani's ``fcn3_sc2_edim45_layers10_finetune`` (``config/fourcastnet3.yaml``): the
72 variables, zenith angle, orography and a land-sea mask appended, eight channels
of stateful diffusion noise concatenated (the ensemble's randomness, drawn outside
the network by makani's preprocessor from the wrapper's seed). Weights, statistics
and static fields are random (seeded); the weights are redrawn so that each layer
matters (:func:`.weights.scramble`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.tools.zoo.grid import Grid, on_grid
from earth2studio_compile.tools.zoo.weights import scramble

# makani's published FourCastNet3 (fcn3_sc2_edim45_layers10_finetune): the
# network's processor grid is the input's halved (360 x 720), ten blocks of which
# every fifth is global (spherical harmonics), the rest local (DISCO).
_FULL: dict[str, Any] = {
    "grid": Grid(721, 1440, south_pole=True),
    "scale_factor": 2,
    "atmo_embed_dim": 45,
    "surf_embed_dim": 56,
    "aux_embed_dim": 36,
    "num_layers": 10,
    "sfno_block_frequency": 5,
}
# The same architecture on a 37 x 72 grid, narrow, one global and one local block.
_SMALL: dict[str, Any] = {
    "grid": Grid(37, 72, south_pole=True),
    "scale_factor": 2,
    "atmo_embed_dim": 4,
    "surf_embed_dim": 4,
    "aux_embed_dim": 4,
    "num_layers": 2,
    "sfno_block_frequency": 2,
}
# The published input noise: eight diffusion processes on the sphere with
# correlation scales from grid-size to planetary, centered (ensemble members in
# reflected pairs), concatenated to the network's input.
_NOISE: dict[str, Any] = {
    "type": "diffusion",
    "mode": "concatenate",
    "centered": True,
    "n_channels": 8,
    "sigma": 1.0,
    "kT": [3.0806e-5, 1.2322e-4, 4.9289e-4, 1.9716e-3]
    + [7.8862e-3, 3.1545e-2, 1.2618e-1, 5.0472e-1],
}
# What every FourCastNet3 in the configuration file shares (its base_config).
_NETWORK: dict[str, Any] = {
    "nettype": "FCN3",
    "model_grid_type": "equiangular",
    "sht_grid_type": "legendre-gauss",
    "encoder_mlp": False,
    "filter_basis_type": "morlet",
    "kernel_shape": [3, 3],
    "num_groups": 1,
    "normalization_layer": "none",
    "hard_thresholding_fraction": 1.0,
    "use_mlp": True,
    "mlp_mode": "serial",
    "mlp_ratio": 2,
    "activation_function": "gelu",
    "pos_embed": False,
    "big_skip": False,
    "bias": False,
    "clamp_water": True,
    "n_history": 0,
    "n_future": 0,
    "dt": 1,
    "dhours": 6,
    "target": "default",
    "normalize_residual": False,
    "history_normalization_mode": "none",
    "batch_size": 1,
    "add_zenith": True,
    "add_grid": False,
    "add_orography": True,
    "add_landmask": True,
    "landmask_preprocessing": "floor",
}


def _config(dims: dict[str, Any], channels: list[str]) -> dict[str, Any]:
    """The package's ``config.json``: what makani's training driver would have
    written for ``dims`` (channel counts and the appended channels' names)."""
    from makani.utils.features import get_auxiliary_channels

    grid: Grid = dims["grid"]
    config = _NETWORK | {k: v for k, v in dims.items() if k != "grid"}
    config |= {"input_noise": _NOISE, "normalization": "zscore"}
    # Any value names the file: the package loader points them into the folder.
    config |= {"global_means_path": "-", "global_stds_path": "-"}
    aux = get_auxiliary_channels(**config, n_noise_chan=_NOISE["n_channels"])
    indices = list(range(len(channels)))
    config |= {
        "channel_names": channels,
        "data_channel_names": channels,
        "in_channels": indices,
        "out_channels": indices,
        "aux_channel_names": aux,
        "N_in_channels": len(channels) + len(aux),
        "N_out_channels": len(channels),
    }
    for axis, n in (("x", grid.nlat), ("y", grid.nlon)):
        config |= {f"img_shape_{axis}": n, f"img_crop_shape_{axis}": n}
        config |= {f"img_crop_offset_{axis}": 0}
    return config


def _write_package(
    folder: Path, config: dict[str, Any], grid: Grid, gen: torch.Generator
) -> None:
    """A makani model package without a checkpoint: the configuration, random
    normalisation statistics, orography and a land-sea mask of 0s and 1s (so
    that its one-hot encoding has the two channels the configuration counts)."""
    import h5py
    from makani.models.model_package import LocalPackage

    (folder / "config.json").write_text(json.dumps(config))
    n = len(config["channel_names"])
    stats = {
        LocalPackage.MEANS_FILE: 0.1 * torch.randn(1, n, 1, 1, generator=gen),
        LocalPackage.STDS_FILE: 1 + torch.rand(1, n, 1, 1, generator=gen),
    }
    for name, values in stats.items():
        np.save(folder / name, values.numpy())
    shape = (1, grid.nlat, grid.nlon)
    fields = {
        (LocalPackage.OROGRAPHY_FILE, "Z"): torch.rand(shape, generator=gen),
        (LocalPackage.LANDMASK_FILE, "LSM"): torch.rand(shape, generator=gen).round(),
    }
    for (name, key), values in fields.items():
        with h5py.File(folder / name, "w") as f:
            f[key] = values.numpy()


def fcn3(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio FCN3 around a random makani FourCastNet3 network.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the published configuration, the wrapper's 721x1440 grid, a
        360x720 processor grid, embeddings of 45 (per pressure level), 56
        (surface) and 36 (auxiliary) channels, 10 blocks (2 global); ``"small"``:
        37x72 (18x36 inside), embeddings of 4, 2 blocks (1 global). Both take
        the 72 variables, zenith angle, orography, a land-sea mask and 8 noise
        channels. By default "small"
    seed : int, optional
        Weight seed (the statistics' and static fields' too, and through the
        wrapper the noise's), by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.FCN3`` (subclassed for the small grid), on
        CPU; its network, the table's region, is ``model.model.model``
    """
    from earth2studio.models.px import FCN3
    from earth2studio.models.px.fcn3 import VARIABLES
    from makani.models.model_package import LocalPackage, load_model_package

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    dims = _FULL if full else _SMALL
    grid: Grid = dims["grid"]
    config = _config(dims, list(VARIABLES))
    with tempfile.TemporaryDirectory(prefix="zoo-fcn3-") as folder:
        _write_package(Path(folder), config, grid, gen)
        # makani reads every file while it builds: nothing refers to the folder
        # afterwards.
        core = load_model_package(LocalPackage(folder), pretrained=False)
    cls = FCN3 if full else on_grid(FCN3, grid)
    # Initialised for training, makani's biases start at zero and its blocks'
    # layer scales at 0.1, so each block adds a tenth of its output: redrawn,
    # a block that computed the wrong thing compiled would show in the forecast.
    scramble(core.model.model, gen)
    return cls(core.eval(), variables=np.array(VARIABLES), seed=seed).eval()
