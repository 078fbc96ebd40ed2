"""The zoo's AIFS ENS v2 (tools/zoo/aifs.py) through ``compile=True``: the small size
on the CPU, the published one (GPU-marked) on CUDA.

Needs anemoi-models 0.11.2 with torch-geometric, and the packages Earth2Studio's
AIFS modules import (earthkit-regrid, ecmwf-opendata, a ``flash_attn`` stand-in):
skipped elsewhere, so the README's test command skips it. CI installs them into a
folder of their own and runs this module with it on PYTHONPATH (``.ci/run``).

The wrapper runs the network under bfloat16 autocast: Inductor's fused kernels
round where eager does not, so compiled and eager agree to bfloat16's precision,
not float32's. The ensemble noise is drawn eagerly, outside the processor, after the
wrapper seeds the global generator with its seed plus the step: eager and compiled
runs draw the same noise.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

import pytest
import torch
from conftest import held_rollout, messages
from zoo_helpers import (
    assert_cuda_graphs,
    compiled_workflow_matches_eager,
    held_outputs_match_eager,
)

from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.planning import plan
from earth2studio_compile.tools import zoo

_INSTALL = "(see .ci/run for the install)"
pytest.importorskip("anemoi.models", reason=f"needs anemoi-models 0.11.2 {_INSTALL}")
if not version("anemoi-models").startswith("0.11."):
    pytest.skip(
        f"the zoo's AIFS2ENS needs anemoi-models 0.11.x (Earth2Studio's pin), "
        f"found {version('anemoi-models')} {_INSTALL}",
        allow_module_level=True,
    )
for _module in ("torch_geometric", "earthkit.regrid", "ecmwf.opendata", "flash_attn"):
    # Earth2Studio's AIFS2ENS module imports each; its constructor fails without.
    pytest.importorskip(_module, reason=f"needs {_module} {_INSTALL}")

# Measured on the CPU: at most 9e-3 per variable after two steps (three seeds), in
# bfloat16 autocast, whose unit roundoff is 3.9e-3: an output element whose
# rounding flips differs by one bfloat16 step. Another noise draw differs by 14-19%
# (test_the_noise_moves_aifs2ens_past_the_tolerance), an overwritten output by O(1).
REL_L2 = 3e-2
# Measured on an H200 (2026-11-28, one seed): 9.3e-3 after two steps, bfloat16
# autocast through 16 processor layers of width 1024; kept above the CPU's until
# more seeds have run there.
GPU_REL_L2 = 5e-2


def _check_region(report, nsteps: int):
    (region,) = report.regions
    assert region.region == "model.model.processor", report.summary()
    assert region.status == "compiled" and region.calls == nsteps, report.summary()
    assert (region.graphs, region.graph_breaks, region.recompiles) == (1, 0, 0)
    return region


def test_compiled_aifs2ens_matches_eager_processor_one_graph(logs):
    report, _ = compiled_workflow_matches_eager(
        zoo.build("aifs2ens"), nsteps=2, tolerance=REL_L2
    )
    _check_region(report, nsteps=2)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_held_aifs2ens_outputs_are_not_overwritten():
    held_outputs_match_eager(zoo.build("aifs2ens"), nsteps=2, tolerance=REL_L2)


def test_a_fresh_aifs2ens_compiles_at_its_first_call(logs):
    """A model that never ran: anemoi's SDPA wrapper keeps its sliding-window mask
    on itself, assigned at its first call, inside the processor's activation
    checkpoint (``torch.utils.checkpoint`` around each chunk of layers), a side
    effect Dynamo refuses there for the backward's recompute. Regression: the
    processor fell back to eager with a WARNING; without grad the side effect is
    allowed (``_torch.call_context``), and the table's patch (anemoi_patches)
    makes the mask without it. The processor compiles at its first call (one
    graph, no break) and gives eager's answer within the tolerance."""
    model = zoo.build("aifs2ens")
    compiled, session = held_rollout(model, nsteps=2, compile=True)
    compiled = [y.clone() for y in compiled]
    (region,) = session.report.regions
    assert region.status == "compiled", session.report.summary()
    assert (region.graphs, region.graph_breaks) == (1, 0), session.report.summary()
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
    eager, _ = held_rollout(model, nsteps=2, compile=False)
    for step in (1, 2):
        assert rel_l2(compiled[step], eager[step]) < REL_L2, f"step {step}"


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_aifs2ens_asked_for_tf32_or_fp32_keeps_its_own_autocast(precision, logs):
    """Regression: "tf32" and "fp32" turn autocast off inside a region, but the
    wrapper runs the network under 16-bit autocast and hands the processor 16-bit
    tensors: the first call raised, compiled and eagerly ("mat1 and mat2 must have
    the same dtype"), and fell back with a WARNING; ``tools.build aifs2ens
    --precision tf32`` left the processor "not judged" (2026-11-30, CPU). The
    table refuses both for AIFS: one WARNING, PyTorch's settings, and the
    processor compiles and gives eager's answer."""
    import torch

    from earth2studio_compile import CompileSession
    from earth2studio_compile.tools.bench.runs import initial_state

    model = zoo.build("aifs2ens")
    eager, _ = held_rollout(model, nsteps=2, compile=False)
    eager = [y.clone() for y in eager]
    torch.manual_seed(0)
    x, coords = initial_state(model, torch.device("cpu"))
    with CompileSession(model, precision=precision) as session:
        compiled = []
        for step, (y, _) in enumerate(model.create_iterator(x, coords)):
            compiled.append(y.clone())
            if step == 2:
                break
    region = _check_region(session.report, nsteps=2)
    assert region.precision is None, session.report.summary()
    [warning] = messages(logs, "WARNING")
    assert f"does not run in {precision}" in warning, warning
    for step in (1, 2):
        assert rel_l2(compiled[step], eager[step]) < REL_L2, f"step {step}"


