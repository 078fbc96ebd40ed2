"""Build a tiny, randomly initialised AIFS-family model through Earth2Studio's own
wrapper class (no checkpoint, no download) and run one forward step on the CPU.

usage: python build_tiny_aifs.py {aifs,aifsens,aifs2,aifs2ens}

The anemoi model (AnemoiModelInterface -> AnemoiModelEncProcDec / AnemoiEnsModelEncProcDec)
is built from a tiny config on a tiny synthetic graph (N_DATA data nodes, N_HIDDEN hidden
nodes), with the transformer processor on torch's scaled_dot_product_attention (no
flash-attn). Earth2Studio's wrapper keeps its fixed 721x1440 lat/lon interface: the
interpolation matrices map the 0.25 degree grid onto the N_DATA nodes and back.
"""

import math
import re
import sys
import time

import numpy as np
import torch

VARIANT = sys.argv[1] if len(sys.argv) > 1 else "aifs"
N_DATA, N_HIDDEN, CH = 512, 64, 32
import os
NLAT, NLON = (int(v) for v in os.environ.get("GRID", "721x1440").split("x"))
torch.manual_seed(0)
t_start = time.perf_counter()

from omegaconf import OmegaConf  # noqa: E402
from torch_geometric.data import HeteroData  # noqa: E402

import anemoi.models  # noqa: E402,F401
from anemoi.models.data_indices.collection import IndexCollection  # noqa: E402
from anemoi.models.interface import AnemoiModelInterface  # noqa: E402
from anemoi.utils.config import DotDict  # noqa: E402

from earth2studio.models.px import AIFS, AIFS2, AIFS2ENS, AIFSENS  # noqa: E402
from earth2studio.models.px import aifsens as aifsens_module  # noqa: E402

print("anemoi-models", __import__("importlib.metadata").metadata.version("anemoi-models"))
print("torch-geometric", __import__("torch_geometric").__version__, "torch", torch.__version__)

WRAPPER = {"aifs": AIFS, "aifsens": AIFSENS, "aifs2": AIFS2, "aifs2ens": AIFS2ENS}[VARIANT]
ENS = VARIANT.endswith("ens")
NEW_API = VARIANT.startswith("aifs2")  # anemoi-models 0.9.x / 0.11.x config layout

if VARIANT == "aifsens":
    E2S_VARIABLES = list(aifsens_module.VARIABLES)
else:
    E2S_VARIABLES = list(WRAPPER.VARIABLES)
INVARIANTS = list(WRAPPER.VARIABLE_INVARIANTS)
FORCINGS = list(WRAPPER.VARIABLE_FORCINGS)
DIAGNOSTICS_E2S = ["cp06", "tp06", "sf06", "ssrd06", "strd06", "ro06",
                   "tcc", "mcc", "hcc", "lcc", "u100m", "v100m"]
DIAGNOSTICS_E2S = [v for v in DIAGNOSTICS_E2S if v in E2S_VARIABLES]

# Earth2Studio name -> checkpoint (anemoi) name, the inverse of the wrappers'
# _ckpt_var_to_e2s.
_SURF = {"u10m": "10u", "v10m": "10v", "d2m": "2d", "t2m": "2t", "u100m": "100u", "v100m": "100v"}
_ACC = {"cp06": "cp", "ro06": "ro", "sf06": "sf", "tp06": "tp", "ssrd06": "ssrd", "strd06": "strd"}


def to_ckpt(v):
    if v in _SURF:
        return _SURF[v]
    if v in _ACC:
        return _ACC[v]
    m = re.fullmatch(r"([qtuvwz])(\d+)", v)
    if m:
        return f"{m.group(1)}_{m.group(2)}"
    return v


CKPT = [to_ckpt(v) for v in E2S_VARIABLES]
if hasattr(WRAPPER, "_ckpt_var_to_e2s"):
    assert WRAPPER._ckpt_var_to_e2s(CKPT) == E2S_VARIABLES
name_to_index = {n: i for i, n in enumerate(CKPT)}
forcing_ckpt = [to_ckpt(v) for v in INVARIANTS + FORCINGS]
diagnostic_ckpt = [to_ckpt(v) for v in DIAGNOSTICS_E2S]

