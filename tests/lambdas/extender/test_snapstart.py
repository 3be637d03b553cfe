"""SnapStart: the extender's hooks, run as Lambda runs them (``snapshot_restore_py``'s registry: before the
snapshot last-registered first, after a restore in order), with the snapshot in moto S3 and a fork as
the restore."""

from __future__ import annotations

import json
import time

import pytest
import snapshot_restore_py as hooks

from tests.conftest import make_nodes, make_pod
from tests.lambdas.extender.test_handler import Invoker, aws, load_handler, put_snapshot

pytestmark = pytest.mark.server  # the Lambda handler over moto

__all__ = ["aws", "load_handler"]  # the fixtures, shared with the handler's tests


def _registered(before: int, after: int) -> tuple[list, list]:
    """The hooks the handler import just registered (a reload registers them again)."""
    return hooks.get_before_snapshot()[before:], hooks.get_after_restore()[after:]


def _run(entries: list) -> None:
    for func, args, kwargs in entries:
        func(*args, **kwargs)


def test_a_restore_serves_the_snapshot_written_since_through_new_clients_and_the_warm_up_left_no_trace(
    aws, load_handler, capsys
) -> None:
    put_snapshot(aws, make_nodes("A100", "H100"), generated_at=time.time() - 30)
    counts = len(hooks.get_before_snapshot()), len(hooks.get_after_restore())
    handler = load_handler()
    before, after = _registered(*counts)
    assert [f for f, _, _ in after] == [handler.SERVICE.after_restore]
    assert handler.SERVICE.before_snapshot in [f for f, _, _ in before] and len(before) == 2

    _run(reversed(before))
    assert handler.SERVICE.before_snapshot()  # it decided on the snapshot it read
    assert handler.EXTENDER.readings.pending(None, assumed=True) == []  # the warm-up assumed nothing
    assert "FilterLatencyMs" not in capsys.readouterr().out  # and recorded no decision

    # Later, a restore: the refresher has written another snapshot since.
    old_client = handler.SERVICE.source.store.client
    put_snapshot(aws, make_nodes("A100", "H100", "L40S"))
    _run(after)
    assert handler.SERVICE.source.store.client is not old_client
    pod = make_pod("p", gpus=1)
    status, body = Invoker(handler, capsys)(
        "POST", "/filter", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["a100-0", "h100-1", "l40s-2"]})
    )
    # Served from the new snapshot at once (refreshing on its own schedule, it would have kept the old
    # one, and the new node would be unknown).
    assert status == 200 and body["Error"] == "" and "l40s-2" in body["NodeNames"], body


def test_each_restored_environment_draws_its_own_random_numbers(aws, load_handler) -> None:
    """A restore brings back the process's memory as the snapshot had it, the random generator's state
    included (no fork happens, so nothing reseeds it): stood in for by restoring that state."""
    import random

    put_snapshot(aws, make_nodes("A100"))
    counts = len(hooks.get_before_snapshot()), len(hooks.get_after_restore())
    handler = load_handler()
    before, after = _registered(*counts)
    _run(reversed(before))
    snapshot = random.getstate()

    def restored_draw(run_hooks: bool) -> float:
        random.setstate(snapshot)
        if run_hooks:
            _run(after)
        return random.random()

    # Without the hooks every environment restored from one snapshot repeats the same draws.
    assert restored_draw(False) == restored_draw(False)
    assert restored_draw(True) != restored_draw(True)
    assert handler.SERVICE.source.store.client is not None
