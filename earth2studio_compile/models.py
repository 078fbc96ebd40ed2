"""Which part of a model to compile: the declarative model table and the generic path.

Each Earth2Studio prognostic class maps to a :class:`~.spec.ModelSpec`: the dotted
paths of its tensor-only core network(s), which ``torch.compile`` handles, or the
reason it runs eagerly. Everything else in a model (coordinate systems, numpy datetimes,
zenith angles, sparse regridding, ONNX or JAX sessions) stays out of the trace.

Models not in the table take the generic path
(:func:`earth2studio_compile.planning.generic_spec`);
:mod:`earth2studio_compile.planning` resolves a spec for one model instance. Users
can add their own classes with :func:`register_model`.
"""

from __future__ import annotations

from typing import Any

from earth2studio_compile.anemoi_patches import AIFS_WINDOW_MASK
from earth2studio_compile.patches import AURORA_SWIN_SHIFT, DLWP_ZENITH
from earth2studio_compile.spec import ModelSpec
from earth2studio_compile.table_choices import (
    aurora_attention_backends,
    sfno_inductor_options,
)

__all__ = [
    "MODEL_TABLE",
    "ModelSpec",
    "TORCH_HARMONICS_SFNO",
    "aurora_attention_backends",
    "lookup",
    "register_model",
    "sfno_inductor_options",
]


_PX = "earth2studio.models.px."