# ----------------------------------------------------------------------------- graph
def sphere_points(n):
    # Fibonacci lattice, radians
    i = np.arange(n) + 0.5
    lat = np.arcsin(1 - 2 * i / n)
    lon = np.mod(np.pi * (1 + 5**0.5) * i, 2 * np.pi)
    return lat, lon


def xyz(lat, lon):
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1)


def knn_edges(src_lat, src_lon, dst_lat, dst_lon, k):
    s, d = xyz(src_lat, src_lon), xyz(dst_lat, dst_lon)
    dist = np.arccos(np.clip(d @ s.T, -1, 1))  # [n_dst, n_src]
    nbr = np.argsort(dist, axis=1)[:, :k]
    dst_idx = np.repeat(np.arange(len(dst_lat)), k)
    src_idx = nbr.reshape(-1)
    length = dist[dst_idx, src_idx][:, None]
    dirs = np.stack([dst_lat[dst_idx] - src_lat[src_idx],
                     np.angle(np.exp(1j * (dst_lon[dst_idx] - src_lon[src_idx])))], -1)
    return (torch.as_tensor(np.stack([src_idx, dst_idx]), dtype=torch.long),
            torch.as_tensor(length / length.max(), dtype=torch.float32),
            torch.as_tensor(dirs, dtype=torch.float32))


d_lat, d_lon = sphere_points(N_DATA)
h_lat, h_lon = sphere_points(N_HIDDEN)
graph = HeteroData()
graph["data"].x = torch.as_tensor(np.stack([d_lat, d_lon], -1), dtype=torch.float32)
graph["hidden"].x = torch.as_tensor(np.stack([h_lat, h_lon], -1), dtype=torch.float32)
for (s, d), (sl, so, dl, do), k in [
    (("data", "hidden"), (d_lat, d_lon, h_lat, h_lon), 12),
    (("hidden", "data"), (h_lat, h_lon, d_lat, d_lon), 3),
]:
    ei, el, ed = knn_edges(sl, so, dl, do, k)
    graph[(s, "to", d)].edge_index = ei
    graph[(s, "to", d)].edge_length = el
    graph[(s, "to", d)].edge_dirs = ed

# ----------------------------------------------------------------------------- config
kern = {
    "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
    "Linear": {"_target_": "torch.nn.Linear"},
    "Activation": {"_target_": "torch.nn.GELU"},
    "QueryNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
    "KeyNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
}
NOISE_CH = 4
processor = {
    "_target_": "anemoi.models.layers.processor.TransformerProcessor",
    "num_layers": 2, "num_chunks": 1, "mlp_hidden_ratio": 2, "num_heads": 4,
    "window_size": 16, "dropout_p": 0.0,
    "attention_implementation": "scaled_dot_product_attention",
    "qk_norm": ENS, "softcap": 0.0, "use_alibi_slopes": False, "cpu_offload": False,
}
mapper = {"trainable_size": 8, "sub_graph_edge_attributes": ["edge_length", "edge_dirs"],
          "num_chunks": 1, "mlp_hidden_ratio": 2, "num_heads": 4, "qk_norm": False,
          "cpu_offload": False}
encoder = {"_target_": "anemoi.models.layers.mapper.GraphTransformerForwardMapper", **mapper}
decoder = {"_target_": "anemoi.models.layers.mapper.GraphTransformerBackwardMapper",
           "initialise_data_extractor_zero": False, **mapper}
model_target = ("anemoi.models.models.ens_encoder_processor_decoder.AnemoiEnsModelEncProcDec" if ENS
                else "anemoi.models.models.encoder_processor_decoder.AnemoiModelEncProcDec")
