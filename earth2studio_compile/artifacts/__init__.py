"""Compiled code kept on disk: the compile cache's bundles, and ahead-of-time
artifacts (key, build, load, verify).

:mod:`.bundles` packs one region's Dynamo/Inductor compile to travel
(:mod:`earth2studio_compile.cache` holds the rules: root, trust, locks).

An artifact is an AOTInductor package of one region's core for one input
signature, stored under ``cache_root()/aot/<key>/`` with a ``meta.json`` that
repeats the key's fields and a sha256 of the package. Three rules keep one from
ever giving a wrong answer:

- **Weights are never in the artifact.** The package holds code only; the live
  module's tensors are bound at load as user-managed constants (no copy), so an
  in-place weight change is seen by the next call, and a replaced tensor is rebound.
- **An artifact is used only under its key** (:func:`.aot_key.key_for`): model and
  core class, parameter and buffer names, shapes and dtypes, a sha256 of the source
  of every module class in the core (vLLM hashes its traced source files the same
  way), torch/triton/CUDA/Python versions, the device, precision, mode and input
  signature; ``meta.json`` is checked before loading.
- **The first call is verified** against one eager call
  (:func:`.aot_load.verify`); the region falls back to the Dynamo path on any
  reason.

Ahead-of-time modules: :mod:`.aot_key` (the key and the layout),
:mod:`.aot_build` (export and compile one region), :mod:`.aot_load` (load, bind,
run with CUDA graphs, verify).
"""
