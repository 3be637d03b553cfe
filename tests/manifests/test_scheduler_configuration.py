"""The second scheduler's KubeSchedulerConfiguration (``manifests/scheduler_configuration.py``): the profile
and the extender entries, field by field, and every extender field one the real kube-scheduler knows."""

from __future__ import annotations

import re
from typing import Any

import pytest

from manifests.reservation import UUID_WAIT_S
from manifests.scheduler_configuration import scheduler_configuration
from manifests.scheduler_options import SchedulerOptions
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.mig import known_mig_resources
from scheduler_core.k8s.names import MILLI_RESOURCE
from shares.binder import BIND_BUDGET_S
from tests.conftest import SCHEDULER_FIXTURES

URL = "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com/v1"
CAPTURED_LOG = SCHEDULER_FIXTURES / "configs" / "creating-extender-log-lines.txt"


def test_configuration_has_the_fields_the_issue_fixes() -> None:
    config = scheduler_configuration(SchedulerOptions(extender_url=URL + "/"))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gpu-scheduler"
    # Ties the extender leaves go to the fullest node, GPUs included: packing, not spreading. The GPUs
    # weigh no more than CPU and memory, or the packing outvotes the extender's ranking.
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    assert fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in fit["args"]["scoringStrategy"]["resources"]}
    assert weights == {"cpu": 1, "memory": 1, "nvidia.com/gpu": 1}
    assert config["percentageOfNodesToScore"] == 100
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceName"] == "gpu-scheduler"
    # The default client rate limit (50/100) caps binds at about 50 pods/s (DESIGN section 8).
    assert config["clientConnection"] == {"qps": 100, "burst": 200}
    (extender,) = config["extenders"]
    assert extender == {
        "urlPrefix": URL,  # trailing slash dropped: kube-scheduler appends "/filter"
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 5,
        "enableHTTPS": True,
        "httpTimeout": "3s",
        "nodeCacheCapable": True,
        "ignorable": False,
    }
    # No managedResources: the extender is called for every pod of the profile, CPU-only ones too.
    assert "managedResources" not in extender


def test_a_loopback_sidecar_url_turns_https_off_and_any_other_plain_url_is_refused() -> None:
    (extender,) = scheduler_configuration(SchedulerOptions(extender_url="http://127.0.0.1:8888"))["extenders"]
    assert extender["enableHTTPS"] is False and extender["urlPrefix"] == "http://127.0.0.1:8888"
    with pytest.raises(ConfigError, match="http:// on loopback"):
        SchedulerOptions(extender_url="http://10.0.3.7:8888").validated()


def test_full_nodes_and_the_plain_profile_are_options() -> None:
    config = scheduler_configuration(SchedulerOptions(extender_url=URL, node_cache_capable=False, bin_pack=False))
    assert config["extenders"][0]["nodeCacheCapable"] is False
    assert config["profiles"] == [{"schedulerName": "gpu-scheduler"}]


def _fit_args(config: dict[str, Any]) -> dict[str, Any]:
    (profile,) = config["profiles"]
    found = [c["args"] for c in profile.get("pluginConfig", []) if c["name"] == "NodeResourcesFit"]
    return found[0] if found else {}


def test_sharing_adds_bind_preempt_and_the_milli_resource_ignored_by_the_scheduler() -> None:
    config = scheduler_configuration(
        SchedulerOptions(extender_url=URL, sharing=True, weight=9, reservation_image="none")
    )
    (extender,) = config["extenders"]
    assert extender["bindVerb"] == "bind" and extender["preemptVerb"] == "preempt"
    assert extender["weight"] == 9
    # The extender accounts shares: kube-scheduler's NodeResourcesFit must not (nodes never advertise it).
    assert _fit_args(config)["ignoredResources"] == [MILLI_RESOURCE]
    assert "managedResources" not in extender


def test_with_reservation_pods_the_bind_has_its_own_entry_and_timeout() -> None:
    """The bind of a GPU's first share waits for its reservation pod's UUID: longer than filter's 3 s."""
    config = scheduler_configuration(SchedulerOptions(extender_url=URL, sharing=True, gpu_pods_only=True))
    main, binder = config["extenders"]
    assert "bindVerb" not in main and main["preemptVerb"] == "preempt" and main["httpTimeout"] == "3s"
    assert binder["bindVerb"] == "bind" and binder["urlPrefix"] == main["urlPrefix"]
    assert set(binder) & {"filterVerb", "prioritizeVerb", "preemptVerb", "weight"} == set()
    assert binder["managedResources"] == main["managedResources"] and binder["ignorable"] is False
    # It covers the bind's own budget and the UUID wait.
    assert binder["httpTimeout"] == "15s" and BIND_BUDGET_S + UUID_WAIT_S < 15


def test_gpu_pods_only_restores_the_managed_resources() -> None:
    """managedResources matches exact names: every MIG profile the product knows is listed, counted by
    kube-scheduler, with the H200's all-balanced layout among them."""
    config = scheduler_configuration(SchedulerOptions(extender_url=URL, sharing=True, gpu_pods_only=True))
    managed = config["extenders"][0]["managedResources"]
    mig = [{"name": name, "ignoredByScheduler": False} for name in known_mig_resources()]
    assert managed == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}, *mig,
                       {"name": MILLI_RESOURCE, "ignoredByScheduler": True}]  # fmt: skip
    names = {entry["name"] for entry in managed}
    assert {"nvidia.com/mig-1g.18gb", "nvidia.com/mig-2g.35gb", "nvidia.com/mig-3g.71gb"} <= names
    assert "nvidia.com/mig-1g.10gb.me" in names and len(mig) == len(names) - 2
    assert "ignoredResources" not in _fit_args(config)  # ignoredByScheduler says it
    whole = scheduler_configuration(SchedulerOptions(extender_url=URL, gpu_pods_only=True))["extenders"][0]
    assert whole["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}, *mig]


def test_without_sharing_the_milli_resource_stays_counted_by_the_scheduler() -> None:
    config = scheduler_configuration(SchedulerOptions(extender_url=URL))
    assert "ignoredResources" not in _fit_args(config)
    assert "bindVerb" not in config["extenders"][0]


def _go_field(name: str) -> str:
    """``urlPrefix`` -> ``URLPrefix``, ``enableHTTPS`` -> ``EnableHTTPS``: the Go names the log prints."""
    return {"urlPrefix": "URLPrefix", "httpTimeout": "HTTPTimeout"}.get(name, name[0].upper() + name[1:])


@pytest.mark.skipif(not CAPTURED_LOG.is_file(), reason=f"{CAPTURED_LOG} is absent")
def test_every_extender_field_is_one_the_real_scheduler_prints() -> None:
    """kube-scheduler decodes its configuration strictly: an unknown field stops it (the captured
    c2x run). The fields it knows are the ones its "Creating extender" line prints."""
    line = CAPTURED_LOG.read_text().splitlines()[0]
    known = set(re.findall(r"[{ ]([A-Z][A-Za-z]+):", line.split("extender=", 1)[1])) - {"Duration", "Name"}
    for extender in scheduler_configuration(SchedulerOptions(extender_url=URL, sharing=True))["extenders"]:
        assert {_go_field(k) for k in extender} <= known
    assert {"URLPrefix", "NodeCacheCapable", "ManagedResources", "Ignorable", "HTTPTimeout"} <= known
