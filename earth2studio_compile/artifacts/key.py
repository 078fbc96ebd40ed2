"""The settings a region's compiled code depends on, as one object, and its keys.

Compiled code is kept three ways, each under a key: the compile cache's bundles
(:mod:`.bundles`), ahead-of-time artifacts (:mod:`.aot_build`, :mod:`.aot_load`)
and executors kept in this process (:mod:`earth2studio_compile.resident`). All
three read the same settings from a :class:`RegionTarget`, which lists them once
(:meth:`RegionTarget.factors`, each a stable text, as vLLM has every config
contribute to one hash); each key takes the factors it needs. The texts differ
where the keys must: a kept executor is keyed by the backend object itself, an
artifact also by its input signature and the core's source.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from earth2studio_compile._torch.flex import NO_ARTIFACT as FLEX_NO_ARTIFACT
from earth2studio_compile.artifacts.aot_key import (
    AOT_FORMAT,
    argument_texts,
    constants_text,
    counted,
    effective_precision,
    input_layouts,
    source_hash,
)
from earth2studio_compile.cache import artifact_key, key_fields
from earth2studio_compile.options import (
    FLEX,
    CompileOptions,
    CompilePolicy,
    TableChoices,
)
from earth2studio_compile.patches import MethodPatch

T = TypeVar("T", bound="RegionTarget")


@dataclass(frozen=True, kw_only=True)
class RegionTarget:
    """One region and everything its compiled code depends on but its inputs.

    Attributes
    ----------
    module : torch.nn.Module
        The region's core
    owner : str
        Qualified class name of the model that owns the region
    region : str
        Dotted path of the region in the model (``""``: the model itself)
    policy : CompilePolicy
        What the region compiles with on ``device``
    device : torch.device
        Device the core computes on (of its first call's first tensor)
    precision : str | None
        The region's precision (:mod:`earth2studio_compile.precision`); None:
        PyTorch's flags
    opaque : bool
        The region calls opaque submodules inside its graph
    fp32_modules : tuple[str, ...]
        Class names of submodules kept in fp32 under ``"bf16"`` (the table's)
    unused_arguments : tuple[str, ...]
        Parameters of the core's ``forward`` it does not read (the table's, where
        the core holds none of the modules that would): their values are not
        part of the artifact's key (:func:`~.aot_key.argument_texts`)
    patches : tuple[MethodPatch, ...]
        The table's method patches for submodules the core holds
        (:func:`~earth2studio_compile.spec.region_patches`): its compiled calls
        run them, and a build in another process sets them on its copy
    autocast : str | None
        The 16-bit autocast its callers run it under (``"bfloat16"``: AIFS's
        wrapper), read at its first call (:func:`~earth2studio_compile.precision.
        ambient_autocast`): an export does not see it, so an artifact enters it in
        its graph; None where none is on
    """

    module: torch.nn.Module
    owner: str
    region: str
    policy: CompilePolicy
    device: torch.device
    precision: str | None
    opaque: bool = False
    fp32_modules: tuple[str, ...] = ()
    unused_arguments: tuple[str, ...] = ()
    patches: tuple[MethodPatch, ...] = ()
    autocast: str | None = None

    @classmethod
    def resolve(
        cls: type[T],
        module: torch.nn.Module,
        *,
        owner: str,
        region: str,
        device: torch.device,
        precision: str | None,
        options: CompileOptions | None = None,
        table: TableChoices | None = None,
        opaque: bool = False,
        fp32_modules: Sequence[str] = (),
        unused_arguments: Sequence[str] = (),
        patches: Sequence[MethodPatch] = (),
        without_cudagraphs: bool = False,
        autocast: str | None = None,
        **more: Any,
    ) -> T:
        """The target with its policy resolved for ``device``
        (:meth:`CompilePolicy.resolve`); ``more`` are a subclass's own fields.

        Parameters
        ----------
        module, owner, region, device, precision, opaque, fp32_modules, \
        unused_arguments, patches, autocast
            The fields of those names (see the class's Attributes)
        options : CompileOptions | None, optional
            The user's options, resolved with ``table`` into the ``policy``
        table : TableChoices | None, optional
            The model table's choices for the model
        without_cudagraphs : bool, optional
            A policy without CUDA graphs whatever ``options`` and ``table`` chose
            (:meth:`CompilePolicy.resolve`), by default False
        **more : Any
            A subclass's own fields

        Returns
        -------
        T
            The target
        """
        policy = CompilePolicy.resolve(
            options or CompileOptions(),
            device,
            table,
            without_cudagraphs,
            precision=precision,
        )
        return cls(
            module=module,
            owner=owner,
            region=region,
            policy=policy,
            device=device,
            precision=precision,
            opaque=opaque,
            fp32_modules=tuple(fp32_modules),
            unused_arguments=tuple(unused_arguments),
            patches=tuple(patches),
            autocast=autocast,
            **more,
        )

    @property
    def no_artifact(self) -> str | None:
        """Why no ahead-of-time artifact can serve the region (its compiled code
        takes the Dynamo path), or None."""
        if self.opaque:
            return "opaque submodules (Python operators) need the Dynamo path"
        if FLEX in self.policy.attention:
            return FLEX_NO_ARTIFACT
        return None

    @property
    def label(self) -> str:
        """``Model.region``, for messages."""
        model = self.owner.rsplit(".", 1)[-1]
        return f"{model}.{self.region}" if self.region else model or "region"

    def factors(self) -> dict[str, str]:
        """Every setting compiled code depends on, besides the module and the
        inputs, each as a stable text; the keys below take theirs from here."""
        policy = self.policy
        backend = policy.backend
        shown = sorted((str(k), repr(v)) for k, v in (policy.options or {}).items())
        factors = {
            "owner": self.owner,
            "region": self.region,
            # The user's options and what the policy resolved them to.
            "policy": policy.cache_text,
            # The object itself: two callables of one name may compile differently.
            "backend": backend if isinstance(backend, str) else str(id(backend)),
            # Autocast and TF32 change the compiled graph and its kernels.
            "precision": str(self.precision),
            "device": str(self.device),
            "opaque": str(self.opaque),
            "fp32": str(sorted(self.fp32_modules)),
            # What the ahead-of-time compile is handed (its CUDA graphs are the
            # runner's own, so the mode's own text, not the policy's label).
            "aot": (
                f"aot|mode={policy.mode or 'default'}|options={shown}|"
                f"fp32_modules={sorted(self.fp32_modules)}"
            ),
        }
        if self.autocast is not None:
            # Only where one is on: every other region keeps the keys it had.
            factors["autocast"] = self.autocast
            factors["aot"] += f"|autocast={self.autocast}"
        if policy.attention:
            # The backend SDPA lowers to is chosen at the compile, not the export.
            factors["aot"] += f"|attention={','.join(policy.attention)}"
        return factors

    def resident_key(self) -> str:
        """Key of an executor kept in this process
        (:mod:`earth2studio_compile.resident`): every factor but the on-disk one."""
        f = self.factors()
        return "|".join(f"{k}={v}" for k, v in f.items() if k != "aot")

    def bundle_fields(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Fields of the compile cache bundle of a first call with these
        arguments (:func:`~earth2studio_compile.cache.key_fields`); its key is
        :func:`~earth2studio_compile.cache.artifact_key` of them.

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], Mapping[str, Any]
            The first call's arguments

        Returns
        -------
        dict[str, Any]
            The JSON-serialisable fields
        """
        f = self.factors()
        # What the region computes in, as the artifact's key counts it: a
        # build(precision="tf32") leaves the bundle a forecast under PyTorch's TF32
        # flags with precision None loads (it found none before: only a shared
        # Inductor cache served it, not a bundle carried to another root).
        computes = effective_precision(self.precision, self.device)
        return key_fields(
            self.owner,
            self.region,
            self.module,
            args,
            kwargs,
            # The fp32 modules and opaque operators change the traced graph: a
            # bundle of other settings would only miss Inductor's cache.
            f"{f['policy']}|precision={computes}|fp32={f['fp32']}|"
            f"opaque={f['opaque']}"
            + (f"|autocast={self.autocast}" if self.autocast else ""),
            self.device,
        )

    def aot_key(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The key of the region's ahead-of-time artifact for a call with these
        arguments, and the fields it hashes.

        Beyond the bundle's fields: the layout version, the core's tensor names,
        shapes and dtypes, a sha256 of the source of its module classes, the
        effective precision, training flags, the CUDA version and every non-tensor
        argument.

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], Mapping[str, Any]
            The call's arguments

        Returns
        -------
        tuple[str, dict[str, Any]]
            A 32-character hex key and the JSON-serialisable fields
        """
        module, device = self.module, self.device
        args, kwargs = counted(module, args, kwargs, self.unused_arguments)
        fields = key_fields(
            self.owner,
            self.region,
            module,
            args,
            kwargs,
            self.factors()["aot"],
            device,
        )
        fields.update(
            {
                "aot_format": AOT_FORMAT,
                "constants": constants_text(module),
                "source": source_hash(module),
                # What the region computes in, however it was asked for: a build
                # for "tf32" serves a call under PyTorch's TF32 flags, and back.
                "precision": effective_precision(self.precision, device),
                "training": any(m.training for m in module.modules()),
                "cuda": torch.version.cuda if device.type == "cuda" else None,
                "arguments": argument_texts(module, args, kwargs),
                # The code reads its inputs with these strides: another layout
                # of the same shapes is another program.
                "layouts": input_layouts(args, kwargs),
            }
        )
        return artifact_key(fields), json.loads(json.dumps(fields, default=str))
