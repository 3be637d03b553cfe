"""The building blocks of the product's ValidatingAdmissionPolicies: CEL snippets over an object's metadata,
the ``resourceRules`` entry of a core resource, and a policy with the binding that denies what it refuses.

The policies themselves are where their subject is: the Lambdas' identities in ``manifests/access.py``,
the product's own names in ``manifests/guards.py``, the reservation pods in ``manifests/reservation.py``,
the placeholders in ``manifests/placeholder.py`` and a share's environment in ``manifests/share_env.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_core.k8s.names import SCHEDULER_NAME

ADMISSION = "admissionregistration.k8s.io/v1"
LABELS = {"app.kubernetes.io/name": SCHEDULER_NAME, "app.kubernetes.io/part-of": "eks-gpu-scheduler"}
FROZEN_LISTS = ("ownerReferences", "finalizers")
"""Metadata lists no identity may change: the garbage collector deletes an object whose owner does not
exist, and a finalizer nobody removes keeps one from ever going."""


def cel_list(values: Sequence[str]) -> str:
    """``values`` as a CEL list of strings.

    >>> cel_list(["a", "b"])
    "['a', 'b']"
    """
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def metadata_list(obj: str, field: str) -> str:
    """``obj.metadata.field``, or an empty list where the object has none."""
    return f"has({obj}.metadata.{field}) ? {obj}.metadata.{field} : []"


def metadata_map(obj: str, field: str) -> str:
    """``obj.metadata.field``, or an empty map where the object has none."""
    return f"has({obj}.metadata.{field}) ? {obj}.metadata.{field} : {{}}"


def only_these_change(new: str, old: str, keys: Sequence[str]) -> str:
    """Every key outside ``keys`` keeps its value, and none is added or removed."""
    allowed = cel_list(keys)
    return (
        f"{new}.all(k, k in {allowed} || (k in {old} && {old}[k] == {new}[k])) && "
        f"{old}.all(k, k in {allowed} || k in {new})"
    )


def in_group(group: str) -> str:
    """CEL: the requester is in the Kubernetes group ``group``."""
    return f"'{group}' in request.userInfo.groups"


def core_rule(resource: str, *operations: str) -> dict[str, Any]:
    """A ``resourceRules`` entry: ``operations`` on the core (``v1``) ``resource``."""
    return {"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": [resource]}


def frozen_list_checks(who: str) -> list[dict[str, Any]]:
    """The validations that keep each of :data:`FROZEN_LISTS` as it was, in the words of ``who``'s refusal."""
    return [
        {
            "expression": f"({metadata_list('object', field)}) == ({metadata_list('oldObject', field)})",
            "message": f"{who} may not change metadata.{field}",
            "reason": "Forbidden",
        }
        for field in FROZEN_LISTS
    ]


def meta(name: str) -> dict[str, Any]:
    """A cluster-scoped object's metadata: its name and the scheduler's labels."""
    return {"name": name, "labels": dict(LABELS)}


def denying_policy(name: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The policy and a binding that denies what it refuses, cluster-wide."""
    return [
        {
            "apiVersion": ADMISSION,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": meta(name),
            # A request the policy cannot evaluate is refused: these are security checks.
            "spec": {"failurePolicy": "Fail", **spec},
        },
        {
            "apiVersion": ADMISSION,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta(name),
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]
