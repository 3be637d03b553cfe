"""The generated admission policies, evaluated by a real CEL evaluator (cel-python) as the API server
evaluates a ValidatingAdmissionPolicy: the match constraints and conditions, then the variables in
order, then every validation. Each identity's own write passes; every other change to the object it
writes is refused. ``tests/e2e/test_identities.py`` sends the same writes through a real 1.33 API
server."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import celpy
import pytest

from manifests.access import DEFAULT_SCHEDULER_ACCOUNT, DELETION_COST, EXTENDER, NODE_STATE, admission_policies
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    BIND_ANNOTATIONS,
    CDI_DEVICE_ANNOTATION,
    CDI_DEVICE_KIND,
    DELETION_COST_ANNOTATION,
    GPU_PORTION_ANNOTATION,
    LABEL_MODEL,
    MPS_MEMORY_ANNOTATION,
    MPS_THREADS_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)

ENV = celpy.Environment()


def policies() -> dict[str, dict[str, Any]]:
    docs = admission_policies(sharing=True)
    return {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    program = ENV.program(ENV.compile(expression))
    return program.evaluate({key: celpy.json_to_cel(value) for key, value in activation.items()})


def denials(
    *,
    resource: str,
    operation: str,
    user: str,
    groups: list[str],
    obj: Any,
    old: Any = None,
    namespace: str = "ns",
    namespace_labels: dict[str, str] | None = None,
) -> list[str]:
    """The messages of every policy that refuses this request (empty: admitted), in ``namespace``."""
    request = {"operation": operation, "namespace": namespace, "userInfo": {"username": user, "groups": groups}}
    namespace_object = {"metadata": {"name": namespace, "labels": namespace_labels or {}}}
    found = []
    for spec in policies().values():
        rules = spec["matchConstraints"]["resourceRules"]
        if not any(resource in rule["resources"] and operation in rule["operations"] for rule in rules):
            continue
        activation: dict[str, Any] = {
            "request": request, "object": obj, "oldObject": old, "namespaceObject": namespace_object,
        }  # fmt: skip
        if not all(evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
            continue
        variables: dict[str, Any] = {}
        for variable in spec.get("variables", []):
            value = evaluate(variable["expression"], {**activation, "variables": variables})
            variables[variable["name"]] = bool(value) if isinstance(value, celpy.celtypes.BoolType) else _plain(value)
        activation["variables"] = variables
        found += [v["message"] for v in spec["validations"] if not bool(evaluate(v["expression"], activation))]
    return found


def _plain(value: Any) -> Any:
    """A CEL value back as JSON-like Python, to be passed in again as a variable."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


NODE = {
    "metadata": {"name": "n", "labels": {LABEL_MODEL: "A100", "team": "ml"}, "annotations": {"a": "1"}},
    "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
}
POD = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}, "annotations": {"a": "1"}},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}
OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}