# Shared reasons and exclusions, so the table reads as a list of decisions.
_ONNX = (
    "ONNX Runtime session, not a torch.nn.Module: there is nothing for "
    "torch.compile to trace"
)
_JAX = "JAX model (already XLA-compiled by jax.jit): torch.compile cannot trace JAX"
# Spherical-harmonic transforms: complex64 FFT work that Inductor cannot compile on
# CUDA with torch-harmonics < 0.9.3 (KeyError: 'complex64'); they stay eager.
_SHT = ("RealSHT", "InverseRealSHT", "DistributedRealSHT", "DistributedInverseRealSHT")
# The wrappers run the network under 16-bit autocast and hand the processor
# 16-bit tensors: "fp32" and "tf32" turn autocast off inside a region, where the
# processor's fp32 weights then refuse them (2026-11-30, CPU: the first call
# raised, compiled and eagerly, and build() could not judge the region).
_AUTOCAST_OWN = (
    "it turns off the wrapper's 16-bit autocast inside the region, whose inputs "
    "arrive in 16 bits"
)
_AIFS = ModelSpec(
    regions=("model.model.processor",),
    # The graph encoder and decoder, with their trainable node and edge tensors,
    # stay eager by choice: a subclass (the zoo's small grid) is still this model.
    covers=("model",),
    precisions_refused={"fp32": _AUTOCAST_OWN, "tf32": _AUTOCAST_OWN},
    patches=(AIFS_WINDOW_MASK,),
    note="anemoi transformer processor; graph encoder/decoder stay eager "
    "(anemoi aliases forward and calls predict_step, bypassing outer __call__)",
)
# Run on the CPU (zoo "aurora", small): the whole backbone compiled with two graph
# breaks, at the lead-time embedding's data-dependent range check
# (aurora/model/fourier.py: `if self.assert_range and not <tensor>`); its Swin stages,
# each compiled alone, are one graph each. The time embedding and the U-Net's skip
# additions between the stages stay eager.
#
# The Perceiver encoder and decoder take a Batch, but their level aggregation and
# de-aggregation (PerceiverResampler: attention and an MLP over every patch's
# levels) take tensors: regions too. On an H200 in bf16 (2026-11-29,
# docs/bench/2026-11-29-h200-twentyninth) they ran outside the regions, in fp32
# with TF32 off: the step's top kernels were an fp32 GEMM and fp32 attention
# (nothing else attends outside the backbone). Aurora's own
# autocast_encoder/autocast_decoder flags run them in bf16 as well.
_AURORA = ModelSpec(
    regions=(
        "model.encoder.level_agg",
        "model.backbone.encoder_layers.*",
        "model.backbone.decoder_layers.*",
        "model.decoder.level_decoder",
    ),
    covers=("model",),
    # Earth2Studio passes the rollout step (its preds_idx, which the 0.25 degree
    # model never resets between calls) down to every stage; only LoRA reads it,
    # and Earth2Studio builds Aurora without LoRA.
    unused_arguments={"rollout_step": ("LoRARollout",)},
    # Measured on an H200 (torch 2.11, fp32 with TF32 off, the published size,
    # 2026-11-29, docs/bench/2026-11-29-h200-thirtieth): a 2-step deterministic
    # call with compile=True differed from eager by a relative L2 of 2.4e-2.
    # The cause (docs/bench/2026-11-29-h200-thirtysecond, -30-h200-thirtythird):
    # the Swin block's first cyclic shift (torch.roll) fused into the window
    # partition, wrong in the two 90x180 stages (dim 1024) of the published size
    # only, with plain torch.compile too: Inductor's kernel is right, Triton 3.6
    # compiles its 32-bit index arithmetic wrong. The same shift as two slices
    # concatenated compiles right. The patch below does that: with it the
    # published model's 2-step call matched eager within 1.6e-6 (H200,
    # 2026-11-30, docs/bench/2026-11-30-h200-thirtythird), and CUDA is no longer
    # refused.
    patches=(AURORA_SWIN_SHIFT,),
    attention_backends=aurora_attention_backends,
    note="microsoft-aurora Swin3D backbone, one region per Swin stage, and the "
    "Perceiver's level aggregation and de-aggregation; the lead-time embedding "
    "(a data-dependent range check) and the rest of the Perceiver encoder/decoder "
    "(they take a Batch dataclass) stay eager",
)
# physicsnemo's HEALPix padding forwards (HEALPixPadding, and HEALPixPaddingv2
# around earth2grid's CUDA pad, a torch.library.custom_op with a fake kernel) call
# torch.cuda.nvtx.range_push/range_pop where CUDA is available: Dynamo cannot put
# them in a graph, so every pad broke it, and the resumed frames, shared by every
# layer, recompiled per size until Dynamo's limit. Measured on an H100 (torch
# 2.11, fp32 with TF32 off, full size, 2026-11-27,
# docs/bench/2026-11-27-h100-fifteenth/dlesym_probe.py): the entry before, with
# exclude=("HEALPixPaddingv2",), split the atmosphere into about 44 small regions,
# each slower compiled than eager, and the ocean's fell back at a recompile storm:
# a compiled step of 620 ms against eager's 218. With the NVTX calls as no-ops
# (quiet_nvtx) and nothing excluded, the four regions compiled whole, one graph
# each without a break (the atmosphere decoder's one recompile aside, see below),
# within 5e-7 relative L2 of eager: a steady step of 209 ms against eager's 211
# (the first, a cold compile, 168 s); a probe, not yet the GPU-marked test.
# Keeping the pads opaque instead failed at the atmosphere encoder's first call
# (the opaque operator's meta output strides are not the real ones). The
# atmosphere decoder's ConvGRU blocks keep their state on the module (self.h =
# h_next): its region notices at its first call and runs without CUDA graphs
# (module_state.py).
_DLESYM = ModelSpec(
    regions=(
        "atmos_model.encoder",
        "atmos_model.decoder",
        "ocean_model.encoder",
        "ocean_model.decoder",
    ),
    quiet_nvtx=True,
    note="physicsnemo HEALPixRecUNet encoders/decoders; dim 0 is batch x 12 faces, "
    "so no batch padding; the ConvGRU blocks keep their state on the module, "
    "so the atmosphere decoder's region runs without CUDA graphs",
)
_AURORA_ENSEMBLE = ModelSpec(
    reason="stochastic ensemble whose noise may be drawn inside the backbone: "
    "compiled random streams would not reproduce seeded eager members",
    covers=("model",),
)
# Spectral convolutions compute in complex arithmetic, which bf16 FFTs do not
# support; under "bf16" they run in fp32 (class names from makani's and fme's
# sources: not run here, since neither package installs on these machines).
_SPECTRAL = ("SpectralConvS2", "DistributedSpectralConvS2")
# torch-harmonics 0.9.2's ResampleS2 (FCN3's decoders; the release with CUDA DISCO
# kernels for torch 2.11) branches on a bool tensor, a data-dependent jump for
# Dynamo: three graph breaks per decoder on an H200. Called as one opaque operator,
# each decoder stays one graph; 0.9.3 keeps a Python bool.
_MAKANI = ModelSpec(
    regions=("model.model.model",),
    exclude=_SHT,
    opaque=("ResampleS2",),
    fp32_modules=_SPECTRAL,
    # makani's MLPs are 1x1 convolutions on NCHW maps, which Inductor lays out
    # channels-last: FCN3's block MLP under its wrapper's bf16 autocast took 9.62 ms
    # compiled so against 7.51 eager, 6.89 with its layout kept, and 11.21 as
    # matrix multiplies (H200, TF32 flags, 2026-12-01, docs/bench/
    # 2026-12-01-h200-fortyfourth/fcn3-mlp-options-1298e76.json). In FCN3's calls
    # the MLP regions had run slower compiled (10.8 ms against 8.6). Earth2Studio's
    # makani SFNO shares this entry and the MLP class (not measured).
    inductor_options={"layout_optimization": False},
    note="makani network under its datetime-taking wrappers; SHTs stay eager; "
    "torch-harmonics' resampling runs eagerly inside the graph",
)
# Run on the CPU (zoo "ace2", small, fme 2026.10.0 with torch-harmonics 0.8.0): the
# network with its SHTs split off (the entry before) compiled as ten graphs, one per
# encoder, decoder and block piece between the spectral filters; the whole network
# broke ten times inside fme's spectral convolutions. With them opaque, as measured
# for the torch-harmonics SFNO, it is one graph without breaks.
_ACE2 = ModelSpec(
    regions=("stepper.modules.0",),
    opaque=("SpectralConvS2",),
    cudagraphs=False,
    fp32_modules=_SPECTRAL,
    note="fme SFNO behind ACE's stepper (not a module); spectral convolutions run "
    "eagerly inside the graph; normalisation, ocean mask and corrector stay eager",
)
_STORMSCOPE = ModelSpec(
    regions=("stage_models.*",),
    note="physicsnemo EDM DiT experts, one per sampler stage (35 calls a step); "
    "skipped if compile_experts() already replaced them",
)