def test_the_window_mask_patch_is_upstreams_forward_bit_for_bit():
    """The table's patch of anemoi's SDPA wrapper (anemoi_patches) replaces the
    installed code it was written against, and returns what it returns, with a
    window and without (the instance's own mask then, as upstream)."""
    import torch
    from anemoi.models.layers.attention import SDPAAttentionWrapper

    from earth2studio_compile.anemoi_patches import AIFS_WINDOW_MASK
    from earth2studio_compile.patches import source_digest

    assert source_digest(SDPAAttentionWrapper.forward) == AIFS_WINDOW_MASK.source
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 48, 8) for _ in range(3))
    for window in (3, None):
        upstream, patched = SDPAAttentionWrapper(), SDPAAttentionWrapper()
        if window is None:  # as after a call with a window
            upstream.mask = patched.mask = torch.rand(48, 48) > 0.5
        want = upstream(q, k, v, batch_size=2, window_size=window)
        got = AIFS_WINDOW_MASK.replacement(patched, q, k, v, 2, window_size=window)
        assert torch.equal(got, want), window


def test_build_gives_the_aifs2ens_processor_an_artifact_a_later_call_runs(
    tmp_path, monkeypatch
):
    """Regression (2026-11-30, CPU; H200 at its published size): build() refused
    the processor an artifact, its window masks being tensors held beside its
    weights, and every later process compiled it on the Dynamo path at its first
    call (2.3 s on an H200: a 20-step call ran it eagerly). With the table's patch
    and the wrapper's autocast carried into the export, it is built, verified
    against eager, and a later process's first call runs it."""
    from aot_helpers import built_then_run_from_its_artifact

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_BACKGROUND", "off")
    built_then_run_from_its_artifact(zoo.build("aifs2ens"))


def test_the_noise_moves_aifs2ens_past_the_tolerance():
    """Eager steps from two noise seeds differ by far more than the tolerance: a
    compiled processor that lost or froze the noise would fail the tests above."""
    model = zoo.build("aifs2ens")
    first, _ = held_rollout(model, nsteps=2, compile=False)
    first = [y.clone() for y in first]
    model.seed += 1
    second, _ = held_rollout(model, nsteps=2, compile=False)
    for step in (1, 2):
        assert rel_l2(second[step], first[step]) > 3 * REL_L2, f"step {step}"


@pytest.mark.gpu
@pytest.mark.published
def test_published_aifs2ens_on_the_gpu_matches_eager(
    logs, strict_fp32, record_property
):
    """AIFS's published graph sizes (542,080 data and 40,320 hidden nodes) and
    network (width 1024, 16 processor layers of 16 heads) on the 721x1440 grid, 2
    steps: the processor one graph, no break, no skipped CUDA graph.

    Needs the wheels of ``.ci/fetch-aifs-wheels.sh`` there."""
    _published_matches_eager(zoo.build("aifs2ens", size="full"), logs, record_property)


def _published_matches_eager(model, logs, record_property) -> None:
    """Two compiled steps of a published-size AIFS2ENS against eager's: the
    processor one graph, no break, no skipped CUDA graph, no WARNING."""
    cudagraphs = plan(model).spec.cudagraphs
    report, worst = compiled_workflow_matches_eager(
        model, nsteps=2, tolerance=GPU_REL_L2, device="cuda"
    )
    record_property("rel_l2", worst)
    record_property("summary", report.summary())
    assert_cuda_graphs(report, [_check_region(report, nsteps=2)], cudagraphs)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def _has_flash_kernels() -> bool:
    try:
        import flash_attn_2_cuda  # noqa: F401
    except ImportError:
        return False
    return True


