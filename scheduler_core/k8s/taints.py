"""Taints and tolerations, as kube-scheduler's TaintToleration filter reads them.

A taint with effect ``NoSchedule`` or ``NoExecute`` keeps a pod off the node unless one of the pod's
tolerations matches it; ``PreferNoSchedule`` only scores. A toleration matches a taint when:

- its key equals the taint's, or it has no key and operator ``Exists`` (it then matches every taint);
- its operator is ``Exists``, or ``Equal`` (the default) with the taint's value;
- its effect is empty (every effect) or the taint's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether ``toleration`` matches ``taint``.

    >>> taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    >>> tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, taint)
    True
    >>> tolerates({"key": "nvidia.com/gpu", "value": "absent"}, taint), tolerates({"operator": "Exists"}, taint)
    (False, True)
    >>> tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, taint)
    False
    """
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(node: Mapping[str, Any], pod: Mapping[str, Any]) -> list[str]:
    """The node's ``NoSchedule``/``NoExecute`` taints that none of the pod's tolerations match, as
    ``key=value:effect`` (empty when the pod may run there).

    >>> node = {"spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}}
    >>> untolerated(node, {"spec": {}})
    ['dedicated=ml:NoSchedule']
    >>> untolerated(node, {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}})
    []
    """
    taints = _items((node.get("spec") or {}).get("taints"))
    tolerations = _items((pod.get("spec") or {}).get("tolerations"))
    return [
        f"{taint.get('key', '')}={taint.get('value', '')}:{taint.get('effect')}"
        for taint in taints
        if taint.get("effect") in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations)
    ]


def _items(value: Any) -> Sequence[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []
