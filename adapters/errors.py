"""The one error root of the adapters: the outside world (AWS, Kubernetes, Prometheus, a file) failed or refused.

Every error an adapter raises on purpose derives from :class:`AdapterError`, with the foreign
exception chained (``raise ... from exc``), so a caller can catch the outside world's failures in one
clause and still read what went wrong underneath.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base class for errors raised by ``adapters``."""
