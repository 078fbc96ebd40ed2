"""The zoo's AIFS ENS v2: Earth2Studio's ``AIFS2ENS`` around a random anemoi network.

Needs ``anemoi-models`` 0.11.2 (Earth2Studio's pin for AIFS2ENS) with
``anemoi-utils`` and ``torch-geometric``, and what Earth2Studio's AIFS modules import
when they are imported: ``earthkit-regrid``, ``ecmwf-opendata`` and ``flash_attn``.
flash-attn is a source package that needs CUDA to build; the network here runs
anemoi's sliding-window attention on PyTorch's SDPA, so CI installs a stand-in that
only passes the import (``.ci/stand-in-wheel.py``), with the rest, into a folder of
their own (``.ci/run``). anemoi's default, and what users of the published AIFS run,
is flash-attn's attention: :func:`aifs2ens_flash` builds the network with it, for a
GPU with the real package (``.ci/build-flash-attn.sh`` builds one for the zoo's
GPU machine). The other members of the family take other anemoi-models
versions (AIFS and AIFSENS 0.5.1, AIFS2 0.9.x), whose networks are laid out
differently (a published AIFS2 checkpoint does not load into 0.11's classes): one
version per environment, and this one is the newest.

The network is anemoi's ``AnemoiModelInterface`` around an
``AnemoiEnsModelEncProcDec``, configured as anemoi-training's ``transformer_ens``
model is: graph-transformer encoder and decoder, a sliding-window transformer
processor conditioned on the ensemble noise, a skip connection. Its graph is
synthetic, without anemoi-graphs: Fibonacci-lattice data and hidden nodes, each data
node joined to its nearest hidden nodes. The wrapper's regridding matrices take the
nearest node or grid point. Weights are drawn from a seeded generator so that each
layer matters (:func:`.weights.scramble`); the invariants are random; nothing is
downloaded.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from earth2studio_compile.tools.zoo.grid import Grid, on_grid
from earth2studio_compile.tools.zoo.weights import scramble

# Sizes: the wrapper's lat-lon grid, the graph's data and hidden nodes, the
# network's width, processor depth (in checkpointed chunks), heads and attention
# window, and the chunks the mappers split their edges into. The full size has
# AIFS's published graph sizes (N320's 542,080 data points, O96's 40,320 hidden
# nodes) and transformer_ens's network.
_FULL: dict[str, Any] = {
    "grid": Grid(721, 1440, south_pole=True),
    "data": 542_080,
    "hidden": 40_320,
    "channels": 1024,
    "layers": 16,
    "chunks": 2,
    "heads": 16,
    "window": 512,
    "mlp_ratio": 4,
    "noise_hidden": 32,
    "mapper_chunks": 4,
}
# The same architecture, narrow and shallow, on a few hundred points; two chunks
# of one layer each, so the processor's checkpointed chunks are traced as in the
# published one.
_SMALL: dict[str, Any] = {
    "grid": Grid(17, 32, south_pole=True),
    "data": 256,
    "hidden": 64,
    "channels": 32,
    "layers": 2,
    "chunks": 2,
    "heads": 4,
    "window": 16,
    "mlp_ratio": 2,
    "noise_hidden": 16,
    "mapper_chunks": 1,
}
_NOISE_CHANNELS = 4
# Output-only variables (Earth2Studio names): accumulations, cloud cover, 100 m wind.
_DIAGNOSTIC = ["cp06", "tp06", "sf06", "ssrd06", "strd06", "ro06"]
_DIAGNOSTIC += ["tcc", "mcc", "hcc", "lcc", "u100m", "v100m"]
_SURFACE = {"u10m": "10u", "v10m": "10v", "d2m": "2d", "t2m": "2t"}
_SURFACE |= {"u100m": "100u", "v100m": "100v"}


def _checkpoint_name(name: str) -> str:
    """The anemoi name of an Earth2Studio variable (the inverse of the wrapper's
    ``_ckpt_var_to_e2s``): ``t2m`` is ``2t``, ``tp06`` is ``tp``, ``q50`` is
    ``q_50``."""
    if name in _SURFACE:
        return _SURFACE[name]
    if name.endswith("06"):
        return name[:-2]
    level = re.fullmatch(r"([qtuvwz])(\d+)", name)
    return f"{level[1]}_{level[2]}" if level else name


def _xyz(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Unit vectors of points given in radians."""
    return np.stack(
        [np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1
    )


def _lattice(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` nearly equally spaced points on the sphere (latitudes, longitudes in
    radians): a Fibonacci lattice, standing in for anemoi's reduced Gaussian and
    octahedral grids."""
    i = np.arange(n) + 0.5
    return np.arcsin(1 - 2 * i / n), np.mod(np.pi * (1 + 5**0.5) * i, 2 * np.pi)


def _graph(size: dict[str, Any]) -> Any:
    """The encoder's and decoder's edges: every data node to its 4 nearest hidden
    nodes (the encoder) and from its 3 nearest (the decoder, as AIFS's KNN
    decoder graph), with the edge attributes anemoi's mappers read."""
    from scipy.spatial import cKDTree
    from torch_geometric.data import HeteroData

    nodes = {"data": _lattice(size["data"]), "hidden": _lattice(size["hidden"])}
    graph = HeteroData()
    for name, (lat, lon) in nodes.items():
        graph[name].x = torch.tensor(np.stack([lat, lon], -1), dtype=torch.float32)
    tree = cKDTree(_xyz(*nodes["hidden"]))
    for src, dst, k in (("data", "hidden", 4), ("hidden", "data", 3)):
        _, near = tree.query(_xyz(*nodes["data"]), k=k)
        data = np.repeat(np.arange(size["data"]), k)
        pair = {"data": data, "hidden": near.reshape(-1)}
        (slat, slon), (dlat, dlon) = nodes[src], nodes[dst]
        s, d = pair[src], pair[dst]
        chord = np.linalg.norm(_xyz(slat[s], slon[s]) - _xyz(dlat[d], dlon[d]), axis=1)
        turn = np.angle(np.exp(1j * (dlon[d] - slon[s])))
        edges = graph[(src, "to", dst)]
        edges.edge_index = torch.tensor(np.stack([s, d]), dtype=torch.long)
        edges.edge_length = torch.tensor(chord / chord.max(), dtype=torch.float32)[
            :, None
        ]
        edges.edge_dirs = torch.tensor(
            np.stack([dlat[d] - slat[s], turn], -1), dtype=torch.float32
        )
    return graph


def _config(
    size: dict[str, Any], variables: list[str], forcing: list[str], attention: str
) -> dict:
    """anemoi-training's ``transformer_ens`` model configuration at ``size``, with
    the processor's ``attention`` and the PyG graph attention (the Triton one needs
    CUDA)."""
    layers = "anemoi.models.layers."
    qk_norm = {"_target_": layers + "normalization.AutocastLayerNorm", "bias": False}
    kernels = {
        "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
        "Linear": {"_target_": "torch.nn.Linear"},
        "Activation": {"_target_": "torch.nn.GELU"},
        "QueryNorm": qk_norm,
        "KeyNorm": qk_norm,
    }
    heads = {"num_heads": size["heads"], "mlp_hidden_ratio": size["mlp_ratio"]}
    mapper = {
        **heads,
        "trainable_size": 8,
        "sub_graph_edge_attributes": ["edge_length", "edge_dirs"],
        "num_chunks": size["mapper_chunks"],
        "qk_norm": False,
        "cpu_offload": False,
        "layer_kernels": kernels,
        "graph_attention_backend": "pyg",
    }
    processor = {
        **heads,
        "_target_": layers + "processor.TransformerProcessor",
        "num_layers": size["layers"],
        "num_chunks": size["chunks"],
        "window_size": size["window"],
        "dropout_p": 0.0,
        "attention_implementation": attention,
        "qk_norm": True,
        "softcap": 0.0,
        "use_alibi_slopes": False,
        "cpu_offload": False,
        "layer_kernels": {
            **kernels,
            "LayerNorm": {
                "_target_": layers + "normalization.ConditionalLayerNorm",
                "normalized_shape": size["channels"],
                "condition_shape": _NOISE_CHANNELS,
                "zero_init": True,
                "autocast": False,
            },
        },
    }
    model = {
        "num_channels": size["channels"],
        "cpu_offload": False,
        "model": {
            "_target_": "anemoi.models.models.ens_encoder_processor_decoder."
            "AnemoiEnsModelEncProcDec"
        },
        "noise_injector": {
            "_target_": layers + "ensemble.NoiseConditioning",
            "noise_std": 1,
            "noise_channels_dim": _NOISE_CHANNELS,
            "noise_mlp_hidden_dim": size["noise_hidden"],
            "layer_kernels": {"Activation": {"_target_": "torch.nn.GELU"}},
        },
        "layer_kernels": kernels,
        "processor": processor,
        "encoder": {
            **mapper,
            "_target_": layers + "mapper.GraphTransformerForwardMapper",
        },
        "decoder": {
            **mapper,
            "_target_": layers + "mapper.GraphTransformerBackwardMapper",
            "initialise_data_extractor_zero": False,
        },
        "residual": {"_target_": layers + "residual.SkipConnection", "step": -1},
        "condition_on_residual": False,
        "trainable_parameters": {"data": 8, "hidden": 8}
        | {"data2hidden": 8, "hidden2data": 8},
        "attributes": {"edges": ["edge_length", "edge_dirs"], "nodes": []},
        "bounding": [
            {"_target_": layers + "bounding.ReluBounding", "variables": ["tp"]}
        ],
    }
    diagnostic = [_checkpoint_name(v) for v in _DIAGNOSTIC if v in variables]
    return {
        "training": {"multistep_input": 2},
        "graph": {"data": "data", "hidden": "hidden"},
        # No normalisers: the network sees the wrapper's fields as they are.
        "data": {"forcing": forcing, "diagnostic": diagnostic, "processors": {}},
        "model": model,
    }


def _nearest(points: np.ndarray, targets: np.ndarray) -> torch.Tensor:
    """A float32 CSR matrix taking each target's value from its nearest point: the
    wrapper's regridding, between the lat-lon grid and the data nodes."""
    from scipy.spatial import cKDTree

    _, near = cKDTree(points).query(targets)
    rows = len(targets)
    return torch.sparse_csr_tensor(
        torch.arange(rows + 1),
        torch.tensor(near),
        torch.ones(rows),
        size=(rows, len(points)),
    )


def aifs2ens(
    size: str = "small",
    seed: int = 0,
    attention: str = "scaled_dot_product_attention",
) -> torch.nn.Module:
    """Earth2Studio AIFS2ENS around a random anemoi ensemble network.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the wrapper's 721x1440 grid, AIFS's graph sizes (542,080 data
        nodes, 40,320 hidden), width 1024, a processor of 16 layers (2 chunks) of 16
        heads with a 512-node window; ``"small"``: 17x32, 256 data and 64 hidden
        nodes, width 32, 2 layers (2 chunks) of 4 heads with a 16-node window. By
        default "small"
    seed : int, optional
        Weight seed (the invariants' and, through the wrapper, the ensemble
        noise's seed too), by default 0
    attention : str, optional
        The processor's ``attention_implementation``: PyTorch's SDPA, its window a
        dense mask (by default), or ``"flash_attention"`` (:func:`aifs2ens_flash`)

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.AIFS2ENS`` (subclassed for the small grid);
        its processor, the table's region, is ``model.model.processor``
    """
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.interface import AnemoiModelInterface
    from anemoi.utils.config import DotDict
    from earth2studio.models.px import AIFS2ENS
    from omegaconf import OmegaConf

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    dims = _FULL if full else _SMALL
    grid: Grid = dims["grid"]
    variables = list(AIFS2ENS.VARIABLES)
    names = [_checkpoint_name(v) for v in variables]
    # The wrapper checks the network's variables, in order, against its own.
    assert AIFS2ENS._ckpt_var_to_e2s(names) == variables
    fixed = AIFS2ENS.VARIABLE_INVARIANTS + AIFS2ENS.VARIABLE_FORCINGS
    config = _config(dims, variables, [_checkpoint_name(v) for v in fixed], attention)
    indices = IndexCollection(
        OmegaConf.create(config), {name: i for i, name in enumerate(names)}
    )
    network = AnemoiModelInterface(
        config=DotDict(config),
        graph_data=_graph(dims),
        statistics={},
        data_indices=indices,
        metadata={},
    )
    lat, lon = _lattice(dims["data"])
    glat, glon = np.meshgrid(np.radians(grid.lat), np.radians(grid.lon), indexing="ij")
    nodes, points = _xyz(lat, lon), _xyz(glat.reshape(-1), glon.reshape(-1))
    # The node coordinates in degrees, shaped as the published package's.
    degrees = [torch.tensor(np.degrees(a), dtype=torch.float32) for a in (lat, lon)]
    cls = AIFS2ENS if full else on_grid(AIFS2ENS, grid)
    return cls(
        # Initialised as for training, the processor's noise conditioning is zero
        # (zero_init): the ensemble noise would change nothing, and a compiled
        # processor that lost it would pass. With only the conditioning drawn (as
        # torch.nn.Linear is) the noise moved the small forecast by 2%, three times
        # the compiled-vs-eager difference in bfloat16; scrambled, every layer
        # counts as much as the skip connection.
        scramble(network, gen),
        latitudes=degrees[0][None, None, :, None],
        longitudes=degrees[1][None, None, :, None],
        interpolation_matrix=_nearest(points, nodes),
        inverse_interpolation_matrix=_nearest(nodes, points),
        invariants=torch.randn(
            len(AIFS2ENS.VARIABLE_INVARIANTS), grid.nlat, grid.nlon, generator=gen
        ),
        seed=seed,
    ).eval()


def aifs2ens_flash(size: str = "full", seed: int = 0) -> torch.nn.Module:
    """:func:`aifs2ens` with anemoi's default attention, flash-attn's, whose kernel
    skips the pairs outside the processor's window: what users of the published
    AIFS run. Full size by default, so that the benchmark's ``det:MODULE:CALLABLE``
    jobs build it (``det:earth2studio_compile.tools.zoo.aifs:aifs2ens_flash``).

    Parameters
    ----------
    size : str, optional
        As :func:`aifs2ens`'s, by default "full"
    seed : int, optional
        As :func:`aifs2ens`'s, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.AIFS2ENS``

    Raises
    ------
    ImportError
        flash-attn is missing, or is the stand-in CI installs: anemoi would build
        the network and fail at its first call
    """
    import flash_attn

    try:
        import flash_attn_2_cuda  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"aifs2ens_flash needs flash-attn's CUDA extension; flash_attn "
            f"{flash_attn.__version__} has none ({err}). Install flash-attn, or on "
            f"the zoo's GPU machine the wheel .ci/build-flash-attn.sh builds."
        ) from err
    return aifs2ens(size=size, seed=seed, attention="flash_attention")
