"""filter and prioritize change no shared state from a request (issue #42 item 2: "Only binds change
shared state").

The review found that the extender recorded a prediction for any pod UID a request named, unread:
four filter calls for invented 999-milli pods made a real 250-milli pod fail on an empty GPU node,
invented 100,000-core pods moved a real pod's scores, and 50,004 invented CPU-only pods piled up. Each
probe goes through ``serve`` over loopback and through the Lambda handler.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import make_pod
from tests.security.conftest import World

NODES = ["t4-0", "a100-1"]


def invented(name: str, *, gpus: int = 0, milli: int = 0, cpu: str = "") -> dict[str, Any]:
    pod = make_pod(name, gpus, milli=milli)
    pod["metadata"]["uid"] = f"invented-{name}"
    if cpu:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return pod


def ask(world: World, verb: str, pod: dict[str, Any], names: list[str]) -> Any:
    status, reply = world.call(verb, json.dumps({"Pod": pod, "NodeNames": names}).encode())
    assert status == 200, reply
    return reply


def test_invented_shares_never_make_filter_refuse_a_real_one(world: World) -> None:
    for i in range(4):
        ask(world, "filter", invented(f"ghost-{i}", milli=999), ["t4-0"])
    real = ask(world, "filter", make_pod("real", 0, milli=250), ["t4-0"])
    assert real["NodeNames"] == ["t4-0"] and real["Error"] == "", real
    assert world.api_writes() == [] and world.ledger_used()["t4-0"] == 0


def test_invented_huge_pods_never_make_filter_refuse_and_leave_nothing_behind(world: World) -> None:
    before = ask(world, "filter", make_pod("real", 1), NODES)
    for i in range(50):
        ask(world, "prioritize", invented(f"giant-{i}", gpus=1, cpu="100000"), NODES)
        ask(world, "filter", invented(f"cpu-only-{i}", cpu="100000"), NODES)
    after = ask(world, "filter", make_pod("real", 1), NODES)
    assert after["NodeNames"] == before["NodeNames"] == NODES
    assert world.api_writes() == [] and set(world.ledger_used().values()) == {0}
