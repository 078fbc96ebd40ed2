"""The fp32 reference of reduced precisions (earth2studio_compile.accuracy): taken
from the state before the call, run on copies, so a core that updates its inputs or
buffers in place is measured once and updated once."""

from __future__ import annotations

import torch
from conftest import eager_backend, messages
from tiny_cores import StatefulCore

from earth2studio_compile import CompileSession
from earth2studio_compile.accuracy import Reference


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("factor", torch.full((1,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * self.factor
        x.add_(1.0)  # updates its input in place
        self.factor.mul_(10.0)  # and its buffer
        return out


def test_the_reference_runs_on_the_state_before_the_call():
    core, x = _Scale(), torch.ones(4)
    reference = Reference.before(core, (x,), {})
    with torch.no_grad():
        out = core(x)  # the region's call: x and the buffer change
    assert reference.error(out, torch.device("cpu")) == 0.0
    # The reference changed neither the live input nor the live buffer again.
    torch.testing.assert_close(x, torch.full((4,), 2.0))
    torch.testing.assert_close(core.factor, torch.full((1,), 20.0))
    reference = Reference.before(core, (torch.ones(4),), {})
    assert reference.error(torch.full((4,), 22.0), torch.device("cpu")) == 0.1


def test_no_floating_output_has_no_error():
    class Argmax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.argmax(-1)

    core, x = Argmax(), torch.randn(3, 5)
    reference = Reference.before(core, (x,), {})
    assert reference.error(core(x), torch.device("cpu")) is None


def test_the_probe_does_not_update_a_stateful_core_twice():

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = StatefulCore(2)

    model = Holder()
    x, state = torch.randn(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)
    with CompileSession(model, backend=eager_backend, precision="tf32") as session:
        with torch.inference_mode():
            model.core(x, state)
    assert session.report.regions[0].precision_error is not None
    torch.testing.assert_close(state, x)  # 0 * 0.5 + x once, not twice


def test_a_stateful_core_is_measured_from_its_state_before_the_call(logs):
    class Counter(torch.nn.Module):
        """Counts its calls in a buffer; its output depends on the count."""

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return x * self.calls

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.core = Counter()

    model, x = Holder(), torch.randn(8)
    with CompileSession(
        model, regions=("core",), backend=eager_backend, precision="tf32"
    ) as session:
        with torch.no_grad():
            out = model.core(x)
    torch.testing.assert_close(out, x)
    assert model.core.calls.item() == 1  # the reference ran on a copy
    assert session.report.regions[0].precision_error == 0.0
    assert not messages(logs, "WARNING")
