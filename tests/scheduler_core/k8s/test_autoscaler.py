"""GPU needs in an autoscaler's terms: the label table, the instance types, and the affinity written."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.autoscaler import INSTANCE_TYPES, autoscaler_affinity, gpu_terms
from scheduler_core.k8s.node_affinity import match_nodes, required_affinity
from scheduler_core.k8s.pods import PodDemand, pod_demand
from testing.karpenter import karpenter_source
from tests.conftest import make_pod

MODELS = sorted({t.model for t in INSTANCE_TYPES})


def affinity_pod(terms: list[dict]) -> dict:
    pod = make_pod("p", 1)
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}  # fmt: skip
    return pod


def admitted(terms: list[dict], labels: list[dict]) -> list[bool]:
    """Which of the nodes (by labels) kube-scheduler's NodeAffinity admits under ``terms``."""
    affinity = required_affinity(affinity_pod(terms))
    return match_nodes(affinity, [f"n{i}" for i in range(len(labels))], labels).tolist()


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.none(), st.sets(st.sampled_from(MODELS), min_size=1, max_size=3)),
    st.sampled_from([0, 15000, 16384, 22888, 40960, 45000, 46068, 81559, 81920, 143771, 144384, 200000]),
)
def test_the_karpenter_term_admits_exactly_the_known_types_whose_gpus_pass(models, memory):
    """Over the known instance types, Karpenter's labels match the term exactly where the GPUs pass the
    extender's rule as they report themselves (the lower of EC2's figure and theirs)."""
    demand = PodDemand(gpus=1, models=None if models is None else frozenset(models), min_memory_mib=memory)
    terms = gpu_terms(demand)
    passing = [(models is None or t.model in models) and t.least_mib >= memory for t in INSTANCE_TYPES]
    if models is None and not memory:
        assert terms.karpenter == () and terms.refusal == ""
        return
    if not any(passing):
        assert terms.refusal and f"{memory} MiB" in terms.refusal
        return
    matched = admitted([{"matchExpressions": list(terms.karpenter)}], [t.karpenter_labels() for t in INSTANCE_TYPES])
    assert matched == passing
    assert [t.instance_type for t in terms.fits] == [
        t.instance_type for t, ok in zip(INSTANCE_TYPES, passing, strict=True) if ok
    ]


def test_an_h100_that_reports_less_than_ec2_says_is_refused_with_the_figures():
    terms = gpu_terms(PodDemand(gpus=1, models=frozenset({"H100"}), min_memory_mib=81920))
    assert terms.refusal.startswith("no instance type the product knows has H100 GPUs that report 81920 MiB")
    assert "p5.48xlarge: 81559" in terms.refusal


def test_the_affinity_keeps_the_pods_own_terms_in_each_and_admits_either_labelling():
    pod = affinity_pod([
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]},
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}]},
    ])  # fmt: skip
    demand = PodDemand(gpus=1, models=frozenset({"L40S"}))
    terms, why = autoscaler_affinity(pod, demand)
    assert why == "" and terms is not None and len(terms) == 4
    zone_a, zone_b = {"topology.kubernetes.io/zone": "us-east-1a"}, {"topology.kubernetes.io/zone": "us-east-1b"}
    g6e = next(t for t in INSTANCE_TYPES if t.instance_type == "g6e.12xlarge").karpenter_labels()
    g5 = next(t for t in INSTANCE_TYPES if t.instance_type == "g5.12xlarge").karpenter_labels()
    nodes = [
        {**zone_a, **g6e},  # launched by Karpenter, not yet labelled by GFD or the refresher
        {**zone_b, "gpu.nvidia.com/model": "L40S"},  # a managed node group's, labelled by the refresher
        {**zone_a, **g5},  # another GPU
        {"topology.kubernetes.io/zone": "us-east-1c", **g6e},  # a zone the pod's own terms exclude
    ]
    assert admitted(terms, nodes) == [True, True, False, False]
    # Karpenter reads the first term only, then the next when no instance type fits it: Karpenter's first.
    assert [e["key"] for e in terms[0]["matchExpressions"]][-1] == "karpenter.k8s.aws/instance-gpu-name"


