"""Which submodules of one model instance compile (earth2studio_compile.planning):
:func:`plan` from the table's entry, the generic path for a class the table does
not list or does not describe, the user's own ``regions=``; :func:`resolve`'s
dotted paths and :func:`table_patches`.

The table itself (every shipped model listed, each entry's reason, its published
copy) is test_models.py's.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from earth2studio_compile import MODEL_TABLE, ModelSpec, plan, register_model
from earth2studio_compile.patches import MethodPatch
from earth2studio_compile.planning import Plan, generic_spec, resolve, table_patches
from earth2studio_compile.tools import zoo


@pytest.mark.parametrize(
    "name, regions",
    [("fcn", ["model"]), ("dlwp", ["model"]), ("persistence", []), ("toy", ["model"])],
)
def test_plan_for_built_models(name, regions):
    model = zoo.build(name)
    p = plan(model)
    assert [path for path, _ in p.targets] == regions
    assert (p.reason is None) == bool(regions)
    assert p.source == ("generic" if name == "toy" else "table")


def test_excluded_transforms_stay_out_of_every_region():
    # exclude splits the region: its largest subtrees without the classes compile.
    model = zoo.build("sfno")
    key = f"{type(model).__module__}.{type(model).__qualname__}"
    saved = MODEL_TABLE[key]
    try:
        register_model(
            type(model), regions=("model",), exclude=("RealSHT", "InverseRealSHT")
        )
        p = plan(model)
    finally:
        MODEL_TABLE[key] = saved
    assert len(p.targets) > 1
    for _, module in p.targets:
        names = {type(m).__name__ for m in module.modules()}
        assert not names & {"RealSHT", "InverseRealSHT"}
    # and the SHTs do exist in the model, so the exclusion did something
    assert any(type(m).__name__ == "RealSHT" for m in model.modules())


def test_generic_path():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.big = torch.nn.Linear(64, 64)
            self.small = torch.nn.Linear(2, 2)

    assert generic_spec(Holder()).regions == ("big",)

    class Even(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    # a ModuleList is never called; its elements are
    assert generic_spec(Even()).regions == ("blocks.0", "blocks.1")
    assert "nothing to compile" in generic_spec(torch.nn.Module()).reason
    assert "not a torch.nn.Module" in generic_spec(object()).reason


def test_wrapped_models_use_their_own_entries():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.px_model = zoo.build("fcn")
            self.dx_model = torch.nn.ModuleList([zoo.build("toy")])

    key = f"{Wrapper.__module__}.{Wrapper.__qualname__}"
    try:
        register_model(Wrapper, wrapped=("px_model", "dx_model.*"))
        assert [p for p, _ in plan(Wrapper()).targets] == [
            "px_model.model",
            "dx_model.0.model",
        ]
    finally:
        MODEL_TABLE.pop(key, None)


def test_missing_table_region_is_a_reason_not_a_crash():
    class Renamed(torch.nn.Module):
        pass

    key = f"{Renamed.__module__}.{Renamed.__qualname__}"
    try:
        register_model(Renamed, regions=("model",))
        assert "no nn.Module found at model" in plan(Renamed()).reason
    finally:
        MODEL_TABLE.pop(key, None)


def test_module_compiled_by_the_model_itself_is_left_alone():
    model = zoo.build("toy")
    model.model = torch.compile(model.model)  # an OptimizedModule swap
    assert plan(model).reason and "already compiled" in plan(model).reason


def test_subclass_adding_a_network_is_not_described_by_its_base_entry():
    from earth2studio.models.px import Persistence

    class LearnedPersistence(Persistence):
        def __init__(self) -> None:
            grid = zoo.Grid(8, 16)
            super().__init__(["t2m"], OrderedDict(lat=grid.lat, lon=grid.lon))
            self.net = torch.nn.Linear(4, 4)

    p = plan(LearnedPersistence())
    assert p.source == "generic" and [path for path, _ in p.targets] == ["net"]
    assert "subclass of Persistence" in p.spec.note
    # A subclass that only overrides coordinates is still what its entry describes.
    fcn = zoo.build("fcn")
    assert type(fcn) is not type(fcn).__mro__[1] and plan(fcn).source == "table"
    assert plan(zoo.build("persistence")).reason.startswith("no network")


def test_a_model_with_lazy_parameters_waits_for_its_first_eager_call():
    class Lazy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.LazyLinear(4)

    spec = generic_spec(Lazy())
    assert not spec.regions and "uninitialized lazy parameters (net." in spec.reason


def test_the_plan_says_why_nothing_compiles():
    net = torch.nn.Linear(2, 2)
    spec = ModelSpec(regions=("net",))
    assert Plan("M", (("net", net),), spec, "user").reason is None
    said = ModelSpec(reason="runs through an external engine")
    assert Plan("M", (), said, "table").reason == "runs through an external engine"
    silent = ModelSpec(wrapped=("inner",))
    assert Plan("M", (), silent, "table").reason == "no compilable submodule found"


class _Stepper:
    """Not a module: cores reachable through a plain holder (ACE's stepper)."""

    def __init__(self) -> None:
        self.modules = [torch.nn.Linear(2, 2), torch.nn.Linear(3, 3)]

    @property
    def broken(self) -> torch.nn.Module:
        raise RuntimeError("not set up yet")


def test_resolve_follows_dotted_paths_through_modules_lists_and_holders():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
            )
            self.stepper = _Stepper()
            self.nothing = None

    m = Model()
    assert resolve(m, "blocks.*") == [
        ("blocks.0", m.blocks[0]),
        ("blocks.1", m.blocks[1]),
    ]
    assert resolve(m, "blocks.1") == [("blocks.1", m.blocks[1])]
    found = resolve(m, "stepper.modules.*")
    assert found == [
        ("stepper.modules.0", m.stepper.modules[0]),
        ("stepper.modules.1", m.stepper.modules[1]),
    ]
    # Absent, None, a property that raises, a star over a plain object: nothing.
    for path in ("missing", "blocks.2", "nothing", "stepper.broken", "stepper.*"):
        assert resolve(m, path) == [], path


def test_table_patches_follow_the_entry_and_the_models_it_wraps():
    def steady(self):
        return 1

    outer_patch = MethodPatch("step", steady, source="0" * 16)
    inner_patch = MethodPatch("zenith", steady, source="1" * 16)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inners = torch.nn.ModuleList([Inner(), Inner()])

    keys = [f"{c.__module__}.{c.__qualname__}" for c in (Inner, Outer)]
    try:
        register_model(Inner, regions=("net",), patches=(inner_patch,))
        register_model(Outer, wrapped=("inners.*",), patches=(outer_patch,))
        model = Outer()
        found = table_patches(model)
        assert [(o, p.name) for o, p in found] == [
            (model, "step"),
            (model.inners[0], "zenith"),
            (model.inners[1], "zenith"),
        ]
        assert table_patches(model.inners[0]) == [(model.inners[0], inner_patch)]
    finally:
        for key in keys:
            MODEL_TABLE.pop(key, None)
    assert table_patches(Outer()) == []  # not in the table: nothing to patch
