"""The claims the README and docs/ make that a test can check, equal to the code: the security page's limits,
which pods reach the extender, the tie rule, timeouts and budgets, the settings' defaults and the
deletion-cost ranges. (``tests/test_docs.py`` keeps the pages true to the tree.)"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import zlib

import pytest

from tests.conftest import REPO
from tests.test_docs import DOCS, PAGES
from tools import docs as tools_docs


def test_the_security_pages_limits_are_the_codes() -> None:
    """docs/security.md promises limits a reviewer will hold the code to: each figure it gives is the
    constant the code uses."""
    from scheduler_core.k8s import annotations, pods, quantity
    from scheduler_core.state.readings import ASSUMED_TTL_S, MAX_ASSUMED

    text = " ".join((DOCS / "security.md").read_text().split())
    promised = [
        f"at most {MAX_ASSUMED:,} of them",
        f"each dropped {ASSUMED_TTL_S:g} s after it was made",
        f"`gpu-scheduler.io/peers`: at most {annotations.MAX_PEERS_CHARS:,} characters",
        f"JSON nested at most {annotations.MAX_PEERS_JSON_DEPTH} deep",
        f"at most {annotations.MAX_PEERS} peers",
        f"weights of at most {annotations.MAX_WEIGHT_CHARS} ASCII characters",
        f"`gpu-scheduler.io/assigned-gpus`: at most {annotations.MAX_ASSIGNED_GPUS_CHARS:,} characters",
        f"`gpu.nvidia.com/model`: at most {pods.MAX_MODELS_CHARS:,} characters",
        f"`gpu.nvidia.com/memory` and every resource quantity: at most {quantity.MAX_QUANTITY_CHARS} characters",
    ]
    assert pods.MAX_MEMORY_CHARS == quantity.MAX_QUANTITY_CHARS  # the page gives them as one figure
    assert [phrase for phrase in promised if phrase not in text] == []


def _flat(page: str) -> str:
    """The text of ``docs/<page>`` (or README.md) with every run of whitespace one space, so that a claim
    may wrap."""
    return " ".join((REPO / page if page == "README.md" else DOCS / page).read_text().split())


def test_the_pages_say_which_pods_reach_the_extender_as_the_generated_configuration_does() -> None:
    """Without ``managedResources`` kube-scheduler sends the extender every pod of the profile; the pages
    say so exactly where the generated configuration lists none, and name what it lists and ignores."""
    from manifests.scheduler_configuration import extender_entry, profile
    from manifests.scheduler_options import SchedulerOptions
    from scheduler_core.k8s.names import MILLI_RESOURCE

    url = tools_docs.EXAMPLE_EXTENDER_URL
    default = extender_entry(SchedulerOptions(extender_url=url))
    every_pod = "managedResources" not in default
    every_pod_claims = {
        "architecture.md": "it calls the extender for every pod of the profile",
        "extender-protocol.md": "The default configuration lists no `managedResources`, so kube-scheduler calls "
        "the extender for every pod of the profile",
        "scheduling.md": "the generated profile lists no `managedResources`, so kube-scheduler calls it for every "
        "pod it schedules",
        "operations.md": "CPU-only ones included, since the generated profile sends it every pod",
        "README.md": "**Every pod of the profile** reaches the extender, CPU-only ones included",
    }
    assert {page: claim in _flat(page) for page, claim in every_pod_claims.items()} == dict.fromkeys(
        every_pod_claims, every_pod
    )
    stale = "calls the extender for the pods that request `nvidia.com/gpu`"
    assert [page for page in every_pod_claims if every_pod and stale in _flat(page)] == []

    # --gpu-pods-only with sharing: the milli resource is listed, and kube-scheduler ignores it or not.
    listed = extender_entry(SchedulerOptions(extender_url=url, sharing=True, gpu_pods_only=True))["managedResources"]
    milli = next(r for r in listed if r["name"] == MILLI_RESOURCE)
    assert f"`ignoredByScheduler: {str(milli['ignoredByScheduler']).lower()}` with `--gpu-pods-only`" in _flat(
        "sharing.md"
    )
    # Sharing without --gpu-pods-only: NodeResourcesFit's ignoredResources.
    fit = next(c["args"] for c in profile(SchedulerOptions(extender_url=url, sharing=True))["pluginConfig"])
    ignored = f"`ignoredResources: [{', '.join(fit['ignoredResources'])}]`"
    assert f"NodeResourcesFit's {ignored}" in _flat("extender-protocol.md")
    assert f"{ignored} on NodeResourcesFit when sharing is on" in _flat("scheduling.md")
    ignorable = str(default["ignorable"]).lower()
    assert f"(`ignorable: {ignorable}`)" in _flat("operations.md")
    assert ("The extender is not `ignorable`" in _flat("architecture.md")) == (ignorable == "false")


def _prioritize_on_nodes_alike(names: list[str], requests: dict[str, str]) -> dict[str, int]:
    """The extender's prioritize scores for a pod with ``requests`` over identical empty 8-GPU nodes, sent
    as full Node objects (no cluster state: every node counts as empty)."""
    from scheduler_core.extender.facade import Extender

    labels = {"gpu.nvidia.com/model": "A100", "gpu.nvidia.com/memory": "40960", "gpu.nvidia.com/count": "8"}
    allocatable = {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    nodes = [{"metadata": {"name": n, "labels": labels}, "status": {"allocatable": allocatable}} for n in names]
    container = {"name": "main", "resources": {"limits": requests}}
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [container]},
    }
    status, reply = Extender().handle("prioritize", json.dumps({"Pod": pod, "Nodes": {"items": nodes}}).encode())
    assert status == 200, reply
    return {entry["Host"]: entry["Score"] for entry in json.loads(reply)}


@pytest.mark.parametrize(
    "requests", [{"nvidia.com/gpu": "1"}, {"gpu-scheduler.io/gpu-milli": "500"}], ids=["whole GPU", "share"]
)
def test_the_tie_rule_the_scheduling_page_states_is_what_prioritize_does(requests: dict[str, str]) -> None:
    """Nodes that score alike: the page names who keeps the top score (by the CRC-32 of the node names,
    ``NodeTable.tie_rank``) and what the others get, and both are read from a real prioritize."""
    names = ["gpu-node-a", "gpu-node-b", "gpu-node-c", "gpu-node-d", "gpu-node-e"]
    scores = _prioritize_on_nodes_alike(names, requests)
    top = max(scores.values())
    winners = [name for name in names if scores[name] == top]
    crc = {name: zlib.crc32(name.encode()) for name in names}
    rank = {min(names, key=crc.__getitem__): "lowest", max(names, key=crc.__getitem__): "highest"}
    others = {scores[name] for name in names if name not in winners}
    text = _flat("scheduling.md")
    if len(winners) == 1 and len(others) == 1:
        (other,) = others
        drop = {1: "one", 2: "two"}.get(top - other, str(top - other))
        claims = [
            f"When two or more nodes reach {top}, the one whose name has the {rank.get(winners[0], '?')} CRC-32 "
            f"(`NodeTable.tie_rank`) keeps {top} and every other node above 1 drops {drop} point",
            f"When every node has the same raw score above 0, one node gets {top} and every other node {other}",
        ]
    else:  # the tie left to kube-scheduler: the page would have to say that instead
        claims = [f"When every node has the same raw score above 0, every node gets {top}"]
    assert [claim for claim in claims if claim not in text] == []


def test_every_httptimeout_the_pages_state_is_the_generated_one() -> None:
    """Each ``httpTimeout`` given with a number is the generated configuration's; DESIGN's 5 s is cited only
    beside it; and the figures sized to it say so truly."""
    from manifests.scheduler_options import SchedulerOptions
    from scheduler_core.state.readings import ASSUMED_TTL_S

    http_s = SchedulerOptions(extender_url=tools_docs.EXAMPLE_EXTENDER_URL).http_timeout_s
    forms = [
        re.compile(r"`httpTimeout`\)? (?:is|of) (\d+(?:\.\d+)?) s\b"),
        re.compile(r"\b(\d+(?:\.\d+)?) s `httpTimeout`"),
        re.compile(r"the generated configuration sets (\d+(?:\.\d+)?) s\b"),
    ]
    stated = [
        (page.name, value)
        for page in PAGES
        for form in forms
        for value in form.findall(" ".join(page.read_text().split()))
    ]
    assert len(stated) >= 4, stated
    assert [(page, value) for page, value in stated if float(value) != http_s] == []
    for page in PAGES:
        text = " ".join(page.read_text().split())
        if re.search(r"DESIGN[^.]*`httpTimeout`", text):
            assert f"the generated configuration sets {http_s:g} s" in text, page.name
    if "(the generated `httpTimeout`)" in _flat("security.md"):
        assert http_s == ASSUMED_TTL_S


def test_every_timeout_and_budget_the_pages_state_is_the_codes() -> None:
    from application.extender.service import LIVE_MARGIN_S, SYNC_TIMEOUT_S
    from scheduler_core.extender.facade import CATCH_UP_S
    from scheduler_core.state.readings import ASSUMED_TTL_S, DEFAULT_MARGIN_S
    from shares.binder import BIND_BUDGET_S, BIND_DYNAMODB, BINDING_RESERVE_S, CONFIRM_S, LedgerBinder

    ledger_s = inspect.signature(LedgerBinder).parameters["ledger_budget_s"].default
    connect, read = BIND_DYNAMODB["connect_timeout"], BIND_DYNAMODB["read_timeout"]
    attempts = BIND_DYNAMODB["retries"]["max_attempts"]
    promised = {
        "sharing.md": [
            f"The whole bind has {BIND_BUDGET_S:g} s for its Kubernetes calls",
            f"the ledger's part of the bind's budget ({ledger_s:g} s, inside",
            f"{connect:g} s to connect, {read:g} s to read, {attempts} attempts",
            f"with {CONFIRM_S:g} s past the bind's budget for it",
            f"keeping {BINDING_RESERVE_S:g} s for the Binding",
            f"waits up to {CATCH_UP_S:g} s for the live state",
            f"lingered for `margin_s` ({LIVE_MARGIN_S:g} s)",
            f"less {DEFAULT_MARGIN_S:g} s for the refresher's listing",
        ],
        "operations.md": [
            f"({connect:g} s connect, {read:g} s read, {attempts} attempts)",
            f"`serve` waits up to {SYNC_TIMEOUT_S:g} s for its first lists",
        ],
        "security.md": [f"can move scores for those {ASSUMED_TTL_S:g} s"],
    }
    missing = {page: [phrase for phrase in phrases if phrase not in _flat(page)] for page, phrases in promised.items()}
    assert missing == {page: [] for page in promised}


def _setting_defaults() -> dict[str, float]:
    """Every numeric setting of the three Lambdas, by environment variable, at its declared default."""
    from application.deletion_cost.settings import DeletionCostSettings
    from application.extender.settings import ExtenderSettings
    from application.node_state.settings import NodeStateSettings

    found = {}
    for cls in (ExtenderSettings, NodeStateSettings, DeletionCostSettings):
        for f in dataclasses.fields(cls):
            if "env" in f.metadata and isinstance(f.default, int | float) and not isinstance(f.default, bool):
                found[f.metadata["env"]] = float(f.default)
    return found


SETTING_WITH_VALUE = [
    re.compile(r"`([A-Z][A-Z0-9_]+)` \((\d+(?:\.\d+)?)(?: s)?\)"),  # `PASSES` (2), `INTERVAL_S` (30 s)
    re.compile(r"\(`([A-Z][A-Z0-9_]+)`, (\d+(?:\.\d+)?) s\)"),  # (`MAX_SNAPSHOT_AGE_S`, 180 s)
]


def stated_settings(text: str) -> list[tuple[str, float]]:
    """Each ``(VARIABLE, value)`` that ``text`` gives as a setting's value, in the two forms the pages use."""
    flat = " ".join(text.split())
    return [(name, float(value)) for form in SETTING_WITH_VALUE for name, value in form.findall(flat)]


