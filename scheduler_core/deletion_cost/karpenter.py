"""Which annotation carries a pod's cost to Karpenter's consolidation, read from Karpenter's Deployment.

Released Karpenter ranks consolidation candidates by ``controller.kubernetes.io/pod-deletion-cost``
(``EvictionCost``), the annotation the deletion-cost refresher writes. Its ``PodDeletionCostManagement``
feature gate (``kubernetes-sigs/karpenter`` PR #2894, off by default) makes Karpenter write that
annotation itself, every 60 s, for the ReplicaSet controller's scale-down order, and read the cost of
evicting a pod from ``karpenter.sh/disruption-cost`` instead (same scale: a number, divided by 2^27). With
the gate on, the refresher writes ``karpenter.sh/disruption-cost`` and leaves ``pod-deletion-cost`` to
Karpenter, rather than overwrite each other every minute.

Karpenter reads its gates from the ``--feature-gates`` flag, whose default is the ``FEATURE_GATES``
environment variable: ``Name=bool`` pairs, comma separated (``cliflag.NewMapStringBool``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_core.k8s.names import DELETION_COST_ANNOTATION, DISRUPTION_COST_ANNOTATION

GATE = "PodDeletionCostManagement"
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
"""Go's ``strconv.ParseBool``."""


def feature_gates(deployment: Mapping[str, Any], container: str = "controller") -> dict[str, bool]:
    """The feature gates Karpenter's ``container`` (the Helm chart's ``controller``; the first container
    where none has that name) runs with: its ``--feature-gates`` argument where given, else its
    ``FEATURE_GATES`` environment variable. A pair that does not parse is left out, as no gate.

    >>> gates = [{"name": "FEATURE_GATES", "value": "SpotToSpotConsolidation=false,PodDeletionCostManagement=true"}]
    >>> feature_gates({"spec": {"template": {"spec": {"containers": [{"name": "controller", "env": gates}]}}}})
    {'SpotToSpotConsolidation': False, 'PodDeletionCostManagement': True}
    """
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    chosen = next((c for c in containers if c.get("name") == container), containers[0] if containers else {})
    text = _flag(chosen.get("args") or [], "--feature-gates")
    if text is None:
        text = _flag(chosen.get("command") or [], "--feature-gates")
    if text is None:
        env = {e.get("name"): e.get("value") for e in chosen.get("env") or [] if isinstance(e, Mapping)}
        found = env.get("FEATURE_GATES")
        text = found if isinstance(found, str) else ""
    gates: dict[str, bool] = {}
    for pair in text.split(","):
        name, sep, value = pair.strip().partition("=")
        if sep and name and value.strip() in _TRUE | _FALSE:
            gates[name.strip()] = value.strip() in _TRUE
    return gates


def _flag(args: Sequence[Any], name: str) -> str | None:
    """The value of ``name=value`` or ``name value`` in a container's arguments (the last one wins, as
    Go's flag package takes it); None when absent."""
    found = None
    items = [a for a in args if isinstance(a, str)]
    for i, arg in enumerate(items):
        for prefix in (name, "-" + name.lstrip("-")):
            if arg.startswith(prefix + "="):
                found = arg[len(prefix) + 1 :]
            elif arg == prefix and i + 1 < len(items):
                found = items[i + 1]
    return found


def cost_annotation(deployment: Mapping[str, Any] | None) -> str:
    """The annotation the refresher writes: ``karpenter.sh/disruption-cost`` where Karpenter's
    ``PodDeletionCostManagement`` gate is on, ``controller.kubernetes.io/pod-deletion-cost`` otherwise
    (no Karpenter Deployment found, or the gate off, its default).

    >>> cost_annotation(None)
    'controller.kubernetes.io/pod-deletion-cost'
    """
    if deployment is not None and feature_gates(deployment).get(GATE, False):
        return DISRUPTION_COST_ANNOTATION
    return DELETION_COST_ANNOTATION
