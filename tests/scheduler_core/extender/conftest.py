"""What the extender's tests share: a request body as kube-scheduler sends it, and a call to the facade."""

import json


def body(pod, nodes=None, names=None):
    """An ExtenderArgs body: ``pod`` with full Node objects (``nodes``) or with ``names`` only."""
    return json.dumps(
        {"Pod": pod, "Nodes": None if nodes is None else {"metadata": {}, "items": nodes}, "NodeNames": names}
    ).encode()


def call(extender, verb, payload):
    """The facade's status and decoded reply for ``payload`` sent to ``verb``."""
    status, raw = extender.handle(verb, payload)
    return status, json.loads(raw)