# The spectral convolution (SHT, complex64 contraction, inverse SHT) breaks Inductor on
# CUDA with torch-harmonics 0.9.2 (KeyError: 'complex64'). Splitting the region around
# it ran slower than eager (0.98x on an H100): ten small CUDA graphs with eager glue.
# As opaque operators the network stays one graph. CUDA graphs then cover only the
# partitions between the eight opaque calls, and copying each partition's input into
# its static buffer made the step slower (0.92x) than no CUDA graphs (1.00x).
TORCH_HARMONICS_SFNO = ModelSpec(
    regions=("model",),
    opaque=("SpectralConvS2",),
    cudagraphs=False,
    inductor_options=sfno_inductor_options,
    pad_batch=True,
    # Spherical-harmonic transforms under bf16: torch-harmonics' Legendre
    # contraction has no bf16 kernel, and complex bf16 FFTs do not exist.
    fp32_modules=("SpectralConvS2", "RealSHT", "InverseRealSHT"),
    note="torch-harmonics SFNO; spectral convolutions run eagerly inside the graph",
)
"""Spec for a prognostic around torch-harmonics' ``SphericalFourierNeuralOperator``.

Earth2Studio ships no such class (its SFNO wraps makani's), so the table cannot key
it by your class: register yours, with the network at ``model``::

    from earth2studio_compile.models import TORCH_HARMONICS_SFNO, register_model

    register_model(MySFNOPrognostic, TORCH_HARMONICS_SFNO)

Held elsewhere, say at ``net``:
``register_model(MySFNOPrognostic, dataclasses.replace(TORCH_HARMONICS_SFNO,
regions=("net",)))``. Measured on the zoo's SFNO-class model
(``earth2studio_compile.tools.zoo.SFNOPrognostic``), which the table lists with it.
"""