def test_aifs2ens_takes_anemois_flash_attention_when_asked():
    """The zoo's network runs SDPA by default; ``attention="flash_attention"``
    (:func:`aifs2ens_flash`'s) builds anemoi's flash-attn wrapper instead, as
    anemoi's default configuration and the published AIFS's users do."""
    from anemoi.models.layers.attention import (
        FlashAttentionWrapper,
        SDPAAttentionWrapper,
    )

    from earth2studio_compile.tools.zoo.aifs import aifs2ens

    for attention, wrapper in (
        ("scaled_dot_product_attention", SDPAAttentionWrapper),
        ("flash_attention", FlashAttentionWrapper),
    ):
        processor = aifs2ens(attention=attention).model.model.processor
        kinds = {
            type(m)
            for m in processor.modules()
            if "AttentionWrapper" in type(m).__name__
        }
        assert kinds == {wrapper}, (attention, kinds)


@functools.cache
def _window_attention_op():
    """flash-attn's forward as its Python layer registers it, computed on the CPU:
    an opaque custom operator whose fake output takes q's layout
    (``empty_like(q)``), as the CUDA kernel's does."""

    @torch.library.custom_op("e2sc_test::window_attention", mutates_args=())
    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int, right: int
    ) -> torch.Tensor:
        # [batch, grid, heads, dim]; flash-attn's window, (-1, -1) for none.
        scores = torch.einsum("bihd,bjhd->bhij", q.float(), k.float())
        scores = scores / q.shape[-1] ** 0.5
        i = torch.arange(q.shape[1])[:, None]
        j = torch.arange(k.shape[1])[None, :]
        keep = ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))
        weights = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        out = torch.einsum("bhij,bjhd->bihd", weights, v.float())
        return torch.empty_like(q).copy_(out)

    @attend.register_fake
    def _(q, k, v, left, right):
        return torch.empty_like(q)

    return attend


def _on_window_attention_op(model):
    """``model`` with each of anemoi's flash-attn wrappers calling
    :func:`_window_attention_op` (CI has flash-attn's Python package only as a
    stand-in, and no CUDA)."""
    op = _window_attention_op()

    def flash_attn_func(q, k, v, causal=False, window_size=(-1, -1), **unused):
        assert not causal and all(x in (None, 0.0) for x in unused.values())
        return op(q, k, v, *window_size)

    for m in model.modules():
        if type(m).__name__ == "FlashAttentionWrapper":
            m.attention = flash_attn_func
    return model


def test_aifs2ens_on_flash_attns_operator_compiles_to_one_graph(logs):
    """AIFS2ENS as its users run it, on flash-attn's attention (an opaque custom
    operator, here a CPU one shaped like it): the processor is one graph through
    the operator, without a break, and gives eager's answer."""
    from earth2studio_compile.tools.zoo.aifs import aifs2ens

    model = _on_window_attention_op(aifs2ens(attention="flash_attention"))
    report, _ = compiled_workflow_matches_eager(model, nsteps=2, tolerance=REL_L2)
    _check_region(report, nsteps=2)
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")


def test_aifs2ens_on_flash_attns_operator_is_built_ahead_of_time(tmp_path, monkeypatch):
    """The same network built by AOTInductor, the operator called back through
    its proxy executor: built, verified against eager, run by a later first call.
    (On an H200 this build failed at its C++ compile, PyTorch's undeclared int
    arrays: test/_torch/test_aoti.py.)"""
    from aot_helpers import built_then_run_from_its_artifact

    from earth2studio_compile.tools.zoo.aifs import aifs2ens

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_BACKGROUND", "off")
    model = _on_window_attention_op(aifs2ens(attention="flash_attention"))
    built_then_run_from_its_artifact(model)


@pytest.mark.skipif(_has_flash_kernels(), reason="flash-attn's kernels are installed")
def test_aifs2ens_flash_names_what_it_needs_without_flash_attns_kernels():
    """With CI's stand-in, anemoi builds the flash-attn network and would fail at
    its first call: the zoo's builder raises at once, naming the wheel's recipe."""
    from earth2studio_compile.tools.zoo.aifs import aifs2ens_flash

    with pytest.raises(ImportError, match="build-flash-attn.sh"):
        aifs2ens_flash(size="small")


@pytest.mark.gpu
@pytest.mark.published
@pytest.mark.skipif(not _has_flash_kernels(), reason="needs flash-attn's kernels")
def test_published_aifs2ens_with_flash_attention_on_the_gpu_matches_eager(
    logs, strict_fp32, record_property
):
    """The published sizes with anemoi's default attention, flash-attn's sliding
    window (the wheel of ``.ci/build-flash-attn.sh`` on the zoo's GPU machine): the
    processor one graph through flash-attn's operator, no break, eager's answer."""
    from earth2studio_compile.tools.zoo.aifs import aifs2ens_flash

    _published_matches_eager(aifs2ens_flash(), logs, record_property)