def test_every_setting_value_the_pages_give_is_its_default() -> None:
    defaults = _setting_defaults()
    stated = [(page.name, name, value) for page in PAGES for name, value in stated_settings(page.read_text())]
    known = [(page, name, value) for page, name, value in stated if name in defaults]
    assert len(known) >= 5, stated
    assert [(page, name, value, defaults[name]) for page, name, value in known if value != defaults[name]] == []
    snapshot_refresh_s = defaults["SNAPSHOT_REFRESH_S"]
    assert f"(every `--refresh-s`, {snapshot_refresh_s:g} s by default)" in _flat("architecture.md")


def test_the_claim_checks_see_a_wrong_figure() -> None:
    """The forms the claim checks read, on a page that states a wrong value."""
    assert stated_settings("`PASSES` (3) passes `INTERVAL_S`\n(45 s) apart, (`MAX_SNAPSHOT_AGE_S`, 60 s)") == [
        ("PASSES", 3.0),
        ("INTERVAL_S", 45.0),
        ("MAX_SNAPSHOT_AGE_S", 60.0),
    ]


def test_the_deletion_cost_ranges_the_pages_give_are_the_codes() -> None:
    from scheduler_core.deletion_cost.policy import COST_RANGES

    ranges = {name: (low, high) for name, low, high in COST_RANGES}
    medium, high = ranges["medium"], ranges["high"]
    assert ranges["default"] == (0, 0)
    assert f"0 the default; {medium[0]}..{medium[1]} medium; {high[0]}..1000 high" in _flat("deletion-cost.md")
    assert f"`default` 0, `medium` {medium[0]}-{medium[1]}, `high` {high[0]} and above" in _flat("operations.md")
