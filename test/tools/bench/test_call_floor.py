"""The workflow mode's floors (earth2studio_compile.tools.bench.call_floor); the
``floor`` kind end to end is in test_calls.py."""

from __future__ import annotations


def test_the_store_holds_every_written_variable_of_every_member_and_lead_time():
    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.call_floor import store_bytes

    model = zoo.build("fcn", size="small")
    spec = {"workflow": "ensemble", "members": 3, "steps": 2}
    # 3 members x 3 lead times (the initial state too) x 26 variables x 16 x 32
    assert store_bytes(spec, model) == 4 * 3 * 3 * 26 * 16 * 32
    one = {"workflow": "deterministic", "members": 3, "steps": 2}
    assert store_bytes(one, model) == 4 * 1 * 3 * 26 * 16 * 32
    # "few": three of them
    assert store_bytes(spec | {"outputs": "few"}, model) == 4 * 3 * 3 * 3 * 16 * 32
