"""The kube-scheduler extender: wire types, the node view, verdicts and scores, preempt, explain.

:class:`Extender` is the facade every adapter shares (``handle(verb, body) -> (status, body)``).
"""

from scheduler_core.extender.facade import (
    DEFAULT_MAX_BODY_BYTES,
    SHARING_VERBS,
    VERBS,
    Accounting,
    BindOutcome,
    ClusterSource,
    Extender,
    ExtenderConfig,
    Reply,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "SHARING_VERBS",
    "VERBS",
    "Accounting",
    "BindOutcome",
    "ClusterSource",
    "Extender",
    "ExtenderConfig",
    "Reply",
]
