"""The model table (earth2studio_compile.models): every shipped model has an entry
that compiles something or says why, entries found through base classes, and its
published copy is current. What plan() makes of an entry is test_planning.py's."""

from __future__ import annotations

import inspect

import pytest
import torch

from earth2studio_compile import MODEL_TABLE, plan, register_model
from earth2studio_compile.models import TORCH_HARMONICS_SFNO, lookup
from earth2studio_compile.options import CompileOptions, CompilePolicy
from earth2studio_compile.spec import unused_arguments
from earth2studio_compile.tools import zoo


def _prognostic_classes() -> list[type]:
    import earth2studio.models.px as px
    from earth2studio.models.px.utils import PrognosticMixin

    return [
        obj
        for _, obj in vars(px).items()
        if inspect.isclass(obj) and issubclass(obj, PrognosticMixin)
    ]


def test_table_covers_every_shipped_prognostic():
    classes = _prognostic_classes()
    assert len(classes) > 30  # the import really found Earth2Studio's models
    missing = [c.__name__ for c in classes if lookup(c) is None]
    assert not missing, f"add these to MODEL_TABLE: {missing}"


def test_every_entry_compiles_something_or_says_why():
    for key, spec in MODEL_TABLE.items():
        assert spec.regions or spec.wrapped or spec.reason, key
        if spec.reason:
            assert not spec.regions, f"{key}: a reason and regions contradict"
            assert len(spec.reason) > 20, f"{key}: say why, for the user"


@pytest.mark.parametrize("name", ["Pangu6", "FuXi", "FengWu"])
def test_onnx_models_stay_eager_with_reason(name):
    import earth2studio.models.px as px

    assert "ONNX" in lookup(getattr(px, name))[1].reason


@pytest.mark.parametrize("name", ["GraphCastSmall", "GenCastMini"])
def test_jax_models_stay_eager_with_reason(name):
    import earth2studio.models.px as px

    assert "JAX" in lookup(getattr(px, name))[1].reason


def test_subclass_inherits_table_entry():
    # zoo's small FCN is a subclass of earth2studio's FCN with a smaller grid.
    model = zoo.build("fcn")
    assert type(model).__name__ != "FCN"
    assert lookup(model)[0] == "earth2studio.models.px.fcn.FCN"


def test_sfno_compiles_whole_with_spectral_convolutions_opaque():
    p = plan(zoo.build("sfno"))
    assert [path for path, _ in p.targets] == ["model"]
    assert p.spec.opaque == ("SpectralConvS2",)


def test_stormcast_unets_keep_their_layout_and_their_cuda_graphs():
    import earth2studio.models.px as px

    spec = lookup(px.StormCast)[1]
    policy = CompilePolicy.resolve(CompileOptions(), torch.device("cuda"), spec)
    options = policy.torch_kwargs()["options"]
    assert options["layout_optimization"] is False
    assert options["triton.cudagraphs"] is True
    # The user's own choice still replaces the table's.
    mine = CompilePolicy.resolve(
        CompileOptions(mode="default"), torch.device("cuda"), spec
    )
    assert "options" not in mine.torch_kwargs()


def test_makani_networks_keep_the_layout_of_their_1x1_convolutions():
    spec = MODEL_TABLE["earth2studio.models.px.fcn3.FCN3"]
    policy = CompilePolicy.resolve(CompileOptions(), torch.device("cuda"), spec)
    options = policy.torch_kwargs()["options"]
    assert options["layout_optimization"] is False
    # Not as matrix multiplies: slower than cuDNN's 1x1 convolutions under bf16.
    assert "conv_1x1_as_mm" not in options


def test_aurora_stages_read_their_rollout_step_only_through_lora():
    import earth2studio.models.px as px

    spec = lookup(px.Aurora)[1]
    assert unused_arguments(spec, torch.nn.Identity()) == ("rollout_step",)
    aurora = pytest.importorskip("aurora.model.lora", reason="needs microsoft-aurora")
    lora = aurora.LoRARollout(4, 4, 2, 2, 0.0, 4, "all")
    assert unused_arguments(spec, torch.nn.Sequential(lora)) == ()


def test_register_and_override():
    class Mine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(64, 64)

    key = f"{Mine.__module__}.{Mine.__qualname__}"
    try:
        register_model(Mine, regions=("a",))
        assert [p for p, _ in plan(Mine()).targets] == ["a"]
        register_model(Mine, reason="runs through an external engine")
        assert plan(Mine()).reason == "runs through an external engine"
    finally:
        MODEL_TABLE.pop(key, None)
    assert [p for p, _ in plan(Mine(), regions=("b",)).targets] == ["b"]
    with pytest.raises(ValueError, match="no nn.Module at 'c'"):
        plan(Mine(), regions=("c",))


def test_published_table_is_current():
    from pathlib import Path

    from earth2studio_compile.models import table_markdown

    doc = (Path(__file__).parents[1] / "docs" / "models.md").read_text()
    assert table_markdown() in doc, "regenerate docs/models.md (see its header)"


def test_zoo_sfno_takes_the_public_torch_harmonics_spec():
    # The table names the zoo's class by string; a rename would leave the entry dead.
    cls = zoo.SFNOPrognostic
    assert lookup(cls) == (f"{cls.__module__}.{cls.__qualname__}", TORCH_HARMONICS_SFNO)
    from earth2studio_compile.models import shipped_entries, table_markdown

    assert "SFNOPrognostic" not in table_markdown()  # published: Earth2Studio's only
    shipped = shipped_entries()
    assert all(k.startswith("earth2studio.models.px.") for k in shipped)
    rows = [r.split("|")[1].strip() for r in table_markdown().splitlines()[2:]]
    assert rows == [k.rsplit(".", 1)[-1] for k in shipped]  # the table's order


_IMPORT_TOOLS = """
import importlib, json, pkgutil
from earth2studio_compile.models import MODEL_TABLE

before = dict(MODEL_TABLE)
import earth2studio_compile.tools as tools

names = [m.name for m in pkgutil.walk_packages(tools.__path__, tools.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({
    "imported": names,
    "added": sorted(MODEL_TABLE.keys() - before.keys()),
    "removed": sorted(before.keys() - MODEL_TABLE.keys()),
    "replaced": sorted(k for k in before.keys() & MODEL_TABLE.keys()
                       if MODEL_TABLE[k] is not before[k]),
}))
"""


def test_importing_the_tools_leaves_the_model_table_alone():
    # A fresh process: this one imported the zoo long ago.
    import json
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_TOOLS],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    tools = ("zoo", "demo", "bench", "bench.__main__", "bench.measure", "bench.e2e")
    for name in tools:
        assert f"earth2studio_compile.tools.{name}" in out["imported"]
    assert (out["added"], out["removed"], out["replaced"]) == ([], [], [])