model_cfg = {
    "num_channels": CH, "cpu_offload": False, "activation": "GELU",
    "model": {"_target_": model_target},
    "trainable_parameters": {"data": 8, "hidden": 8, "data2hidden": 8, "hidden2data": 8},
    "attributes": {"edges": ["edge_length", "edge_dirs"], "nodes": []},
    "bounding": [{"_target_": "anemoi.models.layers.bounding.ReluBounding", "variables": [to_ckpt("tp06")]}],
}
if NEW_API:
    # anemoi-models >= 0.9: each component takes its layer_kernels (plain _target_ dicts)
    for comp in (processor, encoder, decoder):
        comp["layer_kernels"] = kern
    if VARIANT == "aifs2ens":  # 0.11: graph transformer defaults to a triton backend
        encoder["graph_attention_backend"] = decoder["graph_attention_backend"] = "pyg"
    model_cfg["layer_kernels"] = kern
else:
    # anemoi-models 0.5.1: per-part kernels, hydra partials
    partial = {k: {**v, "_partial_": True} for k, v in kern.items() if k != "Activation"}
    model_cfg["layer_kernels"] = {"processor": partial, "encoder": partial, "decoder": partial}
    for comp in (processor, encoder, decoder):
        comp["activation"] = "GELU"
if ENS:
    model_cfg["noise_injector"] = {
        "_target_": "anemoi.models.layers.ensemble.NoiseConditioning",
        "noise_std": 1, "noise_channels_dim": NOISE_CH, "noise_mlp_hidden_dim": 16,
    }
    cond_ln = {"_target_": "anemoi.models.layers.normalization.ConditionalLayerNorm",
               "normalized_shape": CH, "condition_shape": NOISE_CH, "autocast": False}
    if NEW_API:
        model_cfg["noise_injector"]["layer_kernels"] = {"Activation": {"_target_": "torch.nn.GELU"}}
        processor["layer_kernels"] = {**kern, "LayerNorm": cond_ln}
    else:
        model_cfg["layer_kernels"]["processor"] = {
            **model_cfg["layer_kernels"]["processor"], "LayerNorm": {**cond_ln, "_partial_": True}}
        model_cfg["layer_kernels"]["processor"]["LayerNorm"].pop("normalized_shape")
model_cfg.update(processor=processor, encoder=encoder, decoder=decoder)
if VARIANT == "aifs2ens":  # anemoi-models 0.11: explicit residual, no truncation_data
    model_cfg["residual"] = {"_target_": "anemoi.models.layers.residual.SkipConnection", "step": -1}
    model_cfg["condition_on_residual"] = False

config = {
    "training": {"multistep_input": 2},
    "graph": {"data": "data", "hidden": "hidden"},
    "data": {"forcing": forcing_ckpt, "diagnostic": diagnostic_ckpt, "processors": {}},
    "model": model_cfg,
}
data_indices = IndexCollection(OmegaConf.create(config), name_to_index)
iface_kwargs = dict(config=DotDict(config), graph_data=graph, statistics={},
                    data_indices=data_indices, metadata={})
if VARIANT != "aifs2ens":
    iface_kwargs["truncation_data"] = {}
t0 = time.perf_counter()
model = AnemoiModelInterface(**iface_kwargs).eval()
print(f"anemoi model built in {time.perf_counter() - t0:.2f} s;",
      sum(p.numel() for p in model.parameters()), "parameters;",
      "processor:", type(model.model.processor).__name__)

# ------------------------------------------------------------------- interpolation
# ERA5 0.25 degree grid -> N_DATA nodes (nearest grid point) and back (nearest node).
lat_deg, lon_deg = np.degrees(d_lat), np.degrees(d_lon)
dlat, dlon = 180.0 / (NLAT - 1), 360.0 / NLON
rows = np.rint((90.0 - lat_deg) / dlat).astype(np.int64)
cols = np.rint(lon_deg / dlon).astype(np.int64) % NLON
fwd = torch.sparse_csr_tensor(
    torch.arange(N_DATA + 1, dtype=torch.int64),
    torch.as_tensor(rows * NLON + cols), torch.ones(N_DATA, dtype=torch.float64),
    size=(N_DATA, NLAT * NLON), dtype=torch.float64)
glat = np.radians(np.repeat(np.linspace(90, -90, NLAT), NLON))
glon = np.radians(np.tile(np.arange(NLON) * dlon, NLAT))
g = xyz(glat, glon)
nodes = xyz(d_lat, d_lon)
nearest = np.concatenate([np.argmax(g[i:i + 65536] @ nodes.T, axis=1)
                          for i in range(0, len(g), 65536)])
