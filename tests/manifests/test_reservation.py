"""The reservation pod and its program's ConfigMap, as ``manifests/reservation.py`` writes them."""

from __future__ import annotations

from manifests.reservation import (
    ACCOUNT,
    MOUNT,
    NAMESPACE,
    PROGRAM,
    priority_class,
    program_config_map,
    reservation_access,
    reservation_pod,
)


def test_a_reservation_pod_takes_one_gpu_on_its_node_and_runs_the_shipped_program() -> None:
    pod = reservation_pod("gpu-node-7", 2)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert (spec["nodeName"], spec["serviceAccountName"], pod["metadata"]["namespace"]) == (
        "gpu-node-7",
        ACCOUNT,
        NAMESPACE,
    )
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert resources["requests"] == resources["limits"]  # Guaranteed: the last evicted under node pressure
    assert spec["priorityClassName"] == priority_class()["metadata"]["name"]
    assert priority_class()["preemptionPolicy"] == "Never" and priority_class()["value"] == 1_000_000_000
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    # The command runs the file the ConfigMap holds, where the volume mounts it.
    (volume,) = spec["volumes"]
    (mount,) = container["volumeMounts"]
    config_map = program_config_map()
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] and mount["mountPath"] == MOUNT
    assert container["command"][-1] == f"{MOUNT}/{PROGRAM.name}"
    assert config_map["data"] == {PROGRAM.name: PROGRAM.read_text()}
    # Downward API: the program names its own pod.
    env = {item["name"]: item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for item in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"


def test_the_reservation_identity_may_patch_pods_in_its_namespace_only() -> None:
    kinds = {doc["kind"]: doc for doc in reservation_access()}
    role = kinds["Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    assert kinds["ValidatingAdmissionPolicy"]["spec"]["failurePolicy"] == "Fail"
    assert kinds["ValidatingAdmissionPolicyBinding"]["spec"]["validationActions"] == ["Deny"]