MODEL_TABLE: dict[str, ModelSpec] = {
    # -- compiled ------------------------------------------------------------------
    _PX + "fcn.FCN": ModelSpec(
        regions=("model",), pad_batch=True, note="physicsnemo AFNO"
    ),
    _PX + "dlwp.DLWP": ModelSpec(
        regions=("model",),
        pad_batch=True,
        patches=(DLWP_ZENITH,),
        note="physicsnemo DLWP (cubed sphere); sparse regridding and zenith angles "
        "stay eager",
    ),
    _PX + "sfno.SFNO": _MAKANI,
    _PX + "fcn3.FCN3": _MAKANI,
    _PX + "ace2.ACE2ERA5": _ACE2,
    _PX + "samudrace.SamudrACE": ModelSpec(
        regions=("core_model.0", "core_model.1"),
        exclude=_SHT,
        fp32_modules=_SPECTRAL,
        note="fme atmosphere SFNO and Samudra ocean UNet; SHTs stay eager",
    ),
    _PX + "aifs.AIFS": _AIFS,
    _PX + "aifs2.AIFS2": _AIFS,
    _PX + "aifsens.AIFSENS": _AIFS,
    _PX + "aifs2ens.AIFS2ENS": _AIFS,
    _PX + "aurora.Aurora": _AURORA,
    _PX + "aurora1p5.Aurora1p5": _AURORA,
    _PX + "aurora1p5.Aurora1p5_6h": _AURORA,
    _PX + "aurora1p5.Aurora1p5Ensemble": _AURORA_ENSEMBLE,
    _PX + "aurora1p5.Aurora1p5Ensemble_6h": _AURORA_ENSEMBLE,
    _PX + "atlas.Atlas": ModelSpec(
        regions=("model", "autoencoders.*"),
        note="latent DiT drift net (called by the interpolant sampler) and NATTEN "
        "autoencoder; the sampler and its noise stay eager",
    ),
    _PX + "atlas_crps.AtlasCRPS": ModelSpec(
        regions=("autoencoder",),
        note="autoencoder only: the CRPS DiT draws randn inside forward, and compiled "
        "random streams would not reproduce eager seeded members",
    ),
    _PX + "camulator.CAMulator": ModelSpec(
        regions=("model",), pad_batch=True, note="CREDIT CrossFormer port"
    ),
    _PX + "cbottle_video.CBottleVideo": ModelSpec(
        regions=("_mixture_model.experts.*",),
        note="cBottle denoiser experts; the mixture router (sigma.item()) and the "
        "EDM sampler stay eager",
    ),
    _PX + "dlesym.DLESyM": _DLESYM,
    _PX + "dlesym.DLESyMLatLon": _DLESYM,
    _PX + "dlesym_v0_isccp_era5.DLESyMv0_ISCCP_ERA5": _DLESYM,
    _PX + "dlesym_v0_isccp_era5.DLESyMv0_ISCCP_ERA5LatLon": _DLESYM,
    _PX + "interpmodafno.InterpModAFNO": ModelSpec(
        regions=("interp_model",),
        wrapped=("px_model",),
        note="physicsnemo ModAFNO interpolator (5 calls a base step) plus the wrapped "
        "base model's own regions",
    ),
    _PX + "stormcast.StormCast": ModelSpec(
        regions=("regression_model", "diffusion_model"),
        # Inductor lays the UNets out channels-last: its weighing counts their
        # depthwise up/down-sampling convolutions as ordinary ones, and cuDNN's
        # channels-last depthwise transposed convolution is slow. Measured on an
        # H100 (TF32, tenth session): convolutions 1332 ms a step channels-last,
        # 954 ms kept as they are; the step 2693 ms against 2344 (without CUDA
        # graphs) and eager's 3947.
        inductor_options={"layout_optimization": False},
        note="physicsnemo UNets; the EDM sampler loop stays eager",
    ),
    _PX + "stormcastconus.StormCastCONUS": ModelSpec(
        regions=(
            "diffusion_model.model_high",
            "diffusion_model.model_pz_low",
            "diffusion_model.model_tq_low",
            "diffusion_model.model_uv_low",
        ),
        note="four EDM DiTs; the sigma-threshold router between them stays eager",
    ),
    _PX + "stormscope.StormScopeGOES": _STORMSCOPE,
    _PX + "stormscope.StormScopeMRMS": _STORMSCOPE,
    _PX + "stormscope_meteosat.StormScopeMeteosatEU": ModelSpec(
        regions=("experts.*",),
        note="EDM DiT experts; skipped if compile_model() already replaced them",
    ),
    _PX + "ucast.UCast": ModelSpec(regions=("model",), note="Dhariwal UNet"),
    # -- wrappers: the wrapped models' own entries apply -----------------------------
    _PX + "dxwrapper.DiagnosticWrapper": ModelSpec(
        wrapped=("px_model", "dx_model.*"),
        note="compiles what the wrapped prognostic and diagnostics compile",
    ),
    # -- eager, with the reason ------------------------------------------------------
    _PX + "persistence.Persistence": ModelSpec(
        reason="no network: persistence returns its input, nothing to compile",
    ),
    _PX + "datareplay.DataReplay": ModelSpec(
        reason="no network: replays frames from a data source, nothing to compile",
    ),
    _PX + "pangu.Pangu3": ModelSpec(reason=_ONNX),
    _PX + "pangu.Pangu6": ModelSpec(reason=_ONNX),
    _PX + "pangu.Pangu24": ModelSpec(reason=_ONNX),
    _PX + "fengwu.FengWu": ModelSpec(reason=_ONNX),
    _PX + "fuxi.FuXi": ModelSpec(reason=_ONNX),
    _PX + "fuxi_s2s.FuXiS2S": ModelSpec(reason=_ONNX),
    _PX + "graphcast_small.GraphCastSmall": ModelSpec(reason=_JAX),
    _PX + "graphcast_operational.GraphCastOperational": ModelSpec(reason=_JAX),
    _PX + "gencast_mini.GenCastMini": ModelSpec(reason=_JAX),
    _PX + "weathernext2_cyclones.WeatherNext2Cyclones": ModelSpec(reason=_JAX),
    _PX + "weathernext2_cyclones.WeatherNext2CyclonesMini": ModelSpec(reason=_JAX),
    # -- not Earth2Studio's: kept out of table_markdown() ---------------------------
    # The zoo's SFNO-class model, by name: the library never imports its tooling.
    "earth2studio_compile.tools.zoo.SFNOPrognostic": TORCH_HARMONICS_SFNO,
}


