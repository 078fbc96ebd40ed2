"""What executors measure and how the region records it (measured.py)."""

from __future__ import annotations

from conftest import messages

from earth2studio_compile.measured import Measured, record
from earth2studio_compile.report import RegionReport


def test_record_copies_what_a_call_measured_and_warns_once_per_kind(logs):
    """Executors only measure; the region records into its report and warns once
    per kind, CUDA-graph skips (which need a GPU) included."""
    r = RegionReport("M", "core", mode="inductor/reduce-overhead", calls=4)
    first = Measured(
        artifact="saved", cache="cold", cache_source="ours", graphs=3, cudagraph_skips=2
    )
    record(r, first, first=True)
    record(r, Measured(graphs=1, seconds=0.5, cudagraph_skips=1), first=False)
    record(r, Measured(graphs=0, cudagraph_skips=0), first=False)
    record(r, Measured(background="built in 3.0 s", switch_seconds=1.25), False)
    assert (r.artifact, r.cache, r.cache_source) == ("saved", "cold", "ours")
    assert (r.graphs, r.graph_breaks, r.cudagraph_skips) == (3, 2, 3)
    assert r.recompiles == 1 and r.compile_seconds == 0.5
    assert r.phases == {"switch": 1.25}
    assert r.background == (
        "built in 3.0 s; compiled from step 4 on (switched in 1.25 s, verified "
        "against eager)"
    )
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 2
    assert "2 graph break(s)" in warnings[0] and "skipped CUDA graphs" in warnings[1]
    assert messages(logs, "INFO") == [
        "M.core recompiled (1 so far, 0.5 s). Set TORCH_LOGS='recompiles' to see why.",
        f"M.core: {r.background}",
    ]
