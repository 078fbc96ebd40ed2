"""Build a tiny, randomly initialised FCN3 (makani AtmoSphericNeuralOperatorNet) through
makani's own model-package loader (pretrained=False, no checkpoint) and Earth2Studio's
FCN3 wrapper, then run one forward step on the CPU.

usage: python build_tiny_fcn3.py [noise]   ("noise": add FCN3's diffusion input noise,
which builds a full 721x1440 inverse SHT in the preprocessor)
"""

import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

WITH_NOISE = "noise" in sys.argv[1:]
NLAT, NLON = (int(v) for v in os.environ.get("GRID", "721x1440").split("x"))
FULL = (NLAT, NLON) == (721, 1440)
t_start = time.perf_counter()
from earth2studio.models.px import FCN3  # noqa: E402
from earth2studio.models.px import fcn3 as fcn3_module  # noqa: E402
from makani.models.model_package import LocalPackage, load_model_package  # noqa: E402

import makani  # noqa: E402
import torch_harmonics  # noqa: E402

print("makani", makani.__version__, "torch-harmonics", torch_harmonics.__version__,
      "torch", torch.__version__, "disco cuda ext:", fcn3_module._cuda_extension_available)
print(f"imports {time.perf_counter() - t_start:.1f} s")

channels = list(fcn3_module.VARIABLES)  # the 72 FCN3 channels
C = len(channels)
n_noise = 1 if WITH_NOISE else 0
aux = ["xzen"] + [f"xnoise{i}" for i in range(n_noise)]
params = {
    "nettype": "FCN3",
    "model_grid_type": "equiangular", "sht_grid_type": "legendre-gauss",
    "data_grid_type": "equiangular",
    "scale_factor": 8 if FULL else 2,  # internal grid 90 x 180 (published: 721x1440 -> 360x720)
    "atmo_embed_dim": 4, "surf_embed_dim": 4, "aux_embed_dim": 4,
    "encoder_mlp": False, "num_layers": 2, "sfno_block_frequency": 2,
    "filter_basis_type": "morlet", "kernel_shape": [3, 3], "num_groups": 1,
    "normalization_layer": "none", "hard_thresholding_fraction": 1.0,
    "use_mlp": True, "mlp_ratio": 2, "activation_function": "gelu",
    "pos_embed": False, "big_skip": False, "bias": False, "clamp_water": True,
    "n_history": 0, "n_future": 0, "dt": 1, "dhours": 6, "target": "default",
    "normalize_residual": False, "history_normalization_mode": "none",
    "normalization": "zscore",
    "global_means_path": "global_means.npy", "global_stds_path": "global_stds.npy",
    "channel_names": channels, "data_channel_names": channels,
    "in_channels": list(range(C)), "out_channels": list(range(C)),
    "N_in_channels": C + len(aux), "N_out_channels": C, "aux_channel_names": aux,
    "img_shape_x": NLAT, "img_shape_y": NLON,
    "img_crop_shape_x": NLAT, "img_crop_shape_y": NLON,
    "img_crop_offset_x": 0, "img_crop_offset_y": 0,
    "add_zenith": True, "add_orography": False, "add_landmask": False,
    "add_grid": False, "batch_size": 1,
}
if WITH_NOISE:
    params["input_noise"] = {"type": "diffusion", "mode": "concatenate", "n_channels": 1,
                             "sigma": 1.0, "centered": False}

pkg_dir = tempfile.mkdtemp(prefix="tiny_fcn3_")
with open(os.path.join(pkg_dir, "config.json"), "w") as f:
    json.dump(params, f)
np.save(os.path.join(pkg_dir, "global_means.npy"), np.zeros((1, C, 1, 1), np.float32))
np.save(os.path.join(pkg_dir, "global_stds.npy"), np.ones((1, C, 1, 1), np.float32))

t0 = time.perf_counter()
torch.manual_seed(0)
core = load_model_package(LocalPackage(pkg_dir), pretrained=False, device="cpu")
print(f"makani model built in {time.perf_counter() - t0:.1f} s;",
      sum(p.numel() for p in core.parameters()), "parameters;",
      "model.model.model ->", type(core.model.model).__name__)

cls = FCN3
if not FULL:
    # a small-grid variant: only the wrapper's fixed lat/lon coordinates change
    def _grid(c):
        c["lat"], c["lon"] = np.linspace(90, -90, NLAT), np.linspace(0, 360, NLON, endpoint=False)
        return c
    cls = type(f"FCN3{NLAT}x{NLON}", (FCN3,), {
        "input_coords": lambda self: _grid(FCN3.input_coords(self)),
        "output_coords": lambda self, ic: _grid(FCN3.output_coords(self, ic)),
    })
px = cls(core, variables=np.array(channels)).eval()
pre = core.model.preprocessor
print("input noise:", type(getattr(pre, "input_noise", None)).__name__,
      "state", None if pre.get_internal_state(tensor=True) is None else tuple(pre.get_internal_state(tensor=True).shape))
print("FCN3 built; compile region model.model.model ->", type(px.model.model.model).__name__)

ic = px.input_coords()
coords = ic.copy()
coords["batch"] = np.array([0])
coords["time"] = np.array([np.datetime64("2024-01-01T00:00")])
shape = tuple(1 if k == "batch" else len(v) for k, v in coords.items())
x = torch.randn(*shape)
print("input", shape)
t0 = time.perf_counter()
y, yc = px(x, coords)
print(f"one step: {time.perf_counter() - t0:.1f} s; output {tuple(y.shape)}; finite:",
      bool(torch.isfinite(y).all()), "lead_time", yc["lead_time"])
t0 = time.perf_counter()
y, yc = px(x, coords)
print(f"second step: {time.perf_counter() - t0:.1f} s; total {time.perf_counter() - t_start:.1f} s")

if os.environ.get("COMPILE"):
    # earth2studio-compile on the tiny model (its model table: model.model.model)
    from earth2studio_compile import CompileSession

    px.set_rng(seed=1)
    ref, _ = px(x.clone(), coords)
    t0 = time.perf_counter()
    with CompileSession(px) as session:
        px.set_rng(seed=1)
        y1, _ = px(x.clone(), coords)
        t1 = time.perf_counter()
        px.set_rng(seed=1)
        y2, _ = px(x.clone(), coords)
        t2 = time.perf_counter()
    print(f"compiled: first call {t1 - t0:.1f} s, second {t2 - t1:.2f} s")
    print("rel L2 compiled vs eager:", ((y2 - ref).norm() / ref.norm()).item())
    print(session.report.summary())
