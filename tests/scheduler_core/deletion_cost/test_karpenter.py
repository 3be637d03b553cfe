"""Which annotation Karpenter reads a pod's cost from, by its Deployment's feature gates."""

from __future__ import annotations

import pytest

from scheduler_core.deletion_cost.karpenter import cost_annotation, feature_gates


def karpenter(*, args=(), env=None, name="controller", others=()):
    container = {"name": name, "image": "public.ecr.aws/karpenter/controller:1.14.1", "args": list(args)}
    if env is not None:
        container["env"] = [{"name": "FEATURE_GATES", "value": env}, {"name": "LOG_LEVEL", "value": "info"}]
    return {"spec": {"template": {"spec": {"containers": [*others, container]}}}}


@pytest.mark.parametrize(
    ("deployment", "annotation"),
    [
        (None, "controller.kubernetes.io/pod-deletion-cost"),
        (karpenter(), "controller.kubernetes.io/pod-deletion-cost"),  # the gate's default: off
        (karpenter(env="NodeRepair=false,PodDeletionCostManagement=true"), "karpenter.sh/disruption-cost"),
        (karpenter(env="PodDeletionCostManagement=false"), "controller.kubernetes.io/pod-deletion-cost"),
        (karpenter(env=" PodDeletionCostManagement = True "), "karpenter.sh/disruption-cost"),
        (karpenter(env="PodDeletionCostManagement=yes"), "controller.kubernetes.io/pod-deletion-cost"),  # not a Go bool
        # The flag wins over the variable (the variable is only the flag's default), in either spelling.
        (karpenter(args=["--feature-gates=PodDeletionCostManagement=true"], env="PodDeletionCostManagement=false"),
         "karpenter.sh/disruption-cost"),
        (karpenter(args=["-feature-gates", "PodDeletionCostManagement=false"], env="PodDeletionCostManagement=true"),
         "controller.kubernetes.io/pod-deletion-cost"),
        # The controller container, not a sidecar beside it.
        (karpenter(env="PodDeletionCostManagement=true",
                   others=[{"name": "proxy", "env": [{"name": "FEATURE_GATES", "value": "X=true"}]}]),
         "karpenter.sh/disruption-cost"),
    ],
)  # fmt: skip
def test_the_gate_picks_the_annotation(deployment, annotation):
    assert cost_annotation(deployment) == annotation


def test_garbled_pairs_are_no_gate_and_the_rest_still_count():
    gates = feature_gates(karpenter(env="=true,Broken,SpotToSpotConsolidation=1,,PodDeletionCostManagement=T"))
    assert gates == {"SpotToSpotConsolidation": True, "PodDeletionCostManagement": True}
    assert feature_gates({"spec": None}) == {} and feature_gates({}) == {}
