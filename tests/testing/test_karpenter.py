"""The test model of Karpenter's provisioning decision, against the cases of Karpenter's own tests
(``kubernetes-sigs/karpenter``: ``pkg/scheduling/requirements_test.go``,
``pkg/controllers/provisioning/scheduling/suite_test.go``) and its documented rules."""

from __future__ import annotations

import copy

import pytest

from testing.karpenter import (
    CATALOGUE,
    NodePool,
    Requirement,
    compatible,
    intersects,
    is_provisionable,
    launchable,
    pending,
    requirements,
)
from tests.conftest import make_pod

POOL = NodePool("default", ({"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},))


def cpu_pod(**spec):
    pod = make_pod("cpu", 0)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    pod["spec"].update(spec)
    return pending(pod)


def with_terms(*terms):
    return cpu_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}}})  # fmt: skip


def expr(key, operator, *values):
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("operator", "launched"),
    [("In", False), ("NotIn", True), ("Exists", False), ("DoesNotExist", True)],
)
def test_an_undefined_custom_label_blocks_in_and_exists_only(operator, launched):
    """suite_test.go: "should not schedule pods that have node selectors with undefined key" and the
    NotIn/Exists/DoesNotExist cases beside it."""
    values = ("value",) if operator in ("In", "NotIn") else ()
    assert bool(launchable(with_terms([expr("deployment", operator, *values)]), [POOL])) is launched


def test_the_error_for_an_undefined_label_and_well_known_labels_undefined():
    """requirements_test.go: "should display an error message for unknown labels"; "should be compatible
    with well-known v1 labels undefined"."""
    base = POOL.requirements()
    assert (
        compatible(base, requirements([expr("deployment", "In", "x")]))
        == 'label "deployment" does not have known values'
    )
    assert compatible(base, requirements([expr("topology.kubernetes.io/zone", "In", "us-east-1a")])) == ""
    assert compatible(base, requirements([expr("karpenter.k8s.aws/instance-gpu-name", "In", "h100")])) == ""


def test_relaxation_drops_required_terms_in_order_but_never_the_last():
    """suite_test.go "Preferential Fallback": "should relax multiple terms" (invalid, invalid, a zone, a
    zone) and "should not relax the final term"."""
    relaxed = launchable(with_terms(
        [expr("invalid", "In", "x")], [expr("invalid", "In", "y")],
        [expr("topology.kubernetes.io/zone", "In", "us-east-1a")],
        [expr("topology.kubernetes.io/zone", "In", "nowhere")],
    ), [POOL])  # fmt: skip
    assert relaxed
    assert launchable(with_terms([expr("invalid", "In", "x")]), [POOL]) == []
    # and the term that fits is the first one left: the fourth (no such zone) is never reached
    assert launchable(with_terms([expr("topology.kubernetes.io/zone", "In", "nowhere")]), [POOL]) == []


def test_is_provisionable_needs_kube_schedulers_unschedulable_and_nothing_else_holding_the_pod():
    pod = cpu_pod()
    assert is_provisionable(pod)
    assert not is_provisionable(make_pod("fresh", 0))  # not yet marked Unschedulable
    for change in (
        lambda p: p["spec"].update(nodeName="n"),
        lambda p: p["status"].update(nominatedNodeName="n"),
        lambda p: p["metadata"].update(ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d"}]),
        lambda p: p["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "Node", "name": "n"}]),
    ):
        changed = copy.deepcopy(pod)
        change(changed)
        assert not is_provisionable(changed)


def test_gpu_requests_fit_by_count_and_an_unknown_resource_fits_nothing():
    gpus = pending(make_pod("eight", 8))
    picked = {name for _, name in launchable(gpus, [POOL])}
    assert picked and all(next(it for it in CATALOGUE if it.name == n).allocatable["nvidia.com/gpu"] >= 8
                          for n in picked)  # fmt: skip
    assert launchable(pending(make_pod("share", 0, milli=500)), [POOL]) == []


def test_gpu_labels_and_numeric_bounds_narrow_the_instance_types():
    pod = with_terms([expr("karpenter.k8s.aws/instance-gpu-name", "In", "l40s"),
                      expr("karpenter.k8s.aws/instance-gpu-memory", "Gt", "40000")])  # fmt: skip
    assert sorted(n for _, n in launchable(pod, [POOL])) == ["g6e.12xlarge", "g6e.48xlarge", "g6e.xlarge"]
    no_gpu = with_terms([expr("karpenter.k8s.aws/instance-gpu-count", "DoesNotExist")])
    assert {n for _, n in launchable(no_gpu, [POOL])} == {"m5.large", "m5.4xlarge"}


def test_a_pool_taint_needs_a_toleration():
    tainted = NodePool("gpu", taints=({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},))
    assert launchable(cpu_pod(), [tainted]) == []
    assert launchable(cpu_pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), [tainted])


def test_requirement_algebra_matches_karpenters_operators():
    assert Requirement.of("Gt", ["5"]).intersection(Requirement.of("In", ["4", "6"])).values == frozenset({"6"})
    assert len(Requirement.of("DoesNotExist").intersection(Requirement.of("In", ["a"]))) == 0
    assert intersects({"k": Requirement.of("NotIn", ["a"])}, {"k": Requirement.of("DoesNotExist")}) == ""
    assert intersects({"k": Requirement.of("In", ["a"])}, {"k": Requirement.of("In", ["b"])}).startswith("key k")