inv = torch.sparse_csr_tensor(
    torch.arange(NLAT * NLON + 1, dtype=torch.int64), torch.as_tensor(nearest),
    torch.ones(NLAT * NLON, dtype=torch.float64), size=(NLAT * NLON, N_DATA), dtype=torch.float64)
lats = torch.as_tensor(lat_deg, dtype=torch.float32).reshape(1, 1, -1, 1)
lons = torch.as_tensor(lon_deg, dtype=torch.float32).reshape(1, 1, -1, 1)
invariants = torch.randn(len(INVARIANTS), NLAT, NLON)

MDT = torch.float32 if NEW_API else torch.float64  # AIFS2/AIFS2ENS use float32 CSR matrices
fwd, inv = fwd.to(MDT), inv.to(MDT)
wrapper_kwargs = dict(model=model, latitudes=lats, longitudes=lons, interpolation_matrix=fwd,
                      inverse_interpolation_matrix=inv, invariants=invariants)
if VARIANT == "aifs2ens":
    wrapper_kwargs["seed"] = 0
cls = WRAPPER
if (NLAT, NLON) != (721, 1440):
    # a small-grid variant: only the wrapper's fixed lat/lon coordinates change
    def _grid(c):
        c["lat"], c["lon"] = np.linspace(90, -90, NLAT), np.linspace(0, 360, NLON, endpoint=False)
        return c
    cls = type(f"{WRAPPER.__name__}{NLAT}x{NLON}", (WRAPPER,), {
        "input_coords": lambda self: _grid(WRAPPER.input_coords(self)),
        "output_coords": lambda self, ic: _grid(WRAPPER.output_coords(self, ic)),
    })
px = cls(**wrapper_kwargs).eval()
print(type(px).__name__, "built; compile region model.model.processor ->",
      type(px.model.model.processor).__name__)

# ----------------------------------------------------------------------- one step
ic = px.input_coords()
time_ = np.array([np.datetime64("2024-01-01T00:00")])
coords = ic.copy()
coords["batch"] = np.array([0])
coords["time"] = time_
shape = tuple(len(v) if k != "batch" else 1 for k, v in coords.items())
x = torch.randn(*shape)
print("input", shape, f"({x.numel() * 4 / 2**20:.0f} MiB)")
t0 = time.perf_counter()
with torch.inference_mode():
    y, yc = px(x, coords)
print(f"one step: {time.perf_counter() - t0:.2f} s; output {tuple(y.shape)};",
      "finite:", bool(torch.isfinite(y).all()), "lead_time", yc["lead_time"])

# the region earth2studio-compile would compile, called alone
proc = px.model.model.processor
xl = torch.randn(N_HIDDEN, CH)
kw = {"cond": torch.randn(N_HIDDEN, NOISE_CH)} if ENS else {}
with torch.inference_mode():
    out = proc(xl, batch_size=1, shard_shapes=[list(xl.shape)], model_comm_group=None, **kw)
print("processor alone:", tuple(out.shape), "total", f"{time.perf_counter() - t_start:.1f} s")

if os.environ.get("COMPILE"):
    # earth2studio-compile on the tiny model (its model table: model.model.processor)
    from earth2studio_compile import CompileSession

    with torch.inference_mode():
        ref, _ = px(x, coords)
    kw = {} if cls is WRAPPER else {"regions": ("model.model.processor",)}
    t0 = time.perf_counter()
    with CompileSession(px, **kw) as session:
        with torch.inference_mode():
            y1, _ = px(x, coords)
        t1 = time.perf_counter()
        with torch.inference_mode():
            y2, _ = px(x, coords)
        t2 = time.perf_counter()
    print(f"compiled: first call {t1 - t0:.1f} s, second {t2 - t1:.2f} s")
    rel = ((y2 - ref).norm() / ref.norm()).item()
    print("rel L2 compiled vs eager:", rel)
    print(session.report.summary())
