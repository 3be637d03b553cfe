"""Admission policies that keep what the product owns cluster-wide to the product: its PriorityClasses, usable
only in the namespaces whose pods they are for, and the security group the extender API's endpoint admits,
which only the scheduler pods' own ``SecurityGroupPolicy`` may name (``manifests.scheduler.all_manifests``
adds them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from manifests.admission import cel_list, core_rule, denying_policy
from scheduler_core.k8s.names import SCHEDULER_NAME


def priority_class_policy(owners: Mapping[str, str]) -> list[dict[str, Any]]:
    """A policy and its binding that admit a pod naming one of the product's PriorityClasses (``owners``:
    class -> the namespace whose pods it is for) only in that namespace: the reservation pods' class is the
    highest a user's class may have, and a tenant's pod of it could be preempted by nothing."""
    classes = cel_list(sorted(owners))
    owner = "{" + ", ".join(f"'{name}': '{namespace}'" for name, namespace in sorted(owners.items())) + "}"
    spec = {
        "matchConstraints": {"resourceRules": [core_rule("pods", "CREATE")]},
        "matchConditions": [
            {
                "name": "names-a-product-class",
                "expression": f"has(object.spec.priorityClassName) && object.spec.priorityClassName in {classes}",
            }
        ],
        "validations": [
            {
                "expression": f"request.namespace == {owner}[object.spec.priorityClassName]",
                "messageExpression": (
                    f"'PriorityClass ' + object.spec.priorityClassName + ' belongs to eks-gpu-scheduler: only pods "
                    f"in ' + {owner}[object.spec.priorityClassName] + ' may use it'"
                ),
                "message": f"the PriorityClasses {', '.join(sorted(owners))} are eks-gpu-scheduler's own",
                "reason": "Forbidden",
            }
        ],
    }
    return denying_policy(f"{SCHEDULER_NAME}-priority-classes", spec)


def security_group_policy_guard(
    group: str, namespace: str, name: str, pod_labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """A policy and its binding that admit a ``SecurityGroupPolicy`` naming ``group`` (the one the extender
    API's endpoint admits) only as the product writes it: ``name`` in ``namespace``, selecting the pods with
    ``pod_labels`` and nothing else; with no ``name`` (the scheduler pods' nodes carry the group), none at
    all. Whoever may create SecurityGroupPolicies could otherwise put any pod of theirs in that group, and
    so in reach of the API."""
    owner = f"only the SecurityGroupPolicy {namespace}/{name} may name it" if name else "no SecurityGroupPolicy may "
    owner += "" if name else "name it (the scheduler's nodes carry it)"
    selector = "{'matchLabels': {" + ", ".join(f"'{k}': '{v}'" for k, v in sorted(pod_labels.items())) + "}}"
    spec = {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["vpcresources.k8s.aws"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["securitygrouppolicies"],
                }
            ]
        },
        "matchConditions": [
            {
                "name": "names-the-schedulers-group",
                "expression": (
                    "has(object.spec) && has(object.spec.securityGroups) && has(object.spec.securityGroups.groupIds) "
                    f"&& '{group}' in object.spec.securityGroups.groupIds"
                ),
            }
        ],
        "validations": [
            {
                "expression": f"request.namespace == '{namespace}' && object.metadata.name == '{name}'"
                if name
                else "false",
                "message": f"security group {group} is the one the gpu-scheduler extender API admits: {owner}",
                "reason": "Forbidden",
            },
            {
                "expression": f"!has(object.spec.serviceAccountSelector) && has(object.spec.podSelector) && "
                f"object.spec.podSelector == {selector}",
                "message": f"the SecurityGroupPolicy naming {group} selects the gpu-scheduler pods only "
                f"(podSelector {selector}, no serviceAccountSelector)",
                "reason": "Forbidden",
            },
        ],
    }
    return denying_policy(f"{SCHEDULER_NAME}-security-group", spec)