def register_model(
    cls: type | str,
    spec: ModelSpec | None = None,
    /,
    **fields: Any,
) -> ModelSpec:
    """Add or replace a model class in the table.

    Parameters
    ----------
    cls : type | str
        The model class, or its ``"module.QualName"``
    spec : ModelSpec | None, optional
        The spec; alternatively pass its fields as keyword arguments
    **fields : Any
        ``regions``, ``reason``, ``exclude``, ``opaque``, ``cudagraphs``,
        ``inductor_options``, ``attention_backends``, ``pad_batch``, ``note``
        (:class:`~earth2studio_compile.spec.ModelSpec` has them all)

    Returns
    -------
    ModelSpec
        The registered spec

    Examples
    --------
    >>> register_model(MyModel, regions=("net",))  # doctest: +SKIP
    >>> register_model(MyOnnxModel, reason="ONNX Runtime session")  # doctest: +SKIP
    """
    if spec is None:
        spec = ModelSpec(**fields)
    elif fields:
        raise TypeError("Pass either a ModelSpec or its fields, not both.")
    key = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    MODEL_TABLE[key] = spec
    return spec


def lookup(model: Any) -> tuple[str, ModelSpec] | None:
    """The table entry for ``model``'s class or its nearest listed base class.

    Parameters
    ----------
    model : Any
        A model instance or class

    Returns
    -------
    tuple[str, ModelSpec] | None
        The matching key and spec, or None for a model the table does not know
    """
    for cls in (model if isinstance(model, type) else type(model)).__mro__:
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key in MODEL_TABLE:
            return key, MODEL_TABLE[key]
    return None


def shipped_entries() -> list[str]:
    """The table's keys of Earth2Studio's own classes (not users' registrations),
    in the published table's order: by class name, case aside.

    Returns
    -------
    list[str]
        Dotted class paths, ``earth2studio.models.px.<module>.<Class>``
    """
    shipped = [k for k in MODEL_TABLE if k.startswith(_PX)]
    return sorted(shipped, key=lambda k: k.rsplit(".", 1)[-1].lower())


def table_markdown() -> str:
    """The model table as Markdown, as published in ``docs/models.md``."""
    lines = [
        "| model | compiled region(s) | kept eager inside | notes / why eager |",
        "| --- | --- | --- | --- |",
    ]
    for key in shipped_entries():
        spec = MODEL_TABLE[key]
        name = key.rsplit(".", 1)[-1]
        regions = ", ".join(f"`{r}`" for r in spec.regions)
        if spec.wrapped:
            regions = (
                (regions + ", " if regions else "")
                + "wrapped: "
                + ", ".join(f"`{w}`" for w in spec.wrapped)
            )
        exclude = ", ".join(
            [*spec.exclude, *(f"{c} (opaque, in graph)" for c in spec.opaque)]
        )
        why = spec.reason or spec.note
        if not spec.cudagraphs:
            why += "; no CUDA graphs by default"
        if spec.inductor_options is not None:
            why += "; own Inductor options"
        if spec.attention_backends is not None:
            why += "; own SDPA backends for compiled code"
        if spec.pad_batch:
            why += "; smaller batches padded, not recompiled"
        if spec.fp32_modules:
            why += "; fp32 under bf16: " + ", ".join(spec.fp32_modules)
        for precision, reason in spec.precisions_refused.items():
            why += f"; no {precision}: {reason}"
        for device, reason in spec.devices_refused.items():
            why += f"; not compiled on {device}: {reason}"
        for patch in spec.patches:
            why += f"; `{patch.name}` patched while a session runs ({patch.why})"
        if spec.quiet_nvtx:
            why += "; NVTX ranges are no-ops inside its regions' calls"
        lines.append(f"| {name} | {regions or 'eager'} | {exclude} | {why} |")
    return "\n".join(lines)
