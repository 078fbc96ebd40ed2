"""Compiled code kept on disk: one store, one key, two kinds of entry.

:mod:`.key` holds :class:`~.key.RegionTarget`, the settings a region's compiled
code depends on, listed once, and the keys made of them (a bundle's, an
artifact's, and the one :mod:`earth2studio_compile.resident` keeps executors
under). :mod:`.store` holds the rules every entry on disk keeps: written whole,
a ``meta.json`` of the key's fields and a sha256 of every member checked before
use, trust, one writer per key.

:mod:`.bundles` packs one region's Dynamo/Inductor compile to travel
(:mod:`earth2studio_compile.cache` holds the root and its trust rule).

An artifact is an AOTInductor package of one region's core for one input
signature, stored under ``cache_root()/aot/<key>/`` with a ``meta.json`` that
repeats the key's fields and a sha256 of the package. Three rules keep one from
ever giving a wrong answer:

- **Weights are never in the artifact.** The package holds code only; the live
  module's tensors are bound at load as user-managed constants (no copy), so an
  in-place weight change is seen by the next call, and a replaced tensor is rebound.
- **An artifact is used only under its key**
  (:meth:`.key.RegionTarget.aot_key`): model and core class, parameter and buffer
  names, shapes and dtypes, a sha256 of the source of every module class in the
  core (vLLM hashes its traced source files the same way), torch/triton/CUDA/Python
  versions, the device, precision, mode and input signature; ``meta.json`` and the
  checksum are checked before loading (:func:`.store.check_dir`).
- **The first call is verified** against one eager call
  (:func:`.aot_load.verify`); the region falls back to the Dynamo path on any
  reason. A package that passed with the same weights in an earlier process (a
  seal of its sha256 and of the weights' values, :mod:`.verified`) is the same
  computation and is not verified again.

Ahead-of-time modules: :mod:`.aot_key` (what the key hashes about the core, the
layout), :mod:`.aot_build` (export and compile one region), :mod:`.aot_load`
(load, bind, verify), :mod:`.aot_runner` (the loaded runner: bind, run with CUDA
graphs).
"""