def test_a_pod_that_names_no_model_or_memory_gets_nothing_and_one_written_as_the_docs_say_is_left_alone():
    assert autoscaler_affinity(make_pod("plain", 2), PodDemand(gpus=2)) == (None, "")
    demand = PodDemand(gpus=1, models=frozenset({"T4"}))
    terms, _ = autoscaler_affinity(make_pod("t4", 1), demand)
    written = affinity_pod(terms)
    assert autoscaler_affinity(written, demand) == (None, "")


def test_models_said_by_affinity_count_as_the_annotations_do_and_both_must_hold():
    terms, _ = autoscaler_affinity(make_pod("x", 1), PodDemand(gpus=1, models=frozenset({"A100", "H100"})))
    by_affinity = affinity_pod(terms)
    assert pod_demand(by_affinity).models == frozenset({"A100", "H100"})
    both = copy.deepcopy(by_affinity)
    both["metadata"]["annotations"]["gpu.nvidia.com/model"] = "H100,L4"
    assert pod_demand(both).models == frozenset({"H100"})
    both["metadata"]["annotations"]["gpu.nvidia.com/model"] = "L4"
    with pytest.raises(
        InvalidPodError, match="allows L4 and the required node affinity allows A100,H100: no GPU model is left"
    ):
        pod_demand(both)


def test_the_instance_types_are_karpenters():
    """Each known instance type's GPU labels are the ones Karpenter's AWS provider gives it (its
    generated instance-type reference, v1.14.1; p3 from the v1.12 copy)."""
    source = karpenter_source()
    if isinstance(source, str):
        pytest.skip(source)
    pages = (source / "instance-types.md").read_text() + (source / "instance-types-v1.12.md").read_text()
    for gpus in INSTANCE_TYPES:
        section = re.search(rf"### `{re.escape(gpus.instance_type)}`\n(.*?)(?=\n### |\Z)", pages, re.DOTALL)
        assert section is not None, gpus.instance_type
        labels = dict(re.findall(r"\|(karpenter\.k8s\.aws/instance-gpu-[a-z]+|node\.kubernetes\.io/instance-type)\|"
                                 r"([^|]+)\|", section.group(1)))  # fmt: skip
        assert labels == gpus.karpenter_labels(), gpus.instance_type


def test_placeholders_carry_the_shares_gpu_needs_as_autoscalers_read_them():
    from manifests.placeholder import placeholder_pod

    zone = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}
    requirements = {
        "annotations": {"gpu.nvidia.com/model": "L40S"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]}}},
    }
    pod = placeholder_pod("0a1b2c3d4e", 0, requirements, image="python:3.12-slim")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [[e["key"] for e in term["matchExpressions"]] for term in terms["nodeSelectorTerms"]]
    assert keys == [["topology.kubernetes.io/zone", "karpenter.k8s.aws/instance-gpu-name"],
                    ["topology.kubernetes.io/zone", "gpu.nvidia.com/model"]]  # fmt: skip
    assert requirements["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [zone]
    }  # the group's own requirements are not changed
    plain = placeholder_pod("0a1b2c3d4e", 0, {"annotations": {}}, image="python:3.12-slim")
    assert "affinity" not in plain["spec"]


def test_the_hint_names_only_instance_types_with_the_gpus_the_pod_asks_on_one_node() -> None:
    """An 8 x A10G pod was told g5.xlarge (one GPU) fits, in its FailedScheduling event."""
    from scheduler_core.k8s.autoscaler import autoscaler_hint
    from scheduler_core.k8s.pods import PodDemand

    eight = autoscaler_hint({"spec": {}}, PodDemand(gpus=8, models=frozenset({"A10G"})))
    assert eight.startswith("instance types that fit: g5.48xlarge;")
    assert autoscaler_hint({"spec": {}}, PodDemand(gpus=16, models=frozenset({"A10G"}))) == (
        "no instance type the product knows has 16 GPUs of that kind on one node (the most: 8, g5.48xlarge)"
    )


def test_a_memory_floor_no_gpu_reports_says_what_to_ask_for() -> None:
    from scheduler_core.k8s.autoscaler import gpu_terms
    from scheduler_core.k8s.pods import PodDemand

    refusal = gpu_terms(PodDemand(gpus=1, models=frozenset({"H100"}), min_memory_mib=81920)).refusal
    assert refusal.endswith("; ask for 79Gi (81559 MiB) or less to fit them")