def changed(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    where = new
    for key in path[:-1]:
        where = where.setdefault(key, {})
    where[path[-1]] = value
    return new


FOREIGN_CHANGES = {
    "another label": (("metadata", "labels"), {"team": "ml", LABEL_MODEL: "A100", "extra": "x"}),
    "an annotation": (("metadata", "annotations"), {"a": "2"}),
    "a finalizer": (("metadata", "finalizers"), ["example.com/hold"]),
    "an ownerReference": (("metadata", "ownerReferences"), [OWNER]),
    "the spec": (("spec",), {"unschedulable": True}),
}


class Writer(NamedTuple):
    """A Lambda identity that updates objects: the resource, its user and group, the object as it was, and
    the write that is its own (the path changed, the value written)."""

    resource: str
    user: str
    group: str
    before: dict[str, Any]
    own_path: tuple[str, ...]
    own_value: str


WRITERS = {
    "node-state": Writer("nodes", "ns", NODE_STATE.group, NODE, ("metadata", "labels", LABEL_MODEL), "H100"),
    "deletion-cost": Writer(
        "pods", "dc", DELETION_COST.group, POD, ("metadata", "annotations", DELETION_COST_ANNOTATION), "100"
    ),
}


def as_writer(name: str, new: dict[str, Any]) -> list[str]:
    """The denials of the identity ``name``'s update of its object to ``new``."""
    writer = WRITERS[name]
    return denials(
        resource=writer.resource,
        operation="UPDATE",
        user=writer.user,
        groups=[writer.group],
        obj=new,
        old=writer.before,
    )


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_lambda_identity_may_make_its_own_write(name: str) -> None:
    """The node-state identity its GPU labels, the deletion-cost identity the cost."""
    writer = WRITERS[name]
    assert as_writer(name, changed(writer.before, writer.own_path, writer.own_value)) == []


@pytest.mark.parametrize("change", sorted(FOREIGN_CHANGES))
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_lambda_identity_may_change_nothing_else_of_the_object_it_writes(name: str, change: str) -> None:
    path, value = FOREIGN_CHANGES[change]
    assert as_writer(name, changed(WRITERS[name].before, path, value)) != []


ASSIGNED = changed(POD, ("metadata", "annotations", ASSIGNED_GPUS_ANNOTATION), "0:250")
UUID = "GPU-8a1b2c3d-0000-1111-2222-333344445555"
WRITTEN = {
    ASSIGNED_GPUS_ANNOTATION: "0:250",
    VISIBLE_DEVICES_ANNOTATION: UUID,
    GPU_PORTION_ANNOTATION: "0.25",
    MPS_THREADS_ANNOTATION: "25",
    MPS_MEMORY_ANNOTATION: "0=35942MB",
    CDI_DEVICE_ANNOTATION: f"{CDI_DEVICE_KIND}={UUID}",
}
"""A value of the bind's shape for each annotation it writes (``manifests.share_env.share_annotations``)."""


def annotated_pod(key: str, state: bool | str | None, value: str) -> dict[str, Any] | None:
    """:data:`POD` as a request carries it: ``None``, no object (the old one of a CREATE); ``False``, without
    ``key``; ``True``, with ``key`` set to ``value``; a string, with ``key`` set to that string."""
    if state is None:
        return None
    if state is False:
        return POD
    return changed(POD, ("metadata", "annotations", key), state if isinstance(state, str) else value)


ANNOTATION_WRITES = {
    "created with it": ("pods", "CREATE", True, None),
    "set on the pod": ("pods", "UPDATE", True, False),
    "set through pods/status": ("pods/status", "UPDATE", True, False),
    "removed": ("pods", "UPDATE", False, True),
    "changed": ("pods", "UPDATE", "other", True),
    "in a Binding": ("pods/binding", "CREATE", True, None),
}
"""Each way a request writes an annotation, by name: (resource, operation, the new object, the old one), the
objects as :func:`annotated_pod`'s ``state`` (a Binding carries the annotation)."""


def annotation_writes(*, but: tuple[str, ...] = ()) -> list[Any]:
    """:data:`ANNOTATION_WRITES` but the names ``but``, as ``pytest.param`` with their names as ids, for a
    ``("resource", "operation", "new", "was")`` parametrisation."""
    return [pytest.param(*write, id=name) for name, write in ANNOTATION_WRITES.items() if name not in but]


@pytest.mark.parametrize("key", BIND_ANNOTATIONS)
@pytest.mark.parametrize(("resource", "operation", "new", "was"), annotation_writes())
def test_nobody_else_may_write_the_binds_annotations(
    key: str, resource: str, operation: str, new: bool | str, was: bool | None
) -> None:
    """assigned-gpus, and what a share's containers read (visible-devices: which GPU they get)."""
    binding = {"metadata": {"annotations": {key: WRITTEN[key]}}}
    obj = binding if resource == "pods/binding" else annotated_pod(key, new, WRITTEN[key])
    kwargs = {"resource": resource, "operation": operation, "obj": obj, "old": annotated_pod(key, was, WRITTEN[key])}
    assert denials(user="tenant", groups=["system:authenticated"], **kwargs) != []
    assert denials(user="x", groups=[DELETION_COST.group], **kwargs) != []
    # The extender's group and the second scheduler's ServiceAccount (serve as its sidecar) may.
    assert denials(user="ext", groups=[EXTENDER.group], **kwargs) == []
    assert denials(user=DEFAULT_SCHEDULER_ACCOUNT, groups=["system:serviceaccounts"], **kwargs) == []


def test_a_tenant_keeps_every_other_write_to_its_pod() -> None:
    kept = changed(ASSIGNED, ("metadata", "annotations", "note"), "mine")
    assert denials(resource="pods", operation="UPDATE", user="t", groups=[], obj=kept, old=ASSIGNED) == []


@pytest.mark.parametrize("binder", ["extender", "scheduler"])
def test_the_binders_bindings_carry_only_the_binds_annotations(binder: str) -> None:
    user, groups = ("e", [EXTENDER.group]) if binder == "extender" else (DEFAULT_SCHEDULER_ACCOUNT, [])
    binding = {"metadata": {"annotations": {**WRITTEN, "other": "x"}}}
    found = denials(resource="pods/binding", operation="CREATE", user=user, groups=groups, obj=binding)
    assert found == [f"Bindings may carry no annotation but {', '.join(BIND_ANNOTATIONS)}"]
    binding = {"metadata": {"annotations": WRITTEN}}
    assert denials(resource="pods/binding", operation="CREATE", user=user, groups=groups, obj=binding) == []
